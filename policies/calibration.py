"""A target large share that calibrates on live traffic: `calibrate:` of a `threshold` policy.

"Send 30% large" is converted to a threshold once, on a reference trace (policies/target_share.py);
when production scores drift from that trace the share drifts with them. A calibrating policy
keeps the threshold at the (1 - target) quantile of RECENT scores instead, moving it at most
`max_step` per update and never outside [min_threshold, max_threshold].

The recent scores are a histogram over the reference distribution's fixed bins
(classifiers/score_reference.py: 1,000 equal bins over [0, 1]), decayed by (1 - 1/W) per new
score, so it weighs about the last W = `window_requests` requests of ALL replicas. Why a decayed
histogram and not a t-digest or P-square: replicas must share one estimate through the budget
store, and adding counts is the one merge Redis can do atomically in a script (a digest would be
read, merged and written back by each replica, racing the others); scores are bounded, so fixed
bins lose nothing a 0.001-wide threshold step can use; decay needs no ring of old samples.

Each replica counts its scores locally (`Calibrator.observe`, no I/O on the request path) and
every `every_n_requests` pushes them (`Calibrator.sync`): one atomic step of the shared state
(`advance` here; `calibrate.lua` on Redis, the same arithmetic) that decays, adds, and moves the
shared threshold, which every replica then routes by. A decayed window follows a sudden change
of traffic only slowly (after W requests a third of its weight is still the old traffic), so a
Bernoulli CUSUM on "this push's scores at or above the threshold in force" watches for a shift
of `shift_delta` from the target; when it fires the older scores are dropped and the quantile is
taken over the new traffic alone (measured: benchmark -> ShareGPT traffic, the 500 requests after
the switch go large 34-36% instead of 46-53%; docs/monitoring.md).

The state lives under the budget store's key_prefix (one hash per policy,
`<prefix>:calibration:{<policy>}`, one slot on a Redis Cluster) and so survives restarts; the
in-memory store keeps it for the life of the process. It is reset when the classifier model
changes (the `tag`): old scores say nothing about a new model's.
The simulator replays a calibrating policy request by request through the same `advance`
(`replay_decisions`), so offline and live calibration are one algorithm.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from classifiers.model_files import model_file
from classifiers.score_reference import DEFAULT_BINS, quantile_from_counts
from policies.base import (
    NO_CONTEXT,
    BatchContext,
    Decision,
    RoutingContext,
    Tunable,
    TunableWrapper,
)

log = logging.getLogger("cost_router.policies.calibration")

BINS = DEFAULT_BINS
# Decayed counts below this are dropped: they no longer move a quantile and only lengthen the
# stored state.
COUNT_FLOOR = 1e-6
# The shared state expires when no replica has pushed for this long (a removed policy).
STATE_TTL_S = 30 * 86_400


class CalibrateParams(BaseModel):
    """`calibrate:` of a threshold policy with `target_large_share`."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(default=True, description="false: the reference-trace threshold only")
    min_threshold: float = Field(
        default=0.0, ge=0, le=1, description="the threshold never goes below this"
    )
    max_threshold: float = Field(
        default=1.0, ge=0, le=1, description="the threshold never goes above this"
    )
    max_step: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="largest change of the threshold per update (one update per push of any "
        "replica)",
    )
    every_n_requests: int = Field(
        default=20,
        ge=1,
        description="each replica pushes its new scores to the shared state after this many",
    )
    warmup_requests: int = Field(
        default=200,
        ge=0,
        description="scores (all replicas) seen before the threshold moves; until then the "
        "starting threshold holds",
    )
    window_requests: int = Field(
        default=1000,
        ge=10,
        description="the recent scores the quantile is taken over: each new score decays the "
        "older ones by (1 - 1/window_requests), so about this many requests of all replicas",
    )
    shift_delta: float = Field(
        default=0.1,
        ge=0,
        lt=0.5,
        description="change detection: a CUSUM watches the share sent large at the threshold in "
        "force for a shift of this size from the target; when it fires, older scores are dropped "
        "so the quantile follows the new traffic at once instead of over a whole window (0: off)",
    )
    shift_limit: float = Field(
        default=5.0,
        gt=0,
        description="the CUSUM's decision limit (log-likelihood ratio): higher fires later and "
        "less often by chance",
    )
    start_threshold: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="threshold before calibration has data; None: the reference trace's "
        "conversion of the target, or the classifier card's threshold without a trace",
    )

    @model_validator(mode="after")
    def _bounds(self) -> CalibrateParams:
        if self.min_threshold > self.max_threshold:
            raise ValueError("min_threshold must not exceed max_threshold")
        return self


