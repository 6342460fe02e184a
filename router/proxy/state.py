"""Everything a request needs, in one object on ``app.state.router``.

A request reads ``app.state.router`` once and uses that snapshot to the end, so a hot reload can
swap in a new RouterState atomically (one attribute assignment) without a request ever seeing
half of each: in-flight requests keep the policies, thresholds and classifier models they started
with.

Classifier models: the global one (`classifier.model_path`) and each policy's own
(`policies.<name>.model_path`, a canary), one scorer per distinct file, loaded once. A reload
(`build_routing`, run off the event loop) reuses a loaded scorer while its file is unchanged
(same stat of the .onnx and its .json card) and loads the ones that are new or replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from backends.base import Backend, TierLoad
from backends.config import TierConfig
from backends.deployments import DeploymentSet, balanced_sets
from backends.signal_poller import SignalsPoller
from classifiers.config import DEFAULT_MODEL
from classifiers.inference import DifficultyScorer, ModelLoadError
from policies.keys import KeyRing
from policies.registry import build_policies
from policies.selection import PolicySelector
from router.config import RouterConfig
from router.learning.feedback import FeedbackService
from router.learning.shadow import ShadowService
from router.observability.drift_monitor import DriftMonitor
from router.observability.metrics import RouterMetrics
from router.observability.telemetry_config import CallTracer
from router.observability.trace_sink import TraceSink
from router.proxy.budget_gate import BudgetGate
from trace_format.config_base import ConfigError

log = logging.getLogger(__name__)


class Scorer(Protocol):
    def score_request(self, body: Mapping[str, Any], context_turns: int | None = None) -> float: ...


class TierLimiter:
    """At most `max_inflight` upstream requests per tier; a new one waits at most
    `queue_timeout_s` for a slot, then the caller falls back (or answers 429)."""

    def __init__(
        self, tier: str, max_inflight: int, queue_timeout_s: float, metrics: RouterMetrics
    ) -> None:
        self._sem = asyncio.Semaphore(max_inflight)
        self._timeout = queue_timeout_s
        self._gauge = metrics.inflight.labels(tier)

    async def acquire(self) -> bool:
        if not self._sem.locked():
            await self._sem.acquire()  # a free slot: returns without suspending
        elif self._timeout <= 0:
            return False
        else:
            try:
                await asyncio.wait_for(self._sem.acquire(), self._timeout)
            except TimeoutError:
                return False
        self._gauge.inc()
        return True

    def release(self) -> None:
        self._gauge.dec()
        self._sem.release()


# A model file's identity: (mtime_ns, size, inode) of the .onnx and of its .json card (class values
# live there), so a file replaced in place (os.replace: new inode) is loaded again on reload.
FileStamp = tuple[tuple[int, int, int] | None, tuple[int, int, int] | None]


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def model_file(model_path: str | None) -> Path:
    """The .onnx file a `model_path` setting names (None: the shipped model), resolved."""
    return (Path(model_path) if model_path else DEFAULT_MODEL).resolve()


def file_stamp(path: Path) -> FileStamp:
    return (_stat(path), _stat(path.with_suffix(".json")))


@dataclass(frozen=True)
class LoadedModel:
    stamp: FileStamp
    scorer: Scorer


@dataclass(frozen=True)
class Scorers:
    """The classifier models requests are scored with: `default` (`classifier.model_path`) and
    the policies that name their own model (`policies.<name>.model_path`)."""

    default: Scorer
    policies: Mapping[str, Scorer] = field(default_factory=dict)
    # Every loaded file, for reuse by the next reload.
    files: Mapping[Path, LoadedModel] = field(default_factory=dict)

    def for_policy(self, name: str | None) -> Scorer:
        return self.policies.get(name, self.default) if name is not None else self.default


def load_scorers(
    config: RouterConfig, previous: Scorers | None = None, default: Scorer | None = None
) -> Scorers:
    """Load the config's classifier models (blocking: run it off the event loop). A file that
    `previous` loaded and that has not changed since is reused; `default` is a scorer already
    loaded for `classifier.model_path`. Raises ModelLoadError naming the config key."""
    known = dict(previous.files) if previous is not None else {}
    files: dict[Path, LoadedModel] = {}

    def load(setting: str | None, key: str) -> Scorer:
        path = model_file(setting)
        if path in files:
            return files[path].scorer
        stamp = file_stamp(path)
        reused = known.get(path)
        if reused is not None and reused.stamp == stamp:
            files[path] = reused
            return reused.scorer
        try:
            scorer = DifficultyScorer.load(path)
        except ModelLoadError as exc:
            raise ModelLoadError(f"{key}: {exc}") from None
        files[path] = LoadedModel(stamp, scorer)
        return scorer

    if default is not None:
        path = model_file(config.classifier.model_path)
        files[path] = LoadedModel(file_stamp(path), default)
    main = load(config.classifier.model_path, "classifier.model_path")
    own = {
        name: load(policy.model_path, f"policies.{name}.model_path")
        for name, policy in config.policies.items()
        if policy.model_path is not None
    }
    return Scorers(main, own, files)


@dataclass(frozen=True)
class Routing:
    """What a hot reload rebuilds before anything changes: the policies and the classifier
    models they score with."""

    selector: PolicySelector
    scorers: Scorers

    @property
    def policies(self) -> Mapping[str, Any]:
        return self.selector.policies


def build_routing(config: RouterConfig, previous: Scorers | None = None) -> Routing:
    """Policies and models of `config` (blocking: reference traces and model files are read).
    Raises ConfigError naming the key."""
    selector = build_selector(config)
    try:
        scorers = load_scorers(config, previous)
    except ModelLoadError as exc:
        raise ConfigError(str(exc)) from None
    return Routing(selector, scorers)


def build_selector(config: RouterConfig) -> PolicySelector:
    """The config's policies, built, with the routing sections that choose among them."""
    return PolicySelector(
        build_policies(config.policies, config.policy_env()),
        config.default_policy,
        tiers=config.tiers,
        teams=config.teams,
        keys=config.keys,
        experiments=config.experiments,
    )


