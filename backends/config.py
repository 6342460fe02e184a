"""Configuration of the upstream tiers: endpoints, prices, launch profiles, signal polling.

`cost_nanos` is the one cost formula (`Price.cost_nanos` / `Price.cost` wrap it); everything that
prices tokens calls it, the simulator with numpy arrays, the proxy and budgets with ints.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt
from pydantic import Field, ValidationInfo, field_validator, model_validator

from backends.launch_config import LaunchConfig
from trace_format.config_base import StrictModel

# Money is counted in integer nano-USD so that sums (ledgers, Redis counters) are exact.
NANOS_PER_USD = 1_000_000_000

Number = int | float


@overload
def cost_nanos(
    input_per_mtok: Number,
    output_per_mtok: Number,
    prompt_tokens: Number,
    completion_tokens: Number,
    cached_tokens: Number = 0,
    cache_write_tokens: Number = 0,
    cached_input_per_mtok: Number | None = None,
    cache_write_per_mtok: Number | None = None,
) -> int: ...
@overload
def cost_nanos(
    input_per_mtok: Any,
    output_per_mtok: Any,
    prompt_tokens: npt.NDArray[Any],
    completion_tokens: npt.NDArray[Any],
    cached_tokens: Any = 0,
    cache_write_tokens: Any = 0,
    cached_input_per_mtok: Any = None,
    cache_write_per_mtok: Any = None,
) -> npt.NDArray[np.int64]: ...
def cost_nanos(
    input_per_mtok: Any,
    output_per_mtok: Any,
    prompt_tokens: Any,
    completion_tokens: Any,
    cached_tokens: Any = 0,
    cache_write_tokens: Any = 0,
    cached_input_per_mtok: Any = None,
    cache_write_per_mtok: Any = None,
) -> int | npt.NDArray[np.int64]:
    """Cost in nano-USD, rounded half-even; scalars give an int, arrays an int64 array.

    `prompt_tokens` are all the prompt's tokens; `cached_tokens` (read from the provider's prompt
    cache) and `cache_write_tokens` (written to it) are part of them, so fresh input is prompt -
    cached - cache_write. A cache price left unset (None) is the input price: those tokens are
    then priced as fresh input, in the one prompt term, so a tier without cache prices costs bit
    for bit what the formula without cache terms gave (no rounding of a split sum). Arrays with
    per-row prices zero the cached counts of rows whose tier sets none (simulations/replay.py)."""
    cached, cached_price = cached_tokens, cached_input_per_mtok
    if cached_price is None:
        cached, cached_price = 0, 0
    written, write_price = cache_write_tokens, cache_write_per_mtok
    if write_price is None:
        written, write_price = 0, 0
    fresh = prompt_tokens - cached - written
    # USD per Mtok * 1e9 nanos / 1e6 tokens = price * 1000 nanos per token. Plain operators, so
    # the proxy's scalar case stays pure Python (the hot path) and arrays stay vectorised; both
    # do the same float64 operations in the same order, so they agree to the nano. With nothing
    # cached the two cache terms add exactly 0.0: the cost is bit for bit the two-term formula's.
    nanos = (
        fresh * input_per_mtok * 1000
        + cached * cached_price * 1000
        + written * write_price * 1000
        + completion_tokens * output_per_mtok * 1000
    )
    if isinstance(nanos, np.ndarray):
        return np.rint(nanos).astype(np.int64)
    return round(float(nanos))  # half-even, as np.rint


class Price(StrictModel):
    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens")
    output_per_mtok: float = Field(
        ge=0, description="USD per million completion tokens (reasoning tokens included)"
    )
    cached_input_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="USD per million prompt tokens read from the provider's prompt cache "
        "(`prompt_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens`); "
        "default: input_per_mtok",
    )
    cache_write_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="USD per million prompt tokens written to the provider's prompt cache "
        "(Anthropic's `cache_creation_input_tokens`); default: input_per_mtok",
    )

    @property
    def worst_input_per_mtok(self) -> float:
        """The dearest price a prompt token can have: a reservation prices every prompt token
        at it, whatever part of the prompt the provider turns out to have cached or written."""
        return max(
            self.input_per_mtok, self.cached_input_per_mtok or 0.0, self.cache_write_per_mtok or 0.0
        )

    def cost_nanos(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> int:
        return cost_nanos(
            self.input_per_mtok,
            self.output_per_mtok,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            cache_write_tokens,
            self.cached_input_per_mtok,
            self.cache_write_per_mtok,
        )

    def worst_cost_nanos(self, prompt_tokens: int, completion_tokens: int) -> int:
        """The most a request of these counts can cost, whatever part of it is cached."""
        return cost_nanos(
            self.worst_input_per_mtok, self.output_per_mtok, prompt_tokens, completion_tokens
        )

    def cost(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> float:
        nanos = self.cost_nanos(prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens)
        return nanos / NANOS_PER_USD


class DeploymentConfig(StrictModel):
    """One server of a tier that lists several (`tiers.N.deployments`): a replica behind its own
    URL and key, balanced by backends/deployments.py."""

    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:\-]+$",
        description="named in the x-router-deployment header and the trace; default d0, d1, ...",
    )
    base_url: str = Field(description="the OpenAI-compatible root of this server (ends in /v1)")
    api_key: str | None = Field(
        default=None, description="upstream key, inline (prefer api_key_env: keeps it out of files)"
    )
    api_key_env: str | None = Field(
        default=None, description="env var holding this server's key (default: the tier's)"
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="share of traffic under `weighted`; divides the load under least_outstanding",
    )
    max_inflight: int = Field(
        default=64, ge=1, description="most requests this server runs at once"
    )
    metrics_url: str | None = Field(
        default=None,
        description="its Prometheus /metrics (vLLM): queue and KV cache steer the balancing",
    )


BalancingStrategy = Literal["least_outstanding", "weighted", "round_robin"]


class BalancingConfig(StrictModel):
    """How a tier with several deployments spreads requests and which deployments it avoids."""

    strategy: BalancingStrategy = Field(
        default="least_outstanding",
        description="least_outstanding: fewest requests in flight (plus the server's own queue, "
        "when its metrics are polled) per unit of weight; weighted: shares follow the weights; "
        "round_robin: in turn",
    )
    eject_after_failures: int = Field(
        default=3,
        ge=1,
        le=100,
        description="consecutive failures (timeouts, 5xx) that eject a deployment; one that "
        "cannot be connected to is ejected at once",
    )
    cooldown_s: float = Field(
        default=10.0, ge=0, description="an ejected deployment gets no requests for this long"
    )
    probe_interval_s: float = Field(
        default=2.0,
        ge=0,
        description="active health (and metrics) probe of each deployment; 0 = passive only",
    )
    probe_timeout_s: float = Field(default=1.0, gt=0, description="time limit of one probe")
    health_path: str | None = Field(
        default=None,
        description="probe path at the server root; default /readyz, then /health, then "
        "GET {base_url}/models, the first that the server serves",
    )


# The client APIs a tier's server may speak natively (`TierConfig.apis`): chat completions,
# Anthropic Messages, OpenAI Responses.
Api = Literal["chat", "messages", "responses"]


class TierConfig(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    kind: str = Field(default="openai", description="a backend kind of backends/registry.py")
    base_url: str | None = None
    deployments: list[DeploymentConfig] | None = Field(
        default=None,
        description="several servers of this tier, balanced (instead of one base_url)",
    )
    balancing: BalancingConfig = Field(
        default_factory=BalancingConfig, description="how `deployments` are balanced"
    )
    model: str = Field(description="model name sent upstream")
    api_key_env: str | None = Field(default=None, description="env var holding the upstream key")
    price: Price
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    connect_retries: int = Field(default=2, ge=0, le=10)
    max_inflight: int = Field(
        default=64,
        ge=1,
        description="most upstream requests in flight for the tier (with deployments, default: "
        "the sum of theirs)",
    )
    queue_timeout_s: float = Field(default=0.5, ge=0)
    fallback: list[str] = Field(
        default_factory=list, description="tiers to try, in order, on failure"
    )
    context_window: int | None = Field(
        default=None,
        ge=1,
        description="most tokens the model takes, prompt plus completion (as its server's "
        "max_model_len / n_ctx); a request that cannot fit goes to the cheapest tier of its "
        "policy that can (policies/context_window.py); unset: no limit is checked",
    )
    metrics_url: str | None = Field(default=None, description="Prometheus /metrics of the server")
    apis: list[Api] = Field(
        default_factory=lambda: ["chat"],
        description="the APIs the tier's server speaks natively (chat completions always): a "
        "request to POST /v1/messages (`messages`) or /v1/responses (`responses`) is passed "
        "through as it is to a tier that lists its API, and translated to chat completions and "
        "back for one that does not (docs/agents.md says which requests pass through); kind "
        "openai only",
    )
    replay_trace: str | None = Field(default=None, description="trace file for kind=replay")
    launch: LaunchConfig | None = None

    def speaks(self, api: str) -> bool:
        """The tier's server takes requests of `api` as they are (no translation)."""
        return api in self.apis

    @field_validator("apis")
    @classmethod
    def _apis(cls, value: list[Api]) -> list[Api]:
        if "chat" not in value:
            # Every routed request can be translated to chat completions; a tier that cannot
            # take them would be a dead end for chat traffic and for every fallback to it.
            raise ValueError("list chat too: every tier serves chat completions")
        return list(dict.fromkeys(value))

    @field_validator("deployments")
    @classmethod
    def _deployments(
        cls, value: list[DeploymentConfig] | None, info: ValidationInfo
    ) -> list[DeploymentConfig] | None:
        if value is None:
            return None
        if info.data.get("base_url"):
            raise ValueError("set either base_url (one server) or deployments, not both")
        if not value:
            raise ValueError("list at least one deployment (or use base_url for one server)")
        names = [d.name or f"d{i}" for i, d in enumerate(value)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"deployment names must be unique; repeated: {dupes}")
        return [
            d if d.name else d.model_copy(update={"name": n})
            for d, n in zip(value, names, strict=True)
        ]

    @model_validator(mode="after")
    def _tier_capacity(self) -> TierConfig:
        # Unset, a tier's limit is what its deployments can take together: the picker holds
        # each to its own max_inflight.
        if self.deployments and "max_inflight" not in self.model_fields_set:
            self.max_inflight = sum(d.max_inflight for d in self.deployments)
        return self


class SignalsConfig(StrictModel):
    """Polling of each tier's /metrics (backends/signal_poller.py), for load-aware routing and
    traces."""

    enabled: bool = True
    interval_s: float = Field(default=2.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    stale_after_s: float = Field(
        default=10.0, gt=0, description="older readings are not given to policies"
    )