@dataclass(frozen=True)
class CalibrationSettings:
    """What one step of the shared state needs: the target and the params, the starting
    threshold, and the tag the state belongs to (bins and model)."""

    target: float
    start: float
    params: CalibrateParams
    tag: str

    @property
    def first_threshold(self) -> float:
        return clamp(self.start, self.params.min_threshold, self.params.max_threshold)


@dataclass
class SharedCalibration:
    """The state replicas share: decayed score counts, the threshold in force, scores seen."""

    counts: np.ndarray  # float64, BINS
    threshold: float
    seen: int = 0
    updates: int = 0
    tag: str = ""
    cusum_up: float = 0.0  # the change detector's two sides (share above / below the target)
    cusum_down: float = 0.0
    resets: int = 0  # times the detector dropped the older scores


@dataclass(frozen=True, slots=True)
class CalibrationReply:
    """What a push returns to the replica: the shared threshold and how far calibration is."""

    threshold: float
    seen: int
    updates: int


def clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def advance(
    state: SharedCalibration | None, pending: np.ndarray, m: int, s: CalibrationSettings
) -> SharedCalibration:
    """One atomic step of the shared state (calibrate.lua does the same on Redis): start it (or
    restart it for a new tag), decay by (1 - 1/W)^m, add the m new scores' counts, and after the
    warm-up move the threshold toward the (1 - target) quantile by at most max_step."""
    p = s.params
    if state is None or state.tag != s.tag:
        state = SharedCalibration(np.zeros(BINS), s.first_threshold, tag=s.tag)
    if m <= 0:
        return state
    up, down, resets = state.cusum_up, state.cusum_down, state.resets
    old = state.counts * (1.0 - 1.0 / p.window_requests) ** m
    if state.seen >= p.warmup_requests and p.shift_delta > 0 and 0 < s.target < 1:
        # Bernoulli CUSUM (batched) on "sent large at the threshold in force", in control at the
        # target: a sustained shift of shift_delta reaches the limit within a few dozen requests.
        k = float(pending[int(np.ceil(state.threshold * BINS - 1e-9)) :].sum())
        up = max(0.0, up + _llr(k, m, s.target, min(s.target + p.shift_delta, 1 - 1e-6)))
        down = max(0.0, down + _llr(k, m, s.target, max(s.target - p.shift_delta, 1e-6)))
        if up >= p.shift_limit or down >= p.shift_limit:
            old, up, down, resets = np.zeros(BINS), 0.0, 0.0, resets + 1
    counts = old + pending
    counts[counts < COUNT_FLOOR] = 0.0
    seen, threshold, updates = state.seen + m, state.threshold, state.updates
    if seen >= p.warmup_requests:
        # Just under 1: a share of 1 must not miss the bottom bin by a rounding error.
        q = quantile_from_counts(counts, min(s.target, 1 - 1e-12))
        threshold = clamp(
            clamp(q, threshold - p.max_step, threshold + p.max_step),
            p.min_threshold,
            p.max_threshold,
        )
        updates += 1
    return SharedCalibration(counts, threshold, seen, updates, s.tag, up, down, resets)


def _llr(k: float, m: int, p0: float, p1: float) -> float:
    """Log-likelihood ratio of k large in m requests: share p1 against p0."""
    return k * math.log(p1 / p0) + (m - k) * math.log((1 - p1) / (1 - p0))


