"""The admin API, `/admin/v1/...`: keys, teams and budgets over HTTP, for an admin key only.

Mirrors `cost-router keys|budget ...` and runs the same code (policies/admin.py); this module only
reads the request and writes the answer. Authorization: a key of `auth.admin_keys` (sha256 only,
like every key); no key, an unknown or a revoked key -> 401, a team's key -> 403. Bodies are read
like every other body of the proxy (bounded, JSON only) and checked by the pydantic models below,
which the OpenAPI schema publishes; a bad one is a 400 naming its field.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from starlette.responses import Response

from policies.admin import (
    Admin,
    AdminAuth,
    AdminInputError,
    KeyNotFound,
    NotAdmin,
    audit_json,
    key_json,
    ledger_json,
)
from policies.budgets.money import nanos_to_usd
from policies.budgets.redis_store import store_unavailable
from policies.budgets.store import BudgetUnavailable
from policies.config import BudgetLimit
from policies.keys import AuthError, KeyStoreUnavailable
from policies.names import (
    KEY_ID_MAX_LEN,
    KEY_ID_PATTERN,
    NAME_MAX_LEN,
    NAME_PATTERN,
    TEAM_TO_READ_PATTERN,
    check_key_id,
    check_name,
)
from router.http.body_limits import require_json
from router.http.errors import RouterError, json_response, validation_message
from router.http.openapi import errors, json_body, ok
from router.http.schemas import Whole
from router.proxy.request_path import parse_body, read_body
from router.proxy.state import RouterState

admin_router = APIRouter(prefix="/admin/v1", tags=["admin"])
log = logging.getLogger("cost_router.admin")

# An admin body is a few short fields; anything larger is not one.
ADMIN_MAX_BYTES = 16 * 1024
AUTH = {"security": [{"apiKey": []}]}
ERRORS = (400, 401, 403, 404, 415, 503)


# --- bodies -------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _named(kind: str) -> BeforeValidator:
    # policies/names.py's rule, so a refused name gets its message (which rule, the value
    # escaped and cut); a value that is not a string is left to pydantic's type error.
    return BeforeValidator(lambda v: check_name(kind, v) if isinstance(v, str) else v)


# The published schema states the rule enforced (the pattern refuses the reserved `__` prefix
# too: a name starts with a letter or digit). Constraints come before the check: the check then
# wraps them and runs first, and pydantic would publish no constraint placed after it.
NAME = Field(min_length=1, max_length=NAME_MAX_LEN, pattern=NAME_PATTERN)
TeamNameIn = Annotated[str, NAME, _named("team")]
UserNameIn = Annotated[str, NAME, _named("user")]
KeyNameIn = Annotated[str, NAME, _named("key name")]
KeyId = Annotated[
    str,
    Field(max_length=KEY_ID_MAX_LEN, pattern=KEY_ID_PATTERN),
    BeforeValidator(lambda v: check_key_id(v) if isinstance(v, str) else v),
]

# Path and query values: published here, checked by policies/admin.py (so the CLI gets the same
# refusal); a write may not name a reserved team, a read may (the shadow spend is shown).
_TEAM_SCHEMA = {"minLength": 1, "maxLength": NAME_MAX_LEN, "pattern": NAME_PATTERN}
TeamToWrite = Annotated[str, Path(json_schema_extra=_TEAM_SCHEMA)]
TeamToRead = Annotated[str, Path(json_schema_extra={"pattern": TEAM_TO_READ_PATTERN})]
KeyIdInPath = Annotated[str, Path(json_schema_extra={"pattern": KEY_ID_PATTERN})]
KeyIdQuery = Annotated[str | None, Query(json_schema_extra={"pattern": KEY_ID_PATTERN})]
TeamQuery = Annotated[str | None, Query(json_schema_extra={"pattern": TEAM_TO_READ_PATTERN})]


class KeyCreateIn(_Body):
    """A new API key of a team (`cost-router keys create`)."""

    team: TeamNameIn = Field(description="team the key charges")
    user: UserNameIn | None = Field(default=None, description="user the key belongs to")
    name: KeyNameIn | None = Field(default=None, description="label in the key list")
    allow_unlisted_team: bool = Field(
        default=False,
        description="create the key even if the config lists no such team: it has no spend limit",
    )


# What set_limit refuses without one of them, stated in the schema: at least one limit, not null.
_SOME_LIMIT = {
    "anyOf": [
        {"required": ["limit_usd"], "properties": {"limit_usd": {"type": "number"}}},
        {"required": ["rpm"], "properties": {"rpm": {"type": "integer"}}},
        {"required": ["tpm"], "properties": {"tpm": {"type": "integer"}}},
    ]
}
PerMinute = Annotated[int, Field(ge=1, le=2**31 - 1), Whole]  # 1000.0 is the integer 1000


class LimitIn(_Body):
    """A team's (or one of its keys') limit override (`cost-router budget set`); takes effect
    at once on every replica sharing the store. At least one of limit_usd, rpm, tpm."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_SOME_LIMIT)

    limit_usd: float | None = Field(default=None, ge=0, le=1e9, description="USD per period")
    period: Literal["hourly", "daily", "weekly", "monthly", "total"] = "monthly"
    rpm: PerMinute | None = Field(default=None, description="requests per minute")
    tpm: PerMinute | None = Field(default=None, description="tokens per minute")
    key_id: KeyId | None = Field(
        default=None, description="a key id: set that key's limit, not the team's"
    )


