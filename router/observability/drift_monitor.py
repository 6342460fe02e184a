"""Live drift signals: per policy, a rolling window of scored requests and the gauges over it.

The request path hands every scored decision to `DriftMonitor.observe` (a deque append, a
histogram observation and the calibrator's count: no I/O); a calibrating policy's push to the
shared state is spawned off the path when due. `refresh` (run by GET /metrics, so the gauges are
as fresh as the scrape) turns each window into:

- `cost_router_score_psi` / `cost_router_score_drift_pvalue`: PSI and the two-sample KS p-value
  of the window against the reference score distribution (classifiers/score_reference.py; the
  statistics are simulations/drift_stats.py's, the same `drift report` uses);
- `cost_router_large_share` against `cost_router_large_share_target` (policies with a target);
- `cost_router_calibrated_threshold`: the threshold in force (calibrated or configured);
- `cost_router_quality_retained` (with `_low`/`_high`, a delta-method 95% interval, and
  `cost_router_quality_labels`): the routed tier's outcome over the large tier's on the policy's
  most recent labelled requests, from the shadow file (which tier answered, which one shadowed
  it) and the label file (judged pairs; feedback labels of the same requests merge in, later
  outcomes of a tier replacing earlier ones), both beside the traces and read incrementally;
- `cost_router_tier_quality_retained{tier, teacher}` (with `_low`/`_high` and
  `cost_router_tier_quality_labels`): the same per pair of tiers, whatever the policy: a tier's
  outcome over the tier that shadowed it (a student a workflow routes to, against its teacher).

Rates (fallback, downgrade, refusal) and cost per 1k requests come from the counters by PromQL;
docs/monitoring.md has the queries.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.score_reference import (
    PSI_BINS,
    ScoreReference,
    ScoreReferenceError,
    bin_counts,
    rebin,
)
from policies.base import Policy, Tunable
from policies.calibration import CalibratingPolicy, CalibrationStore
from policies.config import PolicyConfig
from router.observability.config import MonitoringConfig
from router.observability.metrics import RouterMetrics
from simulations.drift_basis import configured_target, reference_file
from simulations.drift_stats import RetainedAccumulator, RetainedEstimate, ks_binned, psi
from trace_format.config_base import ConfigError
from trace_format.jsonl import Tail, parse_object
from trace_format.labels import LabelRecord, labels_path_for
from trace_format.shadow import shadow_path_for

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None]], None]


@dataclass
class Window:
    """One policy's recent scored requests: score, whether it was sent large, when."""

    limit: int
    seconds: float | None
    # Looked up once per policy object, not per request (a Protocol isinstance is slow).
    policy: Policy | None = None
    large_tier: str = ""
    histogram: Any = None  # the policy's cost_router_score child
    # (time, score, sent large): one append per request.
    entries: deque[tuple[float, float, bool]] = field(init=False)

    def __post_init__(self) -> None:
        self.entries = deque(maxlen=self.limit)

    def prune(self, now: float) -> None:
        if self.seconds is None:
            return
        cutoff = now - self.seconds
        while self.entries and self.entries[0][0] < cutoff:
            self.entries.popleft()

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Scores and sent-large flags of the window."""
        if not self.entries:
            return np.empty(0), np.empty(0, dtype=bool)
        _, scores, large = zip(*self.entries, strict=True)
        return np.asarray(scores, dtype=np.float64), np.asarray(large, dtype=bool)


def large_tier(policy: Policy) -> str:
    """The tier that counts as "large" for the share: a two-tier policy's large, else the
    priciest tier it can choose."""
    return policy.large if isinstance(policy, Tunable) else policy.tiers()[-1]


def target_of(policy: Policy, config: PolicyConfig | None) -> float | None:
    """The policy's target large share: the calibrator's, else the configured one."""
    if isinstance(policy, CalibratingPolicy):
        return policy.target
    return configured_target(config)


@dataclass
class Shadowed:
    """A request with a shadow comparison: its policy, the tier that answered, the one that
    shadowed it, and the outcomes labelled so far."""

    time: float
    policy: str
    primary: str
    shadow: str
    outcomes: dict[str, float] = field(default_factory=dict)


class LabelledPairs:
    """Each policy's most recent shadowed requests (bounded), with their labels' outcomes."""

    # Bytes read per file per poll: a huge backlog is caught up over several scrapes.
    MAX_READ = 16 * 1024 * 1024

    def __init__(self, trace_path: str, limit: int) -> None:
        # Both files are appended to and rewritten by pruning: a rewritten file is read again
        # from its start, and the records dedupe by request id.
        self.shadow = Tail([shadow_path_for(trace_path)], self.MAX_READ)
        self.labels = Tail([labels_path_for(trace_path)], self.MAX_READ)
        self.limit = limit
        self.by_id: OrderedDict[str, Shadowed] = OrderedDict()
        self.early: OrderedDict[str, dict[str, float]] = OrderedDict()  # labels before records

    def poll(self) -> None:
        """Read what the shadow and label files gained (blocking I/O: run off the loop)."""
        for line in self.shadow.lines():
            record = parse_object(line) or {}
            primary, shadow = record.get("primary"), record.get("shadow")
            rid, policy, t = record.get("request_id"), record.get("policy"), record.get("time")
            if not (
                isinstance(rid, str)
                and isinstance(policy, str)
                and isinstance(t, int | float)
                and isinstance(primary, dict)
                and isinstance(shadow, dict)
            ):
                continue
            if rid not in self.by_id:
                self.by_id[rid] = Shadowed(
                    float(t),
                    policy,
                    str(primary.get("tier")),
                    str(shadow.get("tier")),
                    self.early.pop(rid, {}),
                )
        for line in self.labels.lines():
            try:
                label = LabelRecord.model_validate(parse_object(line))
            except ValueError:
                continue
            known = self.by_id.get(label.request_id)
            outcomes = known.outcomes if known else self.early.setdefault(label.request_id, {})
            outcomes.update(label.outcomes)
        # Bounded: the windows read at most `limit` per policy; keep a few policies' worth.
        while len(self.by_id) > 20 * self.limit:
            self.by_id.popitem(last=False)
        while len(self.early) > self.limit:
            self.early.popitem(last=False)

    def retained(
        self, name: str, large: str | None, since: float | None
    ) -> tuple[RetainedEstimate | None, int]:
        """Quality retained on the policy's latest `limit` labelled requests (newer than
        `since`): routed outcome over the large tier's, where both are known; and how many.
        `large` None (a one-tier policy, e.g. a fixed student): over the tier that shadowed
        each request (the teacher, `evaluation.shadow_tier`), never the routed tier itself."""
        routed, best = [], []
        for item in reversed(self.by_id.values()):
            if len(routed) >= self.limit or (since is not None and item.time < since):
                break
            ref = item.shadow if large is None else large
            if item.policy != name or ref not in (item.primary, item.shadow):
                continue
            if item.primary in item.outcomes and ref in item.outcomes:
                routed.append(item.outcomes[item.primary])
                best.append(item.outcomes[ref])
        acc = RetainedAccumulator()
        acc.add(np.asarray(routed), np.asarray(best))
        return acc.estimate(), len(routed)

    def by_tier(self, since: float | None) -> dict[tuple[str, str], RetainedEstimate | None]:
        """Per (tier that answered, tier that shadowed it), whatever the policy: quality
        retained on the latest `limit` labelled pairs (newer than `since`). A student a
        workflow routes to is watched against its teacher this way, like any tier."""
        pairs: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        for item in reversed(self.by_id.values()):
            if since is not None and item.time < since:
                break
            if item.primary not in item.outcomes or item.shadow not in item.outcomes:
                continue
            routed, best = pairs.setdefault((item.primary, item.shadow), ([], []))
            if len(routed) < self.limit:
                routed.append(item.outcomes[item.primary])
                best.append(item.outcomes[item.shadow])
        out = {}
        for pair, (routed, best) in pairs.items():
            acc = RetainedAccumulator()
            acc.add(np.asarray(routed), np.asarray(best))
            out[pair] = acc.estimate()
        return out


class DriftMonitor:
    # Shadow and label files are read at most this often (a scrape every few seconds must not
    # re-read them each time).
    QUALITY_POLL_S = 10.0

    def __init__(
        self,
        settings: MonitoringConfig,
        metrics: RouterMetrics,
        store: CalibrationStore,
        model_path: str | None = None,
        trace_path: str | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = store
        self.model_path = model_path
        self.windows: dict[str, Window] = {}
        self.quality = LabelledPairs(trace_path, settings.window_requests) if trace_path else None
        self._polled = -float("inf")
        self._references: dict[Path, ScoreReference | None] = {}
        if settings.reference:
            # A reference the operator named must load: an error at startup, naming the key.
            named = reference_file(settings.reference, None, model_path)
            try:
                self._references[named.path] = named.load()
            except ScoreReferenceError as exc:
                raise ConfigError(f"monitoring.reference: {exc}") from None

    # --- request path ---------------------------------------------------------------------
    def observe(self, name: str, policy: Policy, score: float, tier: str, spawn: Spawn) -> None:
        """One scored decision of policy `name`. Cheap: no I/O, no statistics."""
        if not math.isfinite(score):
            return  # a broken score would poison the window's histogram
        if isinstance(policy, CalibratingPolicy) and policy.calibrator.observe(score):
            spawn(policy.calibrator.sync(self.store))
        if not self.settings.enabled:
            return
        window = self.windows.get(name)
        if window is None:
            window = self.windows[name] = Window(
                self.settings.window_requests, self.settings.window_s
            )
        if window.policy is not policy:  # first request, or a reload built a new policy
            window.policy, window.large_tier = policy, large_tier(policy)
            window.histogram = self.metrics.score.labels(name)
        window.histogram.observe(score)
        window.entries.append((time.time(), score, tier == window.large_tier))

    async def load(self, policies: Mapping[str, Policy]) -> None:
        """Read each calibrating policy's shared state (startup): a restarted replica routes by
        the calibrated threshold from its first request."""
        for policy in policies.values():
            if isinstance(policy, CalibratingPolicy) and not policy.calibrator.loaded:
                await policy.calibrator.sync(self.store)

    # --- scrape -----------------------------------------------------------------------------
    async def refresh(
        self, policies: Mapping[str, Policy], configs: Mapping[str, PolicyConfig]
    ) -> None:
        """Set the gauges from the windows, the labels and the policies in force."""
        m = self.metrics
        now = time.time()
        if self.quality is not None and time.monotonic() - self._polled >= self.QUALITY_POLL_S:
            self._polled = time.monotonic()
            await asyncio.to_thread(self.quality.poll)
        if self.quality is not None and self.settings.enabled:
            self._tier_quality(now)
        for name, policy in policies.items():
            if self.quality is not None and self.settings.enabled:
                self._quality(name, policy, now)
            if isinstance(policy, Tunable):
                m.calibrated_threshold.labels(name).set(policy.threshold)
            target = target_of(policy, configs.get(name))
            if target is not None:
                m.large_share_target.labels(name).set(target)
            window = self.windows.get(name)
            if window is None or not self.settings.enabled:
                continue
            window.prune(now)
            scores, large = window.arrays()
            if not len(scores):
                continue
            m.large_share.labels(name).set(float(large.mean()))
            config = configs.get(name)
            reference = self.reference(config)
            if reference is None:
                continue
            counts = bin_counts(scores, reference.bins)
            m.score_psi.labels(name).set(psi(reference.coarse(PSI_BINS), rebin(counts, PSI_BINS)))
            m.score_drift_pvalue.labels(name).set(ks_binned(reference.counts, counts).pvalue)

    def _quality(self, name: str, policy: Policy, now: float) -> None:
        assert self.quality is not None
        since = now - self.settings.window_s if self.settings.window_s else None
        large = large_tier(policy) if len(policy.tiers()) > 1 else None
        est, labels = self.quality.retained(name, large, since)
        m = self.metrics
        m.quality_labels.labels(name).set(labels)
        if est is not None:
            m.quality_retained.labels(name).set(est.value)
            m.quality_retained_low.labels(name).set(est.low)
            m.quality_retained_high.labels(name).set(est.high)

    def _tier_quality(self, now: float) -> None:
        assert self.quality is not None
        since = now - self.settings.window_s if self.settings.window_s else None
        m = self.metrics
        for (tier, teacher), est in self.quality.by_tier(since).items():
            if est is None:
                continue
            m.tier_quality_retained.labels(tier, teacher).set(est.value)
            m.tier_quality_retained_low.labels(tier, teacher).set(est.low)
            m.tier_quality_retained_high.labels(tier, teacher).set(est.high)
            m.tier_quality_labels.labels(tier, teacher).set(est.n)

    def reference(self, policy: PolicyConfig | None) -> ScoreReference | None:
        """The reference distribution a policy is measured against (simulations/drift_basis.py:
        `monitoring.reference`, else its model's `<model>.scores.json`); None when there is none.
        Read once per file."""
        source = reference_file(self.settings.reference, policy, self.model_path)
        if source.path not in self._references:
            ref: ScoreReference | None = None
            try:
                ref = source.load()
            except ScoreReferenceError as exc:
                log.warning("monitoring: no drift gauges for %s: %s", source.path, exc)
            self._references[source.path] = ref
        return self._references[source.path]
