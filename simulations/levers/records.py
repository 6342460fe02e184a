"""What a trial records of a tier and of one request (no client library here: the command line
imports these without loading `openai`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

from backends.config import Price


@dataclass(frozen=True, slots=True)
class TrialTier:
    """A tier as the trial talks to it (from the router config's `tiers:`)."""

    name: str
    base_url: str
    model: str
    price: Price
    api_key: str | None = None
    timeout_s: float = 120.0
    metrics_url: str | None = None  # vLLM's /metrics: the speculative acceptance counters
    lever: str | None = None  # quantization | distillation | speculative; None for the reference


class TierDownError(RuntimeError):
    """A tier's server cannot be reached; names the tier and its address."""

    def __init__(self, tier: TrialTier, detail: str) -> None:
        super().__init__(f"tier {tier.name!r} is down ({tier.base_url}): {detail}")
        self.tier = tier.name


@dataclass(frozen=True, slots=True)
class Measurement:
    prompt_id: str
    tier: str
    text: str
    ttft_s: float | None
    itl_s: float | None  # None: fewer than two tokens
    e2e_s: float
    prompt_tokens: int
    completion_tokens: int
    tokens_reported: bool
    cost_usd: float
    error: str | None = None  # the request failed (status or timeout); a rerun retries it

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self) -> bytes:
        return orjson.dumps(asdict(self)) + b"\n"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
