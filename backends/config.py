"""Configuration of the upstream tiers: endpoints, prices, launch profiles, signal polling.

`cost_nanos` is the one cost formula (`Price.cost_nanos` / `Price.cost` wrap it); everything that
prices tokens calls it, the simulator with numpy arrays, the proxy and budgets with ints.
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from backends.launch_config import LaunchConfig


class StrictModel(BaseModel):
    # Unknown keys are almost always typos; reject them so the error names the key.
    model_config = ConfigDict(extra="forbid")


# Money is counted in integer nano-USD so that sums (ledgers, Redis counters) are exact.
NANOS_PER_USD = 1_000_000_000

Number = int | float


@overload
def cost_nanos(
    input_per_mtok: Number, output_per_mtok: Number, prompt_tokens: Number,
    completion_tokens: Number,
) -> int: ...
@overload
def cost_nanos(
    input_per_mtok: Any, output_per_mtok: Any, prompt_tokens: npt.NDArray[Any],
    completion_tokens: npt.NDArray[Any],
) -> npt.NDArray[np.int64]: ...
def cost_nanos(
    input_per_mtok: Any, output_per_mtok: Any, prompt_tokens: Any, completion_tokens: Any,
) -> int | npt.NDArray[np.int64]:
    """Cost in nano-USD, rounded half-even; scalars give an int, arrays an int64 array."""
    # USD per Mtok * 1e9 nanos / 1e6 tokens = price * 1000 nanos per token. Plain operators, so
    # the proxy's scalar case stays pure Python (the hot path) and arrays stay vectorised; both
    # do the same float64 operations in the same order, so they agree to the nano.
    nanos = prompt_tokens * input_per_mtok * 1000 + completion_tokens * output_per_mtok * 1000
    if isinstance(nanos, np.ndarray):
        return np.rint(nanos).astype(np.int64)
    return round(float(nanos))  # half-even, as np.rint


class Price(StrictModel):
    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens")
    output_per_mtok: float = Field(ge=0, description="USD per million completion tokens")

    def cost_nanos(self, prompt_tokens: int, completion_tokens: int) -> int:
        return int(cost_nanos(self.input_per_mtok, self.output_per_mtok, prompt_tokens,
                              completion_tokens))

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return self.cost_nanos(prompt_tokens, completion_tokens) / NANOS_PER_USD


class TierConfig(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    kind: str = Field(default="openai", description="a backend kind of backends/registry.py")
    base_url: str | None = None
    model: str = Field(description="model name sent upstream")
    api_key_env: str | None = Field(default=None, description="env var holding the upstream key")
    price: Price
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    connect_retries: int = Field(default=2, ge=0, le=10)
    max_inflight: int = Field(default=64, ge=1)
    queue_timeout_s: float = Field(default=0.5, ge=0)
    fallback: list[str] = Field(
        default_factory=list, description="tiers to try, in order, on failure"
    )
    metrics_url: str | None = Field(default=None, description="Prometheus /metrics of the server")
    replay_trace: str | None = Field(default=None, description="trace file for kind=replay")
    launch: LaunchConfig | None = None


class SignalsConfig(StrictModel):
    """Polling of each tier's /metrics (backends/signal_poller.py), for load-aware routing and
    traces."""

    enabled: bool = True
    interval_s: float = Field(default=2.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    stale_after_s: float = Field(
        default=10.0, gt=0, description="older readings are not given to policies"
    )
