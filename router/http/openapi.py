"""The proxy's published OpenAPI schema: the real request bodies and the OpenAI-style errors.

Routes read their bodies themselves (router/endpoints/openai.py says why), so FastAPI cannot
infer the bodies: each route names its pydantic body model with `json_body(Model)`, and
`install_openapi` puts those models (and what they reference) into `components.schemas`. Error
responses are described once, as the `{"error": {...}}` body router/http/errors.py writes. The
API fuzz test (tests/router/http/test_api_fuzz.py) runs schemathesis against this schema over
real HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

REF = "#/components/schemas/{model}"
# `openapi_extra=` of GET /metrics: its own bearer token, not an API key (router/endpoints/ops.py).
METRICS_SECURITY = {"security": [{"metricsToken": []}]}


class ErrorDetail(BaseModel):
    message: str = Field(description="one sentence for people")
    type: str = Field(description="OpenAI error type, e.g. invalid_request_error")
    param: str | None = Field(description="the offending request field, when there is one")
    code: str | None = Field(description="machine-readable error code")


class ErrorResponse(BaseModel):
    """Every error the proxy answers, whatever the status (router/http/errors.py)."""

    error: ErrorDetail


class _OpenObject(BaseModel):
    model_config = ConfigDict(extra="allow")


class BudgetOut(_OpenObject):
    object: str = Field(description='"budget"')
    team: str
    key_id: str | None
    user: str | None
    remaining_usd: float | None = Field(description="what the tightest scope still allows")
    scopes: list[dict[str, Any]]


class FeedbackOut(_OpenObject):
    object: str = Field(description='"feedback"')
    request_id: str
    score: float
    comment: str | None
    time: float
    team: str | None
    key_id: str | None


class ModelEntry(_OpenObject):
    id: str
    object: str
    owned_by: str


class ModelList(_OpenObject):
    object: str
    data: list[ModelEntry]


class Health(_OpenObject):
    status: str


class Readiness(_OpenObject):
    ready: bool
    checks: dict[str, dict[str, Any]]


_DESCRIPTIONS = {
    400: "bad JSON, a body that is not an object, or a field out of range or of the wrong type "
    "(`param` names it)",
    401: "missing, unknown or revoked API key (on /metrics: missing or wrong metrics token)",
    403: "a team's API key on the admin API (it needs a key of auth.admin_keys)",
    404: "unknown model, or an unknown (or another team's) request id (/metrics: not served "
    "on this listener)",
    408: "the body did not arrive in time (server.body_timeout_s)",
    409: "the request conflicts with the config: a key of a team the config does not list "
    "(allow_unlisted_team makes one)",
    413: "body larger than the limit",
    415: "Content-Type is not application/json",
    429: "budget, rate limit or tier capacity exceeded (Retry-After)",
    502: "the upstream failed",
    503: "the upstream, the budget store or the key store is unavailable",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for FastAPI: these statuses, each with the OpenAI-style error body."""
    return {s: {"model": ErrorResponse, "description": _DESCRIPTIONS[s]} for s in statuses}


def json_body(model: type[BaseModel], description: str = "") -> dict[str, Any]:
    """`openapi_extra=` for a route that reads a JSON body of `model` itself."""
    return {
        "requestBody": {
            "required": True,
            "description": description or model.__doc__ or "",
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
        }
    }


def ok(
    model: type[BaseModel] | None = None,
    media_type: str = "application/json",
    description: str = "OK",
) -> dict[int | str, dict[str, Any]]:
    if model is not None:
        return {200: {"model": model, "description": description}}
    schema: dict[str, Any] = {"type": "string"} if media_type.startswith("text/") else {}
    return {200: {"description": description, "content": {media_type: {"schema": schema}}}}


def install_openapi(app: FastAPI, bodies: Sequence[type[BaseModel]]) -> None:
    """Serve the schema with `bodies` (the models json_body names) in components, and the
    bearer-key security scheme (required when `auth.required` is set)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, routes=app.routes, description=app.description
        )
        components = schema.setdefault("components", {})
        models = components.setdefault("schemas", {})
        for body in bodies:
            js = body.model_json_schema(ref_template=REF)
            models.update(js.pop("$defs", {}))
            models[body.__name__] = js
        components["securitySchemes"] = {
            "apiKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "a key of `keys` or `cost-router keys create`",
            },
            "anthropicKey": {
                "type": "apiKey",
                "in": "header",
                "name": "x-api-key",
                "description": "POST /v1/messages only: the key as Anthropic clients send it "
                "(ANTHROPIC_API_KEY)",
            },
            "metricsToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "/metrics only: the token of monitoring.metrics_token_env "
                "(required when that is set, or when auth.required is set without "
                "monitoring.metrics_listen)",
            },
        }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
