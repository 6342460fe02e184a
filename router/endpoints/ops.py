"""The operator's routes: `GET /healthz` (the process answers), `/readyz` (every tier and the
budget store answer) and `/metrics` (Prometheus)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from router.http.errors import json_response
from router.http.openapi import Health, Readiness, ok
from router.proxy.state import RouterState

ops_router = APIRouter(tags=["ops"])


@ops_router.get("/healthz", responses=ok(Health))
async def healthz() -> Response:
    return json_response(200, {"status": "ok"})


@ops_router.get(
    "/readyz",
    responses={**ok(Readiness), 503: {"model": Readiness, "description": "not ready"}},
)
async def readyz(request: Request) -> Response:
    state: RouterState = request.app.state.router
    checks = await readiness(state)
    ready = all(c["ok"] for c in checks.values())
    return json_response(200 if ready else 503, {"ready": ready, "checks": checks})


@ops_router.get("/metrics", responses=ok(media_type="text/plain"))
async def metrics(request: Request) -> Response:
    state: RouterState = request.app.state.router
    await state.budgets.refresh_gauges()
    if state.drift is not None:
        await state.drift.refresh(state.selector.policies, state.config.policies)
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


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
