"""The budget audit invariant, checked after every budget test that runs through the proxy.

Once every request has ended, for every team:

1. spend <= limit (when the team has one);
2. spend == the ledger's sum for the team and the current period (`spend_from_ledger`, the rule
   `cost-router budget audit` uses);
3. spend == what the clients were told: the ``x-router-cost-usd`` header of a non-streaming
   answer, ``usage.cost_usd`` of a stream's final usage chunk. A request whose client was told
   nothing (a stream that failed or was cut mid-way, a stream that did not ask for usage, a client
   that hung up) counts with its trace record's ``cost_usd``; the report shows how many;
4. no live reservation: reserved == 0 and the reservation records (``res`` hash, ``lease`` set)
   are empty.

The store is read through its public API (`status`, `ledger`); only the reservation records have
no reader there, so they are read from the store's own Redis client under its key names (Redis and
Redis Cluster stores). `check_budget_invariant` builds its own store from the proxies' budgets
section, which only sees shared state: for the in-process memory store, pass the proxy's own
store to `audit_store` (its `reserved_nanos` then stands for the reservation records).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from policies.budgets.factory import build_stores
from policies.budgets.ledger import LedgerEntry, spend_from_ledger
from policies.budgets.money import usd_to_nanos
from policies.budgets.scopes import TEAM_SCOPE, BudgetScope
from policies.budgets.store import BudgetStore
from policies.config import BudgetLimit, BudgetsConfig
from tests.support.waiting import wait_for
from trace_format.reader import iter_records

REQUEST_ID = "x-router-request-id"
COST_HEADER = "x-router-cost-usd"


def stream_cost_usd(lines: Iterable[str]) -> float | None:
    """`usage.cost_usd` of the last usage chunk in a stream's SSE lines, if the relay sent one."""
    cost = None
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        try:
            obj = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            continue
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("cost_usd"), int | float):
            cost = float(usage["cost_usd"])
    return cost


@dataclass(slots=True)
class Told:
    """What the clients were told each request cost: request id -> (team, nanos or None)."""

    requests: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    anonymous: int = 0  # answers with no request id (never reached the request path)

    def add(self, team: str, request_id: str | None, cost_usd: float | None) -> None:
        if request_id is None:
            self.anonymous += 1
            return
        nanos = None if cost_usd is None else usd_to_nanos(cost_usd)
        self.requests[request_id] = (team, nanos)

    def response(self, team: str, resp: httpx.Response) -> None:
        """A non-streaming answer (any status): its cost header, when it has one."""
        cost = resp.headers.get(COST_HEADER)
        self.add(team, resp.headers.get(REQUEST_ID), None if cost is None else float(cost))

    def stream(self, team: str, resp: httpx.Response, lines: Iterable[str]) -> None:
        """A streamed answer, from its response headers and the SSE lines the client read."""
        if resp.status_code != 200 or "text/event-stream" not in resp.headers.get(
            "content-type", ""
        ):
            self.response(team, resp)
            return
        self.add(team, resp.headers.get(REQUEST_ID), stream_cost_usd(lines))

    def untold(self) -> list[str]:
        return [rid for rid, (_, nanos) in self.requests.items() if nanos is None]


@dataclass(frozen=True, slots=True)
class TeamAudit:
    team: str
    limit_nanos: int | None
    spent_nanos: int
    ledger_nanos: int
    told_nanos: int  # what the clients were told
    untold: int  # requests whose client was told no cost
    untold_trace_nanos: int  # their cost as the traces record it
    reserved_nanos: int
    open_reservations: int  # res hash entries + lease set members
    overage_nanos: int  # cost past the reservations, recorded in the ledger, never charged

    def problems(self) -> list[str]:
        out = []
        if self.limit_nanos is not None and self.spent_nanos > self.limit_nanos:
            out.append(f"spend {self.spent_nanos} > limit {self.limit_nanos}")
        if self.spent_nanos < 0:
            out.append(f"spend {self.spent_nanos} < 0")
        if self.spent_nanos != self.ledger_nanos:
            out.append(f"spend {self.spent_nanos} != ledger sum {self.ledger_nanos}")
        client_side = self.told_nanos + self.untold_trace_nanos
        if self.spent_nanos != client_side:
            out.append(
                f"spend {self.spent_nanos} != told {self.told_nanos} + untold (trace) "
                f"{self.untold_trace_nanos} = {client_side}"
            )
        if self.reserved_nanos or self.open_reservations:
            out.append(
                f"live reservations left: {self.reserved_nanos} nanos, "
                f"{self.open_reservations} records"
            )
        return out

    def line(self) -> str:
        return (
            f"{self.team}: spend {self.spent_nanos} of limit {self.limit_nanos}; ledger "
            f"{self.ledger_nanos}; told {self.told_nanos} + {self.untold} untold "
            f"({self.untold_trace_nanos} by trace); reserved {self.reserved_nanos} in "
            f"{self.open_reservations} records; overage {self.overage_nanos}"
        )


