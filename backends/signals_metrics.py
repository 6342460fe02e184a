"""Re-exports the poller's per-tier signals in the router's own /metrics, labelled by tier.

A collector reads the poller's latest state at scrape time, so nothing is copied between polls
and a tier without /metrics shows up as `cost_router_backend_metrics_available{tier=...} 0`
instead of silently vanishing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args
from weakref import WeakKeyDictionary

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from backends.signal_poller import SignalsPoller
from backends.tier_signals import Status, TierSignals

# (metric suffix, TierSignals attribute, help)
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("requests_running", "running", "Requests running on the tier's server (vLLM)."),
    ("requests_waiting", "waiting", "Requests queued on the tier's server (vLLM)."),
    ("kv_cache_usage", "kv_cache_usage", "KV-cache usage of the tier's server, 0..1 (vLLM)."),
    (
        "spec_acceptance_rate",
        "spec_acceptance",
        "Accepted / draft speculative tokens between the last two polls.",
    ),
    ("ttft_seconds", "ttft_s", "Mean time to first token in the last poll window."),
    ("tpot_seconds", "tpot_s", "Mean time per output token in the last poll window."),
)
STATES: tuple[str, ...] = get_args(Status)
PREFIX = "cost_router_backend_"


class SignalsCollector(Collector):
    def __init__(self, poller: SignalsPoller) -> None:
        self.poller = poller

    def collect(self) -> Iterator[GaugeMetricFamily]:
        signals = self.poller.snapshot()
        yield from _status_families(signals)
        for suffix, attr, help_text in GAUGES:
            family = GaugeMetricFamily(PREFIX + suffix, help_text, labels=["tier"])
            for tier, s in signals.items():
                value = getattr(s, attr)
                if value is not None and s.status == "ok":
                    family.add_metric([tier], float(value))
            yield family


def _status_families(signals: dict[str, TierSignals]) -> Iterator[GaugeMetricFamily]:
    up = GaugeMetricFamily(PREFIX + "up", "1 when the tier's server answers.", labels=["tier"])
    available = GaugeMetricFamily(
        PREFIX + "metrics_available",
        "1 when the tier's server exposes Prometheus metrics (0: routing without its load).",
        labels=["tier"],
    )
    state = GaugeMetricFamily(
        PREFIX + "signals_state",
        "Current signals state of the tier (1 = this state).",
        labels=["tier", "state"],
    )
    for tier, s in signals.items():
        up.add_metric([tier], float(s.ready))
        available.add_metric([tier], float(s.status == "ok"))
        for name in STATES:
            state.add_metric([tier, name], float(s.status == name))
    yield from (up, available, state)


_REGISTERED: WeakKeyDictionary[CollectorRegistry, SignalsCollector] = WeakKeyDictionary()


def register_signals(poller: SignalsPoller, registry: CollectorRegistry) -> SignalsCollector:
    """Adds the per-tier gauges to `registry`; a second call for the same registry (a rebuilt
    app state sharing its metrics) points the existing collector at the new poller."""
    collector = _REGISTERED.get(registry)
    if collector is not None:
        collector.poller = poller
        return collector
    collector = SignalsCollector(poller)
    registry.register(collector)
    _REGISTERED[registry] = collector
    return collector
