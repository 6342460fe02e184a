"""Prometheus metrics of shadow comparisons and judges, on the proxy's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class EvaluationMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.sampled = Counter(
            "cost_router_shadow_sampled", "Requests chosen for a shadow comparison", registry=r
        )
        self.completed = Counter(
            "cost_router_shadow_completed",
            "Shadow answers received and stored, by shadow tier",
            ["tier"],
            registry=r,
        )
        self.dropped = Counter(
            "cost_router_shadow_dropped",
            "Sampled requests not shadowed, by reason (queue_full, rate_limited, cap_reached, "
            "budget_unavailable, upstream_error, no_counterpart, shutdown)",
            ["reason"],
            registry=r,
        )
        self.queued = Gauge(
            "cost_router_shadow_queued", "Shadow jobs waiting for a worker", registry=r
        )
        self.verdicts = Counter(
            "cost_router_judge_verdicts",
            "Judge results, by judge and outcome (label, unparseable, no_label, error)",
            ["judge", "result"],
            registry=r,
        )
        self.shadow_spend = Counter(
            "cost_router_shadow_spend_usd",
            "Shadow answers' cost, USD, by shadow tier",
            ["tier"],
            registry=r,
        )
        self.judge_spend = Counter(
            "cost_router_judge_spend_usd", "Judging cost, USD, by judge", ["judge"], registry=r
        )