class CalibrationStore(Protocol):
    """Where the shared state lives: `MemoryCalibrationStore` or `RedisCalibrationStore`."""

    async def push(
        self, key: str, pending: np.ndarray, m: int, s: CalibrationSettings
    ) -> CalibrationReply: ...

    async def load(self, key: str) -> SharedCalibration | None: ...


class MemoryCalibrationStore:
    """The shared state in this process (budgets.store: memory): replicas of one process only."""

    def __init__(self) -> None:
        self.states: dict[str, SharedCalibration] = {}

    async def push(
        self, key: str, pending: np.ndarray, m: int, s: CalibrationSettings
    ) -> CalibrationReply:
        state = self.states[key] = advance(self.states.get(key), pending, m, s)
        return CalibrationReply(state.threshold, state.seen, state.updates)

    async def load(self, key: str) -> SharedCalibration | None:
        return self.states.get(key)


def _lua() -> str:
    return (resources.files(__package__) / "calibrate.lua").read_text(encoding="utf-8")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisCalibrationStore:
    """The shared state in Redis or a Redis Cluster (the budget store's client): one hash per
    policy, `<prefix>:calibration:{<policy>}`, stepped by calibrate.lua in one round trip."""

    def __init__(self, client: Any, prefix: str) -> None:
        self._redis = client
        self._prefix = prefix
        self._script = client.register_script(_lua())

    def key(self, policy: str) -> str:
        return f"{self._prefix}:calibration:{{{policy}}}"

    async def push(
        self, key: str, pending: np.ndarray, m: int, s: CalibrationSettings
    ) -> CalibrationReply:
        nz = np.flatnonzero(pending)
        sparse = [int(v) for pair in zip(nz, pending[nz], strict=True) for v in pair]
        p = s.params
        reply = await self._script(
            keys=[self.key(key)],
            args=[
                ",".join(map(str, sparse)),
                m,
                repr(s.first_threshold),
                repr(s.target),
                p.window_requests,
                p.warmup_requests,
                repr(p.min_threshold),
                repr(p.max_threshold),
                repr(p.max_step),
                BINS,
                s.tag,
                STATE_TTL_S,
                repr(COUNT_FLOOR),
                repr(p.shift_delta),
                repr(p.shift_limit),
            ],
        )
        return CalibrationReply(float(_text(reply[0])), int(reply[1]), int(reply[2]))

    async def load(self, key: str) -> SharedCalibration | None:
        raw = await self._redis.hgetall(self.key(key))
        if not raw:
            return None
        packed = raw.get(b"counts", raw.get("counts"))
        data = {_text(k): _text(v) for k, v in raw.items() if _text(k) != "counts"}
        counts = np.frombuffer(packed, dtype="<f8").copy()  # calibrate.lua's layout
        return SharedCalibration(
            counts,
            float(data["threshold"]),
            int(data["seen"]),
            int(data["updates"]),
            data["tag"],
            float(data["cusum_up"]),
            float(data["cusum_down"]),
            int(data["resets"]),
        )


def calibration_store(budget_store: Any, prefix: str) -> CalibrationStore:
    """The store next to the budgets: Redis (single or cluster) when the budget store holds a
    Redis client, else in process."""
    client = getattr(budget_store, "redis", None)
    return RedisCalibrationStore(client, prefix) if client is not None else MemoryCalibrationStore()


def model_tag(model_path: str | None) -> str:
    """Identity of the classifier the scores come from: a new model restarts calibration."""
    path = model_file(model_path)
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        digest = path.name  # the scorer reports the missing file; calibration needs no bytes
    return f"bins={BINS};model={digest}"


