"""The operator's routes: `GET /healthz` (the process answers), `/readyz` (the replica can
serve: the budget store answers and every routing path has a tier that answers; each tier's state
in the body) and `/metrics` (Prometheus).

`/metrics` names every team with its spend and limit, so it is not for API callers: with
`monitoring.metrics_token_env` it needs that bearer token; with `monitoring.metrics_listen` it is
served only on that listener (router/server/listeners.py marks its requests); without either it
is open unless `auth.required` is set, where it refuses every scrape and says what to configure
(docs/monitoring.md, "Who can read /metrics").
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from policies.keys import bearer_token
from router.http.errors import RouterError, json_response
from router.http.openapi import METRICS_SECURITY, Health, Readiness, errors, ok
from router.observability.config import MonitoringConfig
from router.proxy.request_path import tier_chain
from router.proxy.state import RouterState

log = logging.getLogger("cost_router.metrics")

# Set in the ASGI scope by the metrics listener's front (router/server/listeners.py).
METRICS_LISTENER = "cost_router.metrics_listener"

ops_router = APIRouter(tags=["ops"])


@ops_router.get("/healthz", responses=ok(Health))
async def healthz() -> Response:
    return json_response(200, {"status": "ok"})


@ops_router.get(
    "/readyz",
    responses={**ok(Readiness), 503: {"model": Readiness, "description": "not ready"}},
)
async def readyz(request: Request) -> Response:
    """Ready means "can serve" (docs/deployment.md, "Health checks"): the budget store answers
    and every routing path has a tier that answers. One tier down behind a fallback keeps the
    replica in the load balancer: taking it out would not bring the tier back, and every
    replica shares the tiers, so one tier's outage would empty the pool."""
    state: RouterState = request.app.state.router
    checks = await readiness(state)
    paths = path_states(routing_paths(state), checks)
    ready = checks["budgets"]["ok"] and all(p["ok"] for p in paths.values())
    return json_response(200 if ready else 503, {"ready": ready, "checks": checks, "paths": paths})


@ops_router.get(
    "/metrics",
    responses={**ok(media_type="text/plain"), **errors(401, 404)},
    openapi_extra=METRICS_SECURITY,
)
async def metrics(request: Request) -> Response:
    state: RouterState = request.app.state.router
    check_metrics_access(
        state.config.monitoring,
        state.config.auth.required,
        request.headers.get("authorization"),
        on_metrics_listener=bool(request.scope.get(METRICS_LISTENER)),
    )
    await state.budgets.refresh_gauges()
    if state.drift is not None:
        await state.drift.refresh(state.selector.policies, state.config.policies)
    body, content_type = state.metrics.render(team_labels=state.config.monitoring.team_labels)
    return Response(body, media_type=content_type)


def check_metrics_access(
    settings: MonitoringConfig,
    auth_required: bool,
    authorization: str | None,
    on_metrics_listener: bool,
) -> None:
    """Raise the 404 or 401 a scrape gets when it may not read /metrics here."""
    if settings.metrics_listen is not None and not on_metrics_listener:
        raise RouterError(
            404, "not_found", "/metrics is served on its own listener (monitoring.metrics_listen)"
        )
    if settings.metrics_token_env is not None:
        expected = os.environ.get(settings.metrics_token_env, "")
        if not expected:
            # Fail closed: a token that was meant to exist and does not opens nothing.
            log.error("monitoring.metrics_token_env: %s is unset", settings.metrics_token_env)
            raise RouterError(
                401, "metrics_token_unset", "the proxy has no metrics token in its environment"
            )
        given = bearer_token(authorization)
        if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
            raise RouterError(
                401,
                "invalid_metrics_token",
                "/metrics needs 'Authorization: Bearer <token>' with the metrics token "
                "(monitoring.metrics_token_env)",
                headers={"www-authenticate": "Bearer"},
            )
        return
    if auth_required and not on_metrics_listener:
        # API callers must not read each other's teams, spend and limits.
        raise RouterError(
            401,
            "metrics_token_required",
            "/metrics is closed because auth.required is set: give it a bearer token "
            "(monitoring.metrics_token_env) or its own listener (monitoring.metrics_listen)",
            headers={"www-authenticate": "Bearer"},
        )


def routing_paths(state: RouterState) -> dict[str, list[str]]:
    """Each routing path by the tier it starts at: a tier some configured policy may choose (the
    default, experiments' arms, teams' and keys' policies, `router:<name>`: every built policy),
    then that tier's `fallback` tiers in order, as the request path tries them (tier_chain).
    Tiers that only a client naming them reaches (`model: <tier>`) start no path."""
    starts: list[str] = []
    for policy in state.selector.policies.values():
        starts += [t for t in policy.tiers() if t in state.tiers and t not in starts]
    if not starts:  # no policy: only explicit tiers route, each a path
        starts = list(state.tiers)
    return {t: [c.name for c in tier_chain(state, t)] for t in starts}


def path_states(
    paths: dict[str, list[str]], checks: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per path: its tiers, the first that answers (what would serve now), and whether one does."""
    states = {}
    for start, chain in paths.items():
        serving = next((t for t in chain if checks.get(f"tier:{t}", {}).get("ok")), None)
        states[start] = {"ok": serving is not None, "serving": serving, "tiers": chain}
    return states


async def readiness(state: RouterState) -> dict[str, dict[str, Any]]:
    names = list(state.backends)
    results = await asyncio.gather(*(state.backends[n].ready() for n in names))
    checks = {
        f"tier:{n}": {"ok": ok, "detail": detail}
        for n, (ok, detail) in zip(names, results, strict=True)
    }
    try:
        store_ok = await state.budgets.store.ping()
        checks["budgets"] = {"ok": store_ok, "detail": state.budgets.store.kind}
    except Exception as exc:  # noqa: BLE001 - a readiness probe reports, never raises
        checks["budgets"] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
    return checks
