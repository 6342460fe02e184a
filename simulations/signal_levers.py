"""Measured tier behaviour -> the what-if simulator's latency levers.

Takes a signals snapshot (saved by `cost-router backends signals --save`, or polled live) and
replaces the assumed numbers of `simulations.whatif.Levers` with measured ones: time to first
token, time per output token, and the large tier's speculative acceptance rate.

One correction matters: a large tier that was measured WITH speculative decoding already decodes
faster, and what-if applies the speculative lever on top of the plain large tier. So its measured
per-token time is converted back to the plain decode time (times the speed-up the measured
acceptance implies) before it becomes the baseline; otherwise the speed-up would count twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from backends.config import SignalsConfig, TierConfig
from backends.signal_endpoints import polled_endpoints
from backends.signal_poller import measure_now
from backends.signal_snapshots import load_snapshot
from backends.tier_signals import TierSignals
from policies.registry import tiers_by_price
from simulations.latency import TierLatency, spec_speedup
from simulations.whatif import Levers


@dataclass(frozen=True, slots=True)
class MeasuredTier:
    """What the latency simulator takes from a tier's measurements (None = not measured)."""

    spec_acceptance: float | None
    ttft_s: float | None
    tpot_s: float | None


def measured_tiers(signals: Mapping[str, TierSignals]) -> dict[str, MeasuredTier]:
    """The simulator's view of a snapshot: tiers that had metrics, with what was measured."""
    return {
        name: MeasuredTier(s.spec_acceptance, s.ttft_s, s.tpot_s)
        for name, s in signals.items()
        if s.status == "ok"
    }


def _tier(base: TierLatency, m: MeasuredTier, per_token_s: float | None) -> TierLatency:
    return replace(
        base,
        ttft_s=base.ttft_s if m.ttft_s is None else m.ttft_s,
        per_token_s=base.per_token_s if per_token_s is None else per_token_s,
    )


def apply_measurements(
    levers: Levers, signals: Mapping[str, TierSignals], small: str, large: str
) -> tuple[Levers, list[str]]:
    """Levers with measured values where the snapshot has them, and one note per value used."""
    measured = measured_tiers(signals)
    notes: list[str] = []
    out = levers
    if small in measured:
        m = measured[small]
        out = replace(out, small=_tier(out.small, m, m.tpot_s))
        notes.append(_note(small, m, m.tpot_s))
    if large in measured:
        m = measured[large]
        plain_tpot = m.tpot_s
        if m.spec_acceptance is not None:
            speedup = spec_speedup(m.spec_acceptance, levers.spec_k, levers.draft_cost)
            plain_tpot = None if m.tpot_s is None else m.tpot_s * speedup
            out = replace(out, spec_acceptance=m.spec_acceptance)
        out = replace(out, large=_tier(out.large, m, plain_tpot))
        notes.append(_note(large, m, plain_tpot))
    missing = [t for t in (small, large) if t not in measured]
    if missing:
        notes.append(f"not measured (no metrics in the snapshot): {', '.join(missing)}")
    return out, notes


def _note(tier: str, m: MeasuredTier, plain_tpot: float | None) -> str:
    parts = [f"{tier}:"]
    if m.ttft_s is not None:
        parts.append(f"ttft {m.ttft_s * 1e3:.1f} ms")
    if m.tpot_s is not None:
        parts.append(f"per-token {m.tpot_s * 1e3:.2f} ms")
    if m.spec_acceptance is not None:
        parts.append(f"spec acceptance {m.spec_acceptance:.3f}")
        if plain_tpot is not None:
            parts.append(f"(per-token without speculation {plain_tpot * 1e3:.2f} ms)")
    if len(parts) == 1:
        parts.append("metrics but no finished requests in the window")
    return " ".join(parts) + " [measured]"


def read_signals(
    source: str, tiers: Sequence[TierConfig], polling: SignalsConfig
) -> dict[str, TierSignals]:
    """`source`: a snapshot JSON path, or `live` to poll `tiers` now (two polls)."""
    if source == "live":
        endpoints = polled_endpoints(tiers)
        if not endpoints:
            raise ValueError("--signals live: no tier has a metrics_url or a launch profile")
        return measure_now(endpoints, polling.interval_s, polling.timeout_s)
    return load_snapshot(source)


def measured_levers(
    levers: Levers, tiers: Sequence[TierConfig], source: str, polling: SignalsConfig
) -> tuple[Levers, list[str]]:
    """What `cost-router what-if --signals SOURCE` uses: cheapest tier = small, priciest = large.

    `polling` sets the interval and timeout of a `live` source's two polls."""
    by_name = {t.name: t for t in tiers}
    order = tiers_by_price({name: t.price for name, t in by_name.items()})
    notes: list[str] = []
    launch = by_name[order[-1]].launch
    if launch is not None and launch.speculative is not None:
        # The draft length the large server actually runs with, not the command-line default.
        levers = replace(levers, spec_k=launch.speculative.num_speculative_tokens)
        notes.append(f"{order[-1]}: draft length k={levers.spec_k} from its launch profile")
    signals = read_signals(source, tiers, polling)
    levers, measured = apply_measurements(levers, signals, order[0], order[-1])
    return levers, notes + measured