class ResetIn(_Body):
    """Zero the current period's spend (`cost-router budget reset`); the ledger keeps a
    `reset` entry."""

    key_id: KeyId | None = Field(default=None, description="a key id: reset that key's spend only")


BODIES: list[type[BaseModel]] = [KeyCreateIn, LimitIn, ResetIn]


# --- answers (published in the schema) --------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class KeyOut(_Out):
    object: Literal["api_key"]
    key_id: str
    team: str
    user: str | None
    name: str | None
    source: str = Field(description="runtime (created here or by the CLI) or config")
    created: float
    revoked: float | None


class KeyCreated(KeyOut):
    key: str = Field(description="the API key itself: shown once, only its sha256 is stored")


class KeyList(_Out):
    object: Literal["list"]
    data: list[KeyOut]


class TeamOut(_Out):
    team: str
    configured: bool = Field(description="listed under `teams:` of the config")


class TeamList(_Out):
    object: Literal["list"]
    data: list[TeamOut]


class Standing(_Out):
    team: str
    scope: str
    period: str
    period_id: str
    limit_usd: float | None
    spent_usd: float
    reserved_usd: float
    remaining_usd: float | None
    resets_at: float | None


class StandingList(_Out):
    object: Literal["list"]
    data: list[Standing]


class LimitOut(_Out):
    object: Literal["budget_limit"]
    team: str
    key_id: str | None
    limit: dict[str, Any] | None = Field(description="the override; null: cleared")


class ResetOut(_Out):
    object: Literal["budget_reset"]
    team: str
    key_id: str | None
    wiped_usd: float


class LedgerOut(_Out):
    object: Literal["list"]
    team: str
    data: list[dict[str, Any]]
    total_usd: float
    overage_usd: float = Field(description="cost past reservations, recorded and not charged")


class AuditOut(_Out):
    object: Literal["list"]
    data: list[dict[str, Any]]
    ok: bool = Field(description="stored spend equals the spend rebuilt from the ledger")


# --- plumbing -----------------------------------------------------------------------------------


async def _admin(request: Request) -> tuple[Admin, str]:
    """The deployment's admin service and who calls it (for the log), once the caller is shown
    to hold an admin key."""
    state: RouterState = request.app.state.router
    try:
        who = await AdminAuth(state.config.auth).check(
            request.headers.get("authorization"), state.keys
        )
    except AuthError as exc:
        raise RouterError(401, exc.code, str(exc)) from None
    except NotAdmin as exc:
        raise RouterError(403, "not_admin", str(exc)) from None
    except KeyStoreUnavailable as exc:
        raise RouterError(503, "key_store_unavailable", str(exc)) from None
    return Admin(state.budgets.store, state.keys, state.budgets.limits), who