@dataclass
class Calibrator:
    """One replica's side of a policy's calibration: counts scores, pushes them, holds the
    shared threshold. `observe` runs on the request path (no I/O); `sync` off it."""

    key: str
    settings: CalibrationSettings
    threshold: float = field(init=False)
    seen: int = 0
    updates: int = 0
    loaded: bool = False  # the shared state has been read once (startup, reload)
    failures: int = 0
    # Per bin, a Python list: one request's increment is cheaper than on a numpy array.
    _pending: list[int] = field(init=False, repr=False)
    _n: int = 0
    _syncing: bool = False

    def __post_init__(self) -> None:
        self.threshold = self.settings.first_threshold
        self._pending = [0] * BINS

    @property
    def every_n(self) -> int:
        return self.settings.params.every_n_requests

    def observe(self, score: float) -> bool:
        """Count one score; True when a push is due (the caller runs `sync` off the path)."""
        if not math.isfinite(score):
            return False  # not a score: nothing to count (and int() of it would raise)
        i = min(max(int(score * BINS), 0), BINS - 1)  # bin_counts' rule, for one score
        self._pending[i] += 1
        self._n += 1
        return self.due

    @property
    def due(self) -> bool:
        return not self._syncing and (self._n >= self.every_n or not self.loaded)

    def take(self) -> tuple[np.ndarray, int]:
        pending, n = np.asarray(self._pending, dtype=np.int64), self._n
        self._pending, self._n = [0] * BINS, 0
        return pending, n

    def adopt(self, reply: CalibrationReply) -> None:
        self.threshold, self.seen, self.updates = reply.threshold, reply.seen, reply.updates
        self.loaded = True

    async def sync(self, store: CalibrationStore) -> None:
        """Push the scores counted since the last push and adopt the shared threshold. A store
        that cannot be reached keeps the threshold in force; the scores are kept for the next
        push (up to one window's worth, so an outage costs bounded memory)."""
        if self._syncing:
            return
        self._syncing = True
        pending, n = self.take()
        try:
            self.adopt(await store.push(self.key, pending, n, self.settings))
            self.failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - calibration must never fail a request
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.warning(
                    "calibration of policy %s: shared state unreachable (%s: %s); "
                    "keeping threshold %.4f",
                    self.key,
                    type(exc).__name__,
                    exc,
                    self.threshold,
                )
            if self._n + n <= self.settings.params.window_requests:
                self._pending = (np.asarray(self._pending) + pending).tolist()
                self._n += n
        finally:
            self._syncing = False


class CalibratingPolicy(TunableWrapper):
    """A Tunable policy whose threshold is the calibrator's: the inner policy (threshold, with
    or without load shedding) at the shared threshold in force."""

    def __init__(self, inner: Tunable, calibrator: Calibrator) -> None:
        super().__init__(inner)
        self.calibrator = calibrator
        self._at = inner
        self.replay: ReplayCursor | None = None  # offline replay's state (replay_decisions)

    @property
    def threshold(self) -> float:
        return self.calibrator.threshold

    @property
    def target(self) -> float:
        return self.calibrator.settings.target

    def with_threshold(self, threshold: float) -> CalibratingPolicy:
        """The same calibrating policy starting from `threshold` (a calibrator of its own that
        has seen nothing yet: it holds `threshold` through the warm-up)."""
        settings = replace(self.calibrator.settings, start=threshold)
        return CalibratingPolicy(
            self.inner.with_threshold(threshold), Calibrator(self.calibrator.key, settings)
        )

    def current(self) -> Tunable:
        """The inner policy at the threshold in force (rebuilt only when it moved)."""
        t = self.calibrator.threshold
        if self._at.threshold != t:
            self._at = self.inner.with_threshold(t)
        return self._at

    def decide(self, ctx: RoutingContext) -> Decision:
        return self.current().decide(ctx)

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        return self.current().decide_batch(scores, ctx)


def carry_calibration(old: Mapping[str, Any], new: Mapping[str, Any]) -> int:
    """A hot reload's new calibrating policies start where this replica's old ones of the same
    name stood (same model: same tag), instead of at the starting threshold until their first
    push. Returns how many were carried."""
    carried = 0
    for name, policy in new.items():
        before = old.get(name)
        if (
            isinstance(policy, CalibratingPolicy)
            and isinstance(before, CalibratingPolicy)
            and before.calibrator.loaded
            and before.calibrator.settings.tag == policy.calibrator.settings.tag
        ):
            b = before.calibrator
            policy.calibrator.adopt(CalibrationReply(b.threshold, b.seen, b.updates))
            carried += 1
    return carried


