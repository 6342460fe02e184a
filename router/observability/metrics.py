"""Prometheus metrics of the proxy, on a registry per app (tests build many apps in one process)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

# Every counter and histogram would add a `<name>_created` series (its creation time): noise in
# /metrics that no dashboard uses. The switch is process-wide and read at each scrape.
disable_created_metrics()

# Classifier runs in well under a millisecond; upstream calls take from milliseconds to minutes.
CLASSIFIER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Difficulty scores are in [0, 1]: 20 equal buckets, the PSI bins of classifiers/score_reference.py.
SCORE_BUCKETS = tuple(round(i * 0.05, 2) for i in range(1, 21))


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "cost_router_requests",
            "Requests answered, by tier, policy and HTTP status",
            ["tier", "policy", "status"],
            registry=r,
        )
        self.classifier_seconds = Histogram(
            "cost_router_classifier_seconds",
            "Time to score one request (the batched scoring step: its wait for the batch included)",
            buckets=CLASSIFIER_BUCKETS,
            registry=r,
        )
        self.upstream_seconds = Histogram(
            "cost_router_upstream_seconds",
            "Upstream latency (to the full answer / first byte)",
            ["tier", "stream"],
            buckets=UPSTREAM_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "cost_router_errors",
            "Requests that ended in an error, by error code",
            ["code"],
            registry=r,
        )
        self.cost_usd = Counter(
            "cost_router_cost_usd", "Cost charged, USD", ["tier", "team"], registry=r
        )
        self.tokens = Counter(
            "cost_router_tokens", "Tokens, by tier and kind", ["tier", "kind"], registry=r
        )
        # Parts of cost_router_tokens{kind="prompt"} (so never summed with it): the cache-hit
        # ratio is read / prompt, per tier.
        self.cached_tokens = Counter(
            "cost_router_cached_tokens",
            "Prompt tokens the provider read from (read) or wrote to (write) its prompt cache, "
            "as charged, by tier",
            ["tier", "kind"],
            registry=r,
        )
        self.reasoning_tokens = Counter(
            "cost_router_reasoning_tokens",
            "Reasoning tokens, part of the completion tokens, by tier",
            ["tier"],
            registry=r,
        )
        self.fallbacks = Counter(
            "cost_router_fallbacks",
            "Requests moved to another tier",
            ["from_tier", "to_tier"],
            registry=r,
        )
        self.experiment_requests = Counter(
            "cost_router_experiment_requests",
            "Requests in an A/B experiment, by arm",
            ["experiment", "arm", "tier", "status"],
            registry=r,
        )
        self.experiment_cost_usd = Counter(
            "cost_router_experiment_cost_usd",
            "Cost charged in an A/B experiment, USD, by arm",
            ["experiment", "arm"],
            registry=r,
        )
        self.usage_faults = Counter(
            "cost_router_upstream_usage_faults",
            "Answers whose reported usage was not trusted (never charged): by tier and reason "
            "(malformed, negative, completion_over_bound, prompt_over_bound, cached_over_prompt, "
            "reasoning_over_completion)",
            ["tier", "reason"],
            registry=r,
        )
        self.team_requests = Counter(
            "cost_router_team_requests",
            "Requests answered, by team and tier",
            ["team", "tier"],
            registry=r,
        )
        self.downgrades = Counter(
            "cost_router_downgrades",
            "Requests the budget moved to a cheaper tier of the policy",
            ["from_tier", "to_tier"],
            registry=r,
        )
        self.api_requests = Counter(
            "cost_router_api_requests",
            "Requests of the client APIs served on the chat path (POST /v1/messages, "
            "/v1/responses), by API, the endpoint the answering tier was sent (chat/completions: "
            "translated; the API itself: passed through, `apis:`) and status",
            ["api", "upstream", "status"],
            registry=r,
        )
        self.session_decisions = Counter(
            "cost_router_session_decisions",
            "Requests by why their session's rules kept or moved the policy's tier "
            "(docs/conversations.md: held, escalated, tool_loop, ...)",
            ["policy", "mode", "reason"],
            registry=r,
        )
        # Live drift signals (router/observability/drift_monitor.py), per policy, over the rolling
        # window.
        self.score = Histogram(
            "cost_router_score",
            "Classifier scores of routed requests",
            ["policy"],
            buckets=SCORE_BUCKETS,
            registry=r,
        )
        self.score_psi = Gauge(
            "cost_router_score_psi",
            "PSI of the rolling window's scores vs the reference distribution",
            ["policy"],
            registry=r,
        )
        self.score_drift_pvalue = Gauge(
            "cost_router_score_drift_pvalue",
            "Two-sample KS p-value, rolling window's scores vs the reference distribution",
            ["policy"],
            registry=r,
        )
        self.large_share = Gauge(
            "cost_router_large_share",
            "Share of the rolling window's requests sent large",
            ["policy"],
            registry=r,
        )
        self.large_share_target = Gauge(
            "cost_router_large_share_target",
            "The policy's target large share",
            ["policy"],
            registry=r,
        )
        self.calibrated_threshold = Gauge(
            "cost_router_calibrated_threshold",
            "The score threshold in force",
            ["policy"],
            registry=r,
        )
        self.quality_retained = Gauge(
            "cost_router_quality_retained",
            "Routed mix's quality relative to all-large, from judged shadow pairs and feedback",
            ["policy"],
            registry=r,
        )
        self.quality_retained_low = Gauge(
            "cost_router_quality_retained_low",
            "Lower end of quality retained's 95% interval",
            ["policy"],
            registry=r,
        )
        self.quality_retained_high = Gauge(
            "cost_router_quality_retained_high",
            "Upper end of quality retained's 95% interval",
            ["policy"],
            registry=r,
        )
        self.quality_labels = Gauge(
            "cost_router_quality_labels",
            "Labelled requests quality retained rests on",
            ["policy"],
            registry=r,
        )
        # The same per (tier that answered, tier that shadowed it): a student against its teacher.
        self.tier_quality_retained = Gauge(
            "cost_router_tier_quality_retained",
            "A tier's quality relative to the tier that shadowed it (e.g. a student against its "
            "teacher), from judged shadow pairs and feedback",
            ["tier", "teacher"],
            registry=r,
        )
        self.tier_quality_retained_low = Gauge(
            "cost_router_tier_quality_retained_low",
            "Lower end of the tier's quality retained's 95% interval",
            ["tier", "teacher"],
            registry=r,
        )
        self.tier_quality_retained_high = Gauge(
            "cost_router_tier_quality_retained_high",
            "Upper end of the tier's quality retained's 95% interval",
            ["tier", "teacher"],
            registry=r,
        )
        self.tier_quality_labels = Gauge(
            "cost_router_tier_quality_labels",
            "Labelled shadow pairs the tier's quality retained rests on",
            ["tier", "teacher"],
            registry=r,
        )
        self.inflight = Gauge(
            "cost_router_inflight", "Upstream requests in flight", ["tier"], registry=r
        )

    def render(self, team_labels: bool = True) -> tuple[bytes, str]:
        """The exposition; team_labels=False (monitoring.team_labels): one that names no team."""
        source = self.registry if team_labels else WithoutTeams(self.registry)
        return generate_latest(source), CONTENT_TYPE_LATEST


TEAM_LABEL = "team"
SCOPE_LABEL = "scope"
KEY_SCOPE = "key:"  # policies/budgets/scopes.py key_scope: `key:<id>`, a key of one team


class WithoutTeams:
    """A registry's series with no team in them: the `team` label dropped and a key's scope
    (`key:<id>`) folded to `key`, then the series that coincide summed. Every team-labelled
    series is additive (spend, cost, requests, limits, remaining), so a sum is the fleet's total:
    rates, shares and remaining/limit stay right for the teams together, and a query that groups
    `by (team)` gets one series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if not any(TEAM_LABEL in s.labels for s in family.samples):
                yield family
                continue
            sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in family.samples:
                labels = {k: v for k, v in sample.labels.items() if k != TEAM_LABEL}
                if labels.get(SCOPE_LABEL, "").startswith(KEY_SCOPE):
                    labels[SCOPE_LABEL] = KEY_SCOPE.rstrip(":")
                key = (sample.name, tuple(sorted(labels.items())))
                sums[key] = sums.get(key, 0.0) + sample.value
            folded = Metric(family.name, family.documentation, family.type, family.unit)
            for (name, labels_), value in sums.items():
                folded.add_sample(name, dict(labels_), value)
            yield folded