def trace_costs(paths: Iterable[Path], ids: set[str]) -> dict[str, int | None]:
    """cost_usd (as nanos) of the trace records with these ids, from every trace file given."""
    out: dict[str, int | None] = {}
    for path in paths:
        if not path.exists():
            continue
        for _, rec in iter_records(path):
            if rec.id in ids:
                out[rec.id] = None if rec.cost_usd is None else usd_to_nanos(rec.cost_usd)
    return out


async def _open_records(store: BudgetStore, team: str) -> int:
    keys = getattr(store, "keys", None)
    client: Any = getattr(store, "redis", None)
    if keys is None or client is None:  # the memory store: reserved_nanos says it all
        return 0
    k = keys(team)
    return int(await client.hlen(k.res)) + int(await client.zcard(k.lease))


async def audit_store(
    store: BudgetStore,
    limits: Mapping[str, BudgetLimit | None],
    told: Told,
    trace_nanos: Mapping[str, int | None],
) -> Audit:
    teams, charges = [], {}
    for team, limit in limits.items():
        status = (await store.status(BudgetScope(team, team_limit=limit)))[0]
        entries = await store.ledger(team)
        charges.update({e.request_id: e for e in entries if e.kind != "reset"})
        ledger = spend_from_ledger(entries).get((TEAM_SCOPE, status.period_id), 0)
        mine = [(rid, nanos) for rid, (t, nanos) in told.requests.items() if t == team]
        untold = [rid for rid, nanos in mine if nanos is None]
        teams.append(
            TeamAudit(
                team=team,
                limit_nanos=status.limit_nanos,
                spent_nanos=status.spent_nanos,
                ledger_nanos=ledger,
                told_nanos=sum(n for _, n in mine if n is not None),
                untold=len(untold),
                untold_trace_nanos=sum(trace_nanos.get(rid) or 0 for rid in untold),
                reserved_nanos=status.reserved_nanos,
                open_reservations=await _open_records(store, team),
                overage_nanos=sum(e.overage_nanos for e in entries),
            )
        )
    return Audit(teams, charges)


@dataclass(frozen=True, slots=True)
class Audit:
    teams: list[TeamAudit]
    charges: dict[str, LedgerEntry]  # request id -> its ledger entry

    def breaches(self) -> list[str]:
        return [f"{a.team}: {p}" for a in self.teams for p in a.problems()]

    def figures(self) -> str:
        return "\n".join(a.line() for a in self.teams)

    def live(self) -> bool:
        return any(a.reserved_nanos or a.open_reservations for a in self.teams)


def audit_budgets(
    settings: BudgetsConfig,
    limits: Mapping[str, BudgetLimit | None],
    told: Told,
    trace_paths: Iterable[Path] = (),
    settle_timeout_s: float = 15.0,
) -> Audit:
    """Wait until no reservation is live (settles run after the answer is sent) and every untold
    request's trace is on disk, then read the figures. `settings` is the proxies' budgets section
    (the audit builds its own store from it); `limits` the configured limit of each team."""
    paths = list(trace_paths)
    untold = set(told.untold())
    if untold and paths:
        wait_for(
            lambda: len(trace_costs(paths, untold)) == len(untold),
            settle_timeout_s,
            f"trace records of {len(untold)} requests whose client was told no cost",
        )
    traces = trace_costs(paths, untold) if untold else {}

    async def run() -> Audit:
        store, _ = build_stores(settings)  # the key store shares the budget store's client
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + settle_timeout_s
            while True:
                audit = await audit_store(store, limits, told, traces)
                if not audit.live() or loop.time() > deadline:
                    return audit
                await asyncio.sleep(0.05)  # a settle still in flight: poll until none is
        finally:
            await store.aclose()

    return asyncio.run(run())


def check_budget_invariant(
    settings: BudgetsConfig,
    limits: Mapping[str, BudgetLimit | None],
    told: Told,
    trace_paths: Iterable[Path] = (),
    settle_timeout_s: float = 15.0,
) -> Audit:
    """`audit_budgets`, then AssertionError listing every breach of the invariant (and the
    figures) if there is one."""
    audit = audit_budgets(settings, limits, told, trace_paths, settle_timeout_s)
    breaches = audit.breaches()
    assert not breaches, (
        "budget audit invariant broken:\n  "
        + "\n  ".join(breaches)
        + "\nfigures:\n"
        + audit.figures()
    )
    return audit