def build_calibrating(
    inner: Tunable, target: float, start: float, params: CalibrateParams, model_path: str | None
) -> CalibratingPolicy:
    settings = CalibrationSettings(target, start, params, model_tag(model_path))
    return CalibratingPolicy(inner, Calibrator(inner.name, settings))


@dataclass(frozen=True)
class CalibratedReplay:
    """A calibrating policy replayed request by request: tier index (into tiers()) and the
    threshold each request was decided at."""

    tier_idx: np.ndarray
    thresholds: np.ndarray


@dataclass
class ReplayCursor:
    """Where an offline replay stands, so a replay in batches (simulations/stream.py) goes on
    where the last batch ended: the shared state and each replica's unpushed counts."""

    replicas: int
    threshold: float
    state: SharedCalibration | None = None
    arrived: int = 0  # requests so far (which replica the next one goes to)
    pending: list[np.ndarray] = field(default_factory=list)
    counted: list[int] = field(default_factory=list)
    local: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pending = [np.zeros(BINS) for _ in range(self.replicas)]
        self.counted = [0] * self.replicas
        self.local = [self.threshold] * self.replicas


def replay_decisions(
    policy: CalibratingPolicy,
    scores: np.ndarray,
    ctx: BatchContext = NO_CONTEXT,
    replicas: int = 1,
) -> CalibratedReplay:
    """Replay `scores` in arrival order through `replicas` calibrators sharing one state (the
    requests dealt round robin, as a load balancer would), each pushing every_n_requests of its
    own, with the same `advance` the in-memory store runs. Decisions come from the inner
    policy's decide_batch at each request's threshold (rows with equal thresholds batched).
    Successive calls on one policy continue one replay (batches of one stream)."""
    scores = np.asarray(scores, dtype=np.float64)
    s = policy.calibrator.settings
    every = s.params.every_n_requests
    if policy.replay is None or policy.replay.replicas != replicas:
        policy.replay = ReplayCursor(replicas, s.first_threshold)
    c = policy.replay
    n = len(scores)
    thresholds = np.empty(n)
    for i in range(n):
        r = (c.arrived + i) % replicas
        thresholds[i] = c.local[r]
        c.pending[r][min(max(int(scores[i] * BINS), 0), BINS - 1)] += 1
        c.counted[r] += 1
        if c.counted[r] >= every:
            c.state = advance(c.state, c.pending[r], c.counted[r], s)
            c.local[r] = c.state.threshold
            c.pending[r], c.counted[r] = np.zeros(BINS), 0
    c.arrived += n
    tier_idx = np.empty(n, dtype=np.int64)
    for t in np.unique(thresholds):
        rows = np.flatnonzero(thresholds == t)
        sub = _rows(ctx, rows)
        tier_idx[rows] = policy.inner.with_threshold(float(t)).decide_batch(scores[rows], sub)
    return CalibratedReplay(tier_idx, thresholds)


def _rows(ctx: BatchContext, rows: np.ndarray) -> BatchContext:
    units: Sequence[str] | None = None
    if ctx.units is not None:
        units = [ctx.units[i] for i in rows]
    waiting = {t: np.asarray(w)[rows] for t, w in ctx.waiting.items()}
    return BatchContext(units=units, budget=ctx.budget, waiting=waiting)


__all__ = [
    "BINS",
    "CalibrateParams",
    "CalibratedReplay",
    "CalibratingPolicy",
    "ReplayCursor",
    "CalibrationReply",
    "CalibrationSettings",
    "CalibrationStore",
    "Calibrator",
    "MemoryCalibrationStore",
    "RedisCalibrationStore",
    "SharedCalibration",
    "advance",
    "build_calibrating",
    "calibration_store",
    "carry_calibration",
    "replay_decisions",
]