@dataclass
class RouterState:
    config: RouterConfig
    selector: PolicySelector
    scorers: Scorers
    backends: dict[str, Backend]
    limiters: dict[str, TierLimiter]
    keys: KeyRing
    budgets: BudgetGate
    metrics: RouterMetrics
    traces: TraceSink | None
    signals: SignalsPoller | None = None
    feedback: FeedbackService | None = None  # /v1/feedback; None when traces are off
    shadow: ShadowService | None = None  # shadow comparisons; None when evaluation is off
    drift: DriftMonitor | None = None  # live drift gauges and the calibrators' pushes
    telemetry: CallTracer | None = None  # OpenTelemetry spans; None when telemetry is off
    tiers: dict[str, TierConfig] = field(default_factory=dict)
    # Settle-and-trace work that outlives its response; awaited on shutdown.
    pending: set[asyncio.Task[None]] = field(default_factory=set)
    # Tiers that balance several deployments: their load comes from the deployments' probes.
    balanced: dict[str, DeploymentSet] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.tiers = {t.name: t for t in self.config.tiers}
        self.balanced = balanced_sets(self.backends)

    @property
    def scorer(self) -> Scorer:
        """The global classifier (`classifier.model_path`)."""
        return self.scorers.default

    def scorer_for(self, policy: str | None) -> Scorer:
        """The classifier a policy scores with: its own `model_path`, else the global one."""
        return self.scorers.for_policy(policy)

    def load(self) -> Mapping[str, TierLoad]:
        polled = self.signals.load() if self.signals is not None else {}
        if not self.balanced:
            return polled
        own = {t: s.tier_load for t, s in self.balanced.items() if s.tier_load is not None}
        return {**polled, **own} if own else polled

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.pending.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background request work failed", exc_info=task.exception())

    async def drain(self) -> None:
        while self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=True)
