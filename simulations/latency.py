"""Per-tier latency model, a FIFO discrete-event queue over arrival times, and the three levers.

Each tier is modelled as `concurrency` slots; a request holds one slot for its service time
(time to first token + per-token decode time x completion tokens) and waits FIFO when all slots
are busy. This ignores the throughput/latency trade-off of continuous batching inside one slot
budget; it is the standard first-order model used to size a deployment, and it is exact for it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

import numpy as np


class LatencyModelError(ValueError):
    """Bad latency-model parameters or inputs; the message names the field or record."""


@dataclass(frozen=True, slots=True)
class TierLatency:
    ttft_s: float  # time to first token at zero load (scheduling + prefill of a typical prompt)
    per_token_s: float  # decode time per output token for one request
    concurrency: int = 1  # requests a tier serves at once
    prefill_per_token_s: float = 0.0  # extra time to first token per prompt token

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.per_token_s < 0 or self.prefill_per_token_s < 0:
            raise LatencyModelError("latency times must be >= 0")
        if self.concurrency < 1:
            raise LatencyModelError("concurrency must be >= 1")

    def ttft(self, prompt_tokens: np.ndarray) -> np.ndarray:
        return self.ttft_s + self.prefill_per_token_s * np.asarray(prompt_tokens, dtype=np.float64)

    def service(self, prompt_tokens: np.ndarray, completion_tokens: np.ndarray) -> np.ndarray:
        decode = self.per_token_s * np.asarray(completion_tokens, dtype=np.float64)
        return self.ttft(prompt_tokens) + decode


def spec_tokens_per_step(acceptance: float, k: int) -> float:
    """Expected tokens produced per verification step: (1 - a^(k+1)) / (1 - a).

    With per-token acceptance rate a and k drafted tokens, the target model accepts a prefix of the
    draft and always adds one token of its own (Leviathan et al. 2023, eq. 1).
    """
    if not 0.0 <= acceptance <= 1.0:
        raise LatencyModelError(f"acceptance rate must be in [0, 1], got {acceptance}")
    if k < 0:
        raise LatencyModelError(f"draft length k must be >= 0, got {k}")
    if acceptance == 1.0:
        return float(k + 1)  # the limit of the geometric sum
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def spec_speedup(acceptance: float, k: int, draft_cost: float) -> float:
    """Decode speed-up: tokens per step over the step's cost (k draft passes + 1 target pass).

    draft_cost is one draft forward pass relative to one target pass (about 0 for n-gram /
    prompt-lookup drafting, 0.05-0.2 for a small draft model). Below 1 means it slows decoding.
    """
    if draft_cost < 0:
        raise LatencyModelError(f"draft cost must be >= 0, got {draft_cost}")
    return spec_tokens_per_step(acceptance, k) / (1.0 + k * draft_cost)


def with_speculative(
    tier: TierLatency, acceptance: float, k: int, draft_cost: float
) -> TierLatency:
    """The tier with speculative decoding on: only decode time changes (output is unchanged)."""
    return replace(tier, per_token_s=tier.per_token_s / spec_speedup(acceptance, k, draft_cost))


def with_speed_factor(tier: TierLatency, speed: float) -> TierLatency:
    """A quantized or distilled model: prefill and decode both `speed` times faster."""
    if speed <= 0:
        raise LatencyModelError(f"speed factor must be > 0, got {speed}")
    return replace(
        tier,
        ttft_s=tier.ttft_s / speed,
        per_token_s=tier.per_token_s / speed,
        prefill_per_token_s=tier.prefill_per_token_s / speed,
    )


def first_out_of_order(times: np.ndarray, previous: float = -np.inf) -> int | None:
    """Index of the first time earlier than the one before it (or than `previous`), else None."""
    if times.size == 0:
        return None
    if times[0] < previous:
        return 0
    bad = np.flatnonzero(np.diff(times) < 0)
    return int(bad[0]) + 1 if bad.size else None


def fifo_queue_start(arrivals: np.ndarray, service: np.ndarray, concurrency: int) -> np.ndarray:
    """Start-of-service times for a FIFO queue with `concurrency` servers (arrivals sorted).

    Discrete-event simulation: each arrival takes the server that frees first; events are the
    servers' free times, kept in a heap, so this is O(n log c).
    """
    n = arrivals.size
    start = np.empty(n, dtype=np.float64)
    free = [0.0] * min(concurrency, max(n, 1))
    heapq.heapify(free)
    arr = arrivals.tolist()
    svc = service.tolist()
    for i in range(n):
        t = max(arr[i], free[0])
        start[i] = t
        heapq.heapreplace(free, t + svc[i])
    return start


@dataclass(frozen=True, slots=True)
class LatencyResult:
    ttft_s: np.ndarray  # per request: queueing wait + time to first token
    e2e_s: np.ndarray  # per request: queueing wait + full service time
    wait_s: np.ndarray
    # Per model: offered work / capacity over the trace's span. Above 1 the queue grows without
    # bound, and the percentiles say more about the trace's length than about the deployment.
    utilization: tuple[float, ...] = ()

    def percentiles(self, qs: tuple[float, ...] = (50, 95)) -> dict[str, float]:
        out: dict[str, float] = {}
        for q in qs:
            out[f"p{q:g}_s"] = float(np.percentile(self.e2e_s, q)) if self.e2e_s.size else 0.0
            out[f"ttft_p{q:g}_s"] = (
                float(np.percentile(self.ttft_s, q)) if self.ttft_s.size else 0.0
            )
        return out


def simulate(
    arrivals: np.ndarray,
    tier_index: np.ndarray,
    prompt_tokens: np.ndarray,
    completion_tokens: np.ndarray,
    models: list[TierLatency],
) -> LatencyResult:
    """Per-request latency when each request is served by models[tier_index[i]]."""
    arrivals = np.asarray(arrivals, dtype=np.float64)
    i = first_out_of_order(arrivals)
    if i is not None:
        raise LatencyModelError(
            f"timestamps are not sorted: record {i} has time {arrivals[i]} < previous "
            f"{arrivals[i - 1]}"
        )
    n = arrivals.size
    ttft = np.zeros(n)
    e2e = np.zeros(n)
    wait = np.zeros(n)
    span = max(float(arrivals[-1] - arrivals[0]), 1e-9) if n else 1.0
    util = [0.0] * len(models)
    for k, model in enumerate(models):
        mask = tier_index == k
        if not mask.any():
            continue
        svc = model.service(prompt_tokens[mask], completion_tokens[mask])
        util[k] = float(svc.sum() / (model.concurrency * span))
        start = fifo_queue_start(arrivals[mask], svc, model.concurrency)
        w = start - arrivals[mask]
        wait[mask] = w
        ttft[mask] = w + model.ttft(prompt_tokens[mask])
        e2e[mask] = w + svc
    return LatencyResult(ttft_s=ttft, e2e_s=e2e, wait_s=wait, utilization=tuple(util))
