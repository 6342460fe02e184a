"""Prometheus gauges of spend and remaining budget per team (and per key scope)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from policies.budgets.money import nanos_to_usd
from policies.budgets.store import ScopeStatus


class BudgetGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["team", "scope"]
        self.spent = Gauge(
            "cost_router_budget_spent_usd",
            "Settled spend in the current budget period",
            labels,
            registry=registry,
        )
        self.reserved = Gauge(
            "cost_router_budget_reserved_usd",
            "Held by open reservations",
            labels,
            registry=registry,
        )
        self.remaining = Gauge(
            "cost_router_budget_remaining_usd",
            "Limit minus spent minus reserved (absent when unlimited)",
            labels,
            registry=registry,
        )
        self.limit = Gauge(
            "cost_router_budget_limit_usd", "Limit of the current period", labels, registry=registry
        )

    def observe(self, team: str, statuses: list[ScopeStatus]) -> None:
        for st in statuses:
            self.spent.labels(team, st.scope).set(nanos_to_usd(st.spent_nanos))
            self.reserved.labels(team, st.scope).set(nanos_to_usd(st.reserved_nanos))
            if st.limit_nanos is not None and st.remaining_nanos is not None:
                self.limit.labels(team, st.scope).set(nanos_to_usd(st.limit_nanos))
                self.remaining.labels(team, st.scope).set(nanos_to_usd(st.remaining_nanos))
