"""The request path's session step: which conversation a request is in, and what its session
mode and the tool loop make of the policy's decision (policies/sessions/; docs/conversations.md).

`session_key` runs for every request (a hash, no I/O). `prepare` makes the request's plan; the
store is consulted only when the policy's mode needs it or the request is in a tool loop
(per_request traffic without tools makes no store round trip), and then exactly once, riding on
the request's budget reserve (`step_reserving`; router/proxy/budget_gate.py `ride`): the store's
step reads, decides and updates, and the reserve holds what the tier it chose needs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.config import TierConfig
from policies.base import Decision
from policies.budgets.scopes import BudgetScope
from policies.sessions.config import SessionParams
from policies.sessions.identity import HEADER, InvalidSessionId, SessionKey, session_of, uses_tools
from policies.sessions.identity import in_tool_loop as carries_tool_result
from policies.sessions.modes import CacheQuote, Plan, plan
from policies.sessions.store import ReserveOptions, SessionStore, SessionUnavailable, StepReserved
from policies.spec import tiers_by_price
from router.http.errors import RouterError
from trace_format.request_text import text_of_content

log = logging.getLogger(__name__)

CLIENT_TIER = "client_tier"  # the client named a tier: no session rule applies
STORE_UNAVAILABLE = "store_unavailable"  # fail_mode open and the store unreachable
# A stand-in for a tokenizer where only a rough count is needed (cache_aware's prices and the
# session's prompt tokens): ~4 characters a token for English text.
CHARS_PER_TOKEN = 4


@dataclass(slots=True)
class SessionInfo:
    """What the request learnt about its session: the x-router-session header and the trace."""

    key: SessionKey
    mode: str
    reason: str
    # The router's estimate of the prompt and of its prefix up to the last answer (the part a
    # tier that served the previous turn holds cached): what cache_aware priced, written to the
    # trace so the simulator prices every mode's decision exactly as the proxy would. The
    # conversation's messages, not the routing, set both, so one trace serves every mode.
    quote: tuple[int, int] | None = None

    def header(self) -> str:
        k = self.key
        return f"id={k.id}; turn={k.turn}; mode={self.mode}; reason={self.reason}"


def session_key(
    headers: Mapping[str, str], body: Mapping[str, Any], team: str
) -> SessionKey | None:
    """The request's conversation (None: it names none and has no prefix to derive one from);
    an unusable given id is a 400 naming it."""
    try:
        return session_of(headers.get(HEADER), body, team)
    except InvalidSessionId as exc:
        raise RouterError(400, "invalid_request", str(exc), param=exc.param) from None


def _quote(body: Mapping[str, Any], tiers: Mapping[str, TierConfig]) -> CacheQuote:
    """This request's prompt tokens, and those up to its last assistant message: the prefix the
    tier that answered that message holds in its prompt cache."""
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    sizes = [len(text_of_content(m.get("content"))) for m in messages]
    last_answer = max(
        (i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1
    )
    prefix = sum(sizes[: last_answer + 1])
    return CacheQuote(
        sum(sizes) // CHARS_PER_TOKEN,
        prefix // CHARS_PER_TOKEN,
        {name: t.price for name, t in tiers.items()},
    )


@dataclass(frozen=True, slots=True)
class PendingStep:
    """A session step the request takes at its budget reserve: the plan, and what it says."""

    key: SessionKey
    mode: str
    ttl_s: float
    plan: Plan
    proposal: str  # the policy's tier: where the request goes when the store is unreachable
    estimate: tuple[int, int]

    def tiers(self) -> list[str]:
        """Every tier the step may send the request to (the policy's first)."""
        out = [self.plan.fresh.tier]
        for move in self.plan.by_last.values():
            if move.tier not in out:
                out.append(move.tier)
        return out

    def outcome(self, done: StepReserved) -> tuple[str, SessionInfo]:
        """The tier the step chose, and what the header and the trace say about it."""
        if done.step is None:  # the store unreachable and fail_mode open
            return self.proposal, SessionInfo(self.key, self.mode, STORE_UNAVAILABLE, self.estimate)
        move = done.step.move
        return move.tier, SessionInfo(self.key, self.mode, move.reason, self.estimate)


def prepare(
    key: SessionKey | None,
    settings: SessionParams,
    body: Mapping[str, Any],
    decision: Decision,
    tiers: Mapping[str, TierConfig],
    policy_tiers: Sequence[str] | None = None,
) -> SessionInfo | PendingStep | None:
    """What the request's session makes of the policy's decision: nothing (no session), a
    SessionInfo when its mode leaves the decision as it is without asking the store, else the
    step to take at the reserve."""
    if key is None:
        return None
    tool_loop = settings.tool_loop and carries_tool_result(body)
    needs_store = settings.mode != "per_request" or (settings.tool_loop and uses_tools(body))
    quote = _quote(body, tiers)
    estimate = (quote.prompt_tokens, quote.prefix_tokens)
    if not needs_store:
        return SessionInfo(key, settings.mode, "per_request", estimate)
    order = tiers_by_price({name: t.price for name, t in tiers.items()})
    the_plan = plan(
        settings.mode,
        decision.tier,
        order,
        tool_loop=tool_loop,
        shed=decision.reason.startswith("load_shed:"),
        cache=quote if settings.mode == "cache_aware" else None,
        policy_tiers=policy_tiers,
    )
    return PendingStep(key, settings.mode, settings.ttl_s, the_plan, decision.tier, estimate)


async def step_reserving(
    store: SessionStore,
    pending: PendingStep,
    scope: BudgetScope,
    request_id: str,
    options: ReserveOptions,
    fail_open: bool,
) -> StepReserved:
    """The store's step and the request's reserve of what the chosen tier needs. A session
    store that cannot be reached on its own (not the budget store's Redis) is a 503, or with
    fail_mode open the request goes where the policy said (nothing reserved yet)."""
    key = pending.key
    try:
        return await store.step_reserving(
            key.team,
            key.store_key,
            pending.plan,
            pending.estimate[0],
            pending.ttl_s,
            scope,
            request_id,
            options,
        )
    except SessionUnavailable as exc:
        if not fail_open:
            log.error("session store unreachable, refusing the request (fail_mode closed): %s", exc)
            raise RouterError(
                503,
                "session_store_unavailable",
                "the session store (the budget store) is unreachable; retry",
                headers={"retry-after": "1"},
            ) from None
        log.warning("session store unreachable, deciding without the session: %s", exc)
        return StepReserved(None, None)