async def _body(request: Request, model: type[BaseModel], empty_ok: bool = False) -> Any:
    raw = await read_body(request, ADMIN_MAX_BYTES)
    if not raw and empty_ok:
        return model()
    require_json(request.scope)
    data = parse_body(raw)
    if not isinstance(data, dict):
        raise RouterError(400, "invalid_request", "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors(include_url=False)))
        raise RouterError(400, "invalid_request", message, param) from None


async def _answer(action: Callable[[], Awaitable[dict[str, Any]]]) -> Response:
    """Run one admin action; its refusals become OpenAI-style errors."""
    try:
        return json_response(200, await action())
    except AdminInputError as exc:
        raise RouterError(400, "invalid_request", str(exc.args[0]), exc.param) from None
    except KeyNotFound as exc:
        raise RouterError(404, "key_not_found", str(exc.args[0]), "key_id") from None
    except Exception as exc:
        # By what the error means, as the budget store classifies it: a cluster failover can
        # raise uvloop's RuntimeError from a closed transport, which is an outage, not our bug.
        if not isinstance(exc, BudgetUnavailable) and not store_unavailable(exc):
            raise
        raise RouterError(
            503, "budget_unavailable", f"budget store unreachable ({type(exc).__name__})"
        ) from None


def _key(record: Any) -> dict[str, Any]:
    return {"object": "api_key", **key_json(record)}


def _list(data: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"object": "list", **extra, "data": data}


# --- keys ---------------------------------------------------------------------------------------


@admin_router.get("/keys", responses={**ok(KeyList), **errors(*ERRORS)}, openapi_extra=AUTH)
async def list_keys(request: Request) -> Response:
    admin, who = await _admin(request)

    async def act() -> dict[str, Any]:
        return _list([_key(r) for r in await admin.keys()])

    return await _answer(act)


@admin_router.post(
    "/keys",
    responses={**ok(KeyCreated), **errors(*ERRORS, 409, 413)},
    openapi_extra={**json_body(KeyCreateIn), **AUTH},
)
async def create_key(request: Request) -> Response:
    admin, who = await _admin(request)
    body: KeyCreateIn = await _body(request, KeyCreateIn)
    if admin.unlisted(body.team) and not body.allow_unlisted_team:
        # 409, not 400: the body is well formed (the schema cannot name the config's teams, and
        # must not publish them); it conflicts with the config.
        raise RouterError(
            409,
            "unlisted_team",
            f"the config lists no team {body.team!r}, so a "
            "key of it would have no spend limit: add it under `teams:`, or set "
            "allow_unlisted_team",
            "team",
        )

    async def act() -> dict[str, Any]:
        raw, record = await admin.create_key(body.team, body.user, body.name)
        log.info("admin %s created key %s of team %s", who, record.key_id, body.team)
        return {**_key(record), "key": raw}

    return await _answer(act)


@admin_router.post(
    "/keys/{key_id}/revoke", responses={**ok(KeyOut), **errors(*ERRORS)}, openapi_extra=AUTH
)
async def revoke_key(key_id: KeyIdInPath, request: Request) -> Response:
    admin, who = await _admin(request)

    async def act() -> dict[str, Any]:
        record = await admin.revoke_key(key_id)
        log.info("admin %s revoked key %s of team %s", who, record.key_id, record.team)
        return _key(record)

    return await _answer(act)


# --- teams and budgets --------------------------------------------------------------------------


@admin_router.get("/teams", responses={**ok(TeamList), **errors(*ERRORS)}, openapi_extra=AUTH)
async def list_teams(request: Request) -> Response:
    admin, who = await _admin(request)

    async def act() -> dict[str, Any]:
        return _list(
            [{"team": t, "configured": not admin.unlisted(t)} for t in await admin.teams()]
        )

    return await _answer(act)


@admin_router.get("/budgets", responses={**ok(StandingList), **errors(*ERRORS)}, openapi_extra=AUTH)
async def list_budgets(request: Request) -> Response:
    """Every team's standing (`cost-router budget show`)."""
    admin, who = await _admin(request)

    async def act() -> dict[str, Any]:
        return _list(await admin.standing())

    return await _answer(act)


@admin_router.get(
    "/budgets/{team}", responses={**ok(StandingList), **errors(*ERRORS)}, openapi_extra=AUTH
)
async def team_budget(team: TeamToRead, request: Request) -> Response:
    """One team's standing (`cost-router budget show --team`)."""
    admin, who = await _admin(request)

    async def act() -> dict[str, Any]:
        return _list(await admin.standing(team))

    return await _answer(act)


@admin_router.put(
    "/budgets/{team}/limit",
    responses={**ok(LimitOut), **errors(*ERRORS, 413)},
    openapi_extra={**json_body(LimitIn), **AUTH},
)
async def set_limit(team: TeamToWrite, request: Request) -> Response:
    admin, who = await _admin(request)
    body: LimitIn = await _body(request, LimitIn)
    if body.limit_usd is None and body.rpm is None and body.tpm is None:
        raise RouterError(
            400,
            "invalid_request",
            "give limit_usd, rpm or tpm (DELETE the limit to clear the override)",
            "limit_usd",
        )
    limit = BudgetLimit(limit_usd=body.limit_usd, period=body.period, rpm=body.rpm, tpm=body.tpm)

    async def act() -> dict[str, Any]:
        await admin.set_limit(team, body.key_id, limit)
        log.info(
            "admin %s set the limit of team %s (key %s): %s",
            who,
            team,
            body.key_id,
            limit.model_dump(),
        )
        return {
            "object": "budget_limit",
            "team": team,
            "key_id": body.key_id,
            "limit": limit.model_dump(),
        }

    return await _answer(act)


@admin_router.delete(
    "/budgets/{team}/limit", responses={**ok(LimitOut), **errors(*ERRORS)}, openapi_extra=AUTH
)
async def clear_limit(team: TeamToWrite, request: Request, key_id: KeyIdQuery = None) -> Response:
    """Drop the override: the config's limit applies again (`cost-router budget set --clear`)."""
    admin, who = await _admin(request)

    async def act() -> dict[str, Any]:
        await admin.set_limit(team, key_id, None)
        log.info("admin %s cleared the limit override of team %s (key %s)", who, team, key_id)
        return {"object": "budget_limit", "team": team, "key_id": key_id, "limit": None}

    return await _answer(act)


_OPTIONAL_BODY = json_body(ResetIn)
_OPTIONAL_BODY["requestBody"]["required"] = False  # no body: the team's spend


@admin_router.post(
    "/budgets/{team}/reset",
    responses={**ok(ResetOut), **errors(*ERRORS, 413)},
    openapi_extra={**_OPTIONAL_BODY, **AUTH},
)
async def reset_spend(team: TeamToWrite, request: Request) -> Response:
    admin, who = await _admin(request)
    body: ResetIn = await _body(request, ResetIn, empty_ok=True)

    async def act() -> dict[str, Any]:
        wiped = await admin.reset(team, body.key_id)
        log.info(
            "admin %s reset the spend of team %s (key %s): %d nanos", who, team, body.key_id, wiped
        )
        return {
            "object": "budget_reset",
            "team": team,
            "key_id": body.key_id,
            "wiped_usd": nanos_to_usd(wiped),
        }

    return await _answer(act)


@admin_router.get(
    "/budgets/{team}/ledger", responses={**ok(LedgerOut), **errors(*ERRORS)}, openapi_extra=AUTH
)
async def ledger(team: TeamToRead, request: Request) -> Response:
    """Every charge of the team, oldest first (`cost-router budget ledger`)."""
    admin, who = await _admin(request)

    async def act() -> dict[str, Any]:
        entries = await admin.ledger(team)
        return _list(
            [ledger_json(e) for e in entries],
            team=team,
            total_usd=nanos_to_usd(sum(e.nanos for e in entries)),
            overage_usd=nanos_to_usd(sum(e.overage_nanos for e in entries)),
        )

    return await _answer(act)


@admin_router.get("/audit", responses={**ok(AuditOut), **errors(*ERRORS)}, openapi_extra=AUTH)
async def audit(request: Request, team: TeamQuery = None) -> Response:
    """Stored spend against the spend rebuilt from the ledger (`cost-router budget audit`)."""
    admin, who = await _admin(request)

    async def act() -> dict[str, Any]:
        rows = await admin.audit(team)
        return _list([audit_json(r) for r in rows], ok=all(r.ok for r in rows))

    return await _answer(act)
