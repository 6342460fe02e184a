"""`tune --sessions`: the threshold meeting a target with each session mode applied, replayed
conversation by conversation with a prompt cache per tier (simulations/sessions.py's
`replay_sessions`, the code `simulate --sessions` runs), so cost is cost with caching and a
mode that holds a tier moves the threshold the target needs.

Per mode the rule is `tune`'s: quality >= X of all-large (the highest threshold that keeps it:
the cheapest), cost <= $Y per 1,000 requests, or large share <= Z (the lowest threshold within
it: the most large requests, so the best quality). Large share, cost and quality fall as the
threshold rises in every mode, so a bisection finds the boundary (to 2^-steps); the point is
what that threshold's replay gives. There are no bootstrap intervals here: a session replay is
sequential per conversation and is not resampled (`tune` without --sessions gives them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from backends.config import NANOS_PER_USD
from policies.base import Tunable
from policies.registry import session_settings
from policies.sessions.config import DEFAULT_SESSION, MODES, Mode
from simulations.replay import ReplayError, pick_policy
from simulations.session_inputs import Graded
from simulations.sessions import CacheModel, SessionReplay, SessionTrace, replay_sessions
from simulations.sim_config import SimConfig
from simulations.sweep import SweepInputs
from simulations.trace import TraceError
from simulations.tune import Target, TuneError, indistinct_labels

STEPS = 20
# (large share, cost per 1k with caching, quality, quality ratio) of one replay.
Metrics = tuple[float, float, float | None, float | None]


@dataclass(frozen=True)
class ModeTune:
    """One mode at the threshold its target needs; `threshold` None: no threshold meets it
    (`best` says what the mode reaches)."""

    mode: str
    threshold: float | None
    large_share: float
    cost_per_1k: float  # with caching
    switches_per_session: float
    quality: float | None  # on the graded requests
    quality_ratio: float | None  # of all-large on the same requests
    configured: bool  # the policy's own `session.mode`
    best: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class SessionTune:
    target: Target
    policy: str
    requests: int
    sessions: int
    graded: int
    all_large_quality: float | None
    all_large_cost_per_1k: float
    modes: list[ModeTune]

    def configured(self) -> ModeTune:
        return next(m for m in self.modes if m.configured)


def _metrics(
    run: SessionReplay, large: str, graded: Graded, large_quality: float | None
) -> Metrics:
    n = max(1, len(run.tiers))
    share = run.tiers.count(large) / n
    cost = int(run.cost_nanos.sum()) / NANOS_PER_USD / n * 1000
    q = graded.quality(run)
    ratio = None if q is None or not large_quality else q / large_quality
    return share, cost, q, ratio


def _ok(target: Target) -> Callable[[Metrics], bool]:
    if target.kind == "quality":
        return lambda m: m[3] is not None and m[3] >= target.value - 1e-12
    if target.kind == "cost":
        return lambda m: m[1] <= target.value + 1e-12
    return lambda m: m[0] <= target.value + 1e-12


def tune_sessions(
    sim: SimConfig,
    trace: SessionTrace,
    cache: CacheModel,
    target: Target,
    outcomes: Mapping[str, Mapping[str, float]],
    policy_name: str | None = None,
    modes: Sequence[Mode] = MODES,
    steps: int = STEPS,
) -> SessionTune:
    base = pick_policy(sim, policy_name)
    if not isinstance(base, Tunable):
        raise ReplayError(f"policy {base.name!r} has no threshold to tune (use a threshold policy)")
    graded = Graded.of(trace, outcomes, (base.small, base.large))
    if target.kind == "quality":
        if not len(graded):
            raise TraceError(
                f"no request is graded on both {base.small!r} and {base.large!r}: a quality "
                "target needs outcomes per tier (labels beside the traces, e.g. "
                "`cost-router grades import`)"
            )
        same = SweepInputs(
            np.zeros(len(graded)),
            graded.on(base.small),
            graded.on(base.large),
            np.zeros(len(graded)),
            np.zeros(len(graded)),
        )
        note = indistinct_labels(same)
        if note is not None:
            raise TuneError(f"cannot tune for {target.describe()}: {note}")
    large_q = float(graded.on(base.large).mean()) if len(graded) else None
    all_large = replay_sessions(
        sim, trace, "per_request", cache, policy_name, proposals=[base.large] * len(trace)
    )
    all_large_cost = _metrics(all_large, base.large, graded, large_q)[1]
    mine = session_settings(sim.policies).get(base.name, DEFAULT_SESSION).mode
    ok = _ok(target)
    results = []
    for mode in modes:

        def at(t: float, mode: Mode = mode) -> tuple[SessionReplay, Metrics]:
            run = replay_sessions(
                sim, trace, mode, cache, policy_name, policy=base.with_threshold(t)
            )
            return run, _metrics(run, base.large, graded, large_q)

        # quality: ok at low thresholds (more large), find the highest; else ok at high ones.
        edge = 0.0 if target.kind == "quality" else 1.0
        run, m = at(edge)
        if not ok(m):
            results.append(_unmet(mode, m, mode == mine, run, target))
            continue
        good, good_run, good_m = edge, run, m
        lo, hi = 0.0, 1.0
        for _ in range(steps):
            mid = (lo + hi) / 2
            run, m = at(mid)
            if ok(m):
                good, good_run, good_m = mid, run, m
                lo, hi = (mid, hi) if target.kind == "quality" else (lo, mid)
            else:
                lo, hi = (lo, mid) if target.kind == "quality" else (mid, hi)
        results.append(_point(mode, good, good_m, good_run, mode == mine))
    return SessionTune(
        target,
        base.name,
        len(trace),
        all_large.sessions,
        len(graded),
        large_q,
        all_large_cost,
        results,
    )


def _switches(run: SessionReplay) -> float:
    return float(run.switches.mean()) if run.sessions else 0.0


def _point(mode: str, t: float, m: Metrics, run: SessionReplay, mine: bool) -> ModeTune:
    share, cost, q, ratio = m
    return ModeTune(mode, t, share, cost, _switches(run), q, ratio, mine)


def _unmet(mode: str, m: Metrics, mine: bool, run: SessionReplay, target: Target) -> ModeTune:
    share, cost, q, ratio = m
    if target.kind == "quality":
        best = f"the best is {ratio or 0.0:.1%} of all-large"
    elif target.kind == "cost":
        best = f"the cheapest is ${cost:.4g} per 1k"
    else:
        best = f"the smallest large share is {share:.1%}"
    return ModeTune(mode, None, share, cost, _switches(run), q, ratio, mine, best)
