"""Building the router state: at startup (`build_state`), and on a hot reload (`build_routing`
off the event loop, then `reload_state` on it). The one place that knows which part of a
RouterState comes from which config section, and which parts a reload rebuilds.

A reload keeps the backends, limiters, stores, metrics, trace files, signals, telemetry and the
drift monitor (their sections need a restart), and rebuilds the routing: policies, classifier
models, keys, the budget gate's limits, the request limits, and the shadow service's settings
(the running service reconfigured in place).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from backends.deployments import balanced_sets
from backends.registry import build_backends, close_backends
from backends.signal_deployments import register_deployments
from backends.signal_poller import SignalsPoller
from backends.signals_metrics import register_signals
from classifiers.inference import ModelLoadError
from policies.budgets.factory import build_stores
from policies.budgets.metrics import BudgetGauges
from policies.budgets.store import BudgetStore
from policies.calibration import calibration_store, carry_calibration
from policies.keys import KeyRing, KeyStore
from policies.registry import build_policies, session_settings, workflow_settings
from policies.selection import PolicySelector
from policies.sessions.factory import session_store
from router.config import RouterConfig
from router.learning.feedback import FeedbackService
from router.learning.shadow import ShadowDeps, build_shadow, reload_shadow
from router.observability.drift_monitor import DriftMonitor
from router.observability.metrics import RouterMetrics
from router.observability.telemetry_config import CallTracer
from router.observability.trace_sink import TraceSink
from router.proxy.budget_gate import BudgetGate
from router.proxy.limiter import TierLimiter
from router.proxy.scorers import Scorers, load_scorers
from router.proxy.state import RequestLimits, RouterState
from trace_format.config_base import ConfigError


def build_selector(config: RouterConfig) -> PolicySelector:
    """The config's policies, built, with the routing sections that choose among them."""
    built = build_policies(config.policies, config.policy_env())
    return PolicySelector(
        built,
        config.default_policy,
        tiers=config.tiers,
        teams=config.teams,
        keys=config.keys,
        experiments=config.experiments,
        sessions=session_settings(config.policies),
        workflows=workflow_settings(config.policies, built),
    )


@dataclass(frozen=True)
class Routing:
    """What a hot reload builds before anything changes: the policies and the classifier
    models they score with."""

    selector: PolicySelector
    scorers: Scorers

    @property
    def policies(self) -> Mapping[str, Any]:
        return self.selector.policies


def build_routing(config: RouterConfig, previous: Scorers | None = None) -> Routing:
    """Policies and models of `config` (blocking: reference traces and model files are read);
    a model file `previous` loaded and unchanged since is reused. Raises ConfigError naming
    the key."""
    selector = build_selector(config)
    try:
        scorers = load_scorers(config, previous)
    except ModelLoadError as exc:
        raise ConfigError(str(exc)) from None
    return Routing(selector, scorers)


def build_state(
    config: RouterConfig,
    *,
    scorers: Scorers | None = None,
    metrics: RouterMetrics | None = None,
    budget_store: BudgetStore | None = None,
    key_store: KeyStore | None = None,
) -> RouterState:
    """The state at startup. `scorers`: the config's models, already loaded (else loaded here;
    ModelLoadError names the key); the stores: shared ones (else the config's)."""
    metrics = metrics or RouterMetrics()
    if budget_store is None or key_store is None:
        built_budgets, built_keys = build_stores(config.budgets)
        budget_store, key_store = budget_store or built_budgets, key_store or built_keys
    traces = feedback = None
    if config.traces.path:
        traces = TraceSink(config.traces.path, config.traces.max_bytes, config.traces.backups)
        feedback = FeedbackService(config.traces.path, config.traces.backups)
    backends = build_backends(config.tiers)
    register_deployments(backends, metrics.registry)  # tiers' deployments in /metrics
    shadow_deps = ShadowDeps(
        config.traces.path,
        config.tiers_by_name,
        backends,
        budget_store,
        metrics.registry,
        config.budgets,
    )
    return RouterState(
        config=config,
        limits=RequestLimits.of(config),
        selector=build_selector(config),
        scorers=load_scorers(config) if scorers is None else scorers,
        tiers=config.tiers_by_name,
        backends=backends,
        limiters={
            t.name: TierLimiter(t.name, t.max_inflight, t.queue_timeout_s, metrics)
            for t in config.tiers
        },
        keys=_key_ring(config, key_store),
        budgets=_budget_gate(config, budget_store, BudgetGauges(metrics.registry)),
        metrics=metrics,
        traces=traces,
        shadow_deps=shadow_deps,
        feedback=feedback,
        signals=_signals(config, metrics),
        telemetry=_telemetry(config),
        drift=DriftMonitor(
            config.monitoring,
            metrics,
            calibration_store(budget_store, config.budgets.key_prefix),
            config.classifier.model_path,
            config.traces.path,
        ),
        shadow=build_shadow(config.evaluation, shadow_deps, config.classifier.context_turns),
        balanced=balanced_sets(backends),
        sessions=session_store(budget_store, config.budgets.key_prefix),
    )


