"""`GET /v1/budget`: the caller's own team (and key) budget, identified by its API key."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from policies.budgets.store import BudgetUnavailable
from router.http.errors import RouterError, json_response
from router.http.openapi import BudgetOut, errors, ok
from router.proxy.request_path import identify

budget_router = APIRouter()


@budget_router.get(
    "/v1/budget",
    tags=["budgets"],
    responses={**ok(BudgetOut), **errors(401, 503)},
    openapi_extra={"security": [{"apiKey": []}]},
)
async def get_budget(request: Request) -> Response:
    state = request.app.state.router
    identity = await identify(state, request)  # 401 for a missing/unknown/revoked key
    try:
        statuses = await state.budgets.store.status(state.budgets.scope(identity))
    except BudgetUnavailable as exc:
        raise RouterError(503, "budget_unavailable", str(exc)) from None
    if state.budgets.gauges is not None:
        state.budgets.gauges.observe(identity.team, statuses)
    scopes = [s.to_json() for s in statuses]
    remaining = [s["remaining_usd"] for s in scopes if s["remaining_usd"] is not None]
    body: dict[str, Any] = {
        "object": "budget",
        "team": identity.team,
        "key_id": identity.key_id,
        "user": identity.user,
        # The tightest scope bounds what the caller can still spend.
        "remaining_usd": min(remaining) if remaining else None,
        "scopes": scopes,
    }
    return json_response(200, body)