def reload_state(old: RouterState, routing: Routing, config: RouterConfig) -> RouterState:
    """The state after a hot reload (on the event loop): `old`'s backends, limiters, stores and
    pending work, with `config`'s routing (built off the loop by build_routing). In-flight
    requests keep `old`, and so the models, they started with."""
    carry_calibration(old.selector.policies, routing.selector.policies)
    return replace(
        old,
        config=config,
        limits=RequestLimits.of(config),
        selector=routing.selector,
        scorers=routing.scorers,
        tiers=config.tiers_by_name,
        keys=_key_ring(config, old.keys.store, old.keys),
        budgets=_budget_gate(config, old.budgets.store, old.budgets.gauges),
        shadow=reload_shadow(
            old.shadow, config.evaluation, old.shadow_deps, config.classifier.context_turns
        ),
    )


def _key_ring(config: RouterConfig, store: KeyStore, previous: KeyRing | None = None) -> KeyRing:
    ring = KeyRing(
        config.keys,
        config.auth,
        store,
        config.budgets.key_cache_s,
        config.budgets.key_outage_grace_s,
        config.removed_teams,
    )
    if previous is not None:
        ring.adopt(previous)  # a reload must not forget the revocations this replica has seen
    return ring


def _budget_gate(
    config: RouterConfig, store: BudgetStore, gauges: BudgetGauges | None
) -> BudgetGate:
    return BudgetGate(
        store, config.budgets, config.teams, config.keys, config.tiers_by_name, gauges
    )


def _telemetry(config: RouterConfig) -> CallTracer | None:
    if not config.telemetry.enabled:
        return None
    # Imported only when tracing is on: OpenTelemetry is the optional `otel` extra, and a proxy
    # with tracing off must not load it.
    try:
        from router.observability.telemetry import Telemetry
    except ImportError as exc:
        raise ConfigError(
            f"telemetry.enabled needs OpenTelemetry ({exc.name} is missing): "
            "pip install 'cost-router[otel]'"
        ) from None
    return Telemetry(config.telemetry)


def _signals(config: RouterConfig, metrics: RouterMetrics) -> SignalsPoller | None:
    if not config.signals.enabled:
        return None
    # Polled: tiers with a metrics_url or a launch profile (see backends.signal_endpoints).
    poller = SignalsPoller.for_tiers(config.tiers, config.signals)
    if not poller.endpoints:
        return None
    register_signals(poller, metrics.registry)  # per-tier gauges in the router's /metrics
    return poller


async def start_state(state: RouterState) -> None:
    await state.budgets.store.start()
    if state.drift is not None:
        await state.drift.load(state.selector.policies)  # calibrated thresholds, before traffic
    if state.signals is not None:
        state.signals.start()
    if state.shadow is not None:
        state.shadow.start()
    # Everything loaded so far (libraries, classifier, config) lives for the whole process;
    # freezing it keeps the collector from rescanning it, which otherwise shows up as
    # tens-of-milliseconds pauses in the p99 latency.
    gc.collect()
    gc.freeze()


async def stop_state(state: RouterState) -> None:
    """After the server stopped taking requests: finish settles/traces, then close everything."""
    await state.drain()
    if state.shadow is not None:
        await state.shadow.stop()  # before the backends and the store it uses close
    if state.signals is not None:
        await state.signals.stop()
    await close_backends(state.backends)
    await state.budgets.store.aclose()
    if state.traces is not None:
        state.traces.close()
    if state.telemetry is not None:
        await asyncio.to_thread(state.telemetry.shutdown)  # flushes spans: network, off the loop
