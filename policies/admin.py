"""Operator actions on keys, teams and budgets: the one implementation behind both the CLI
(`cost-router keys|budget ...`, router/commands/budget.py) and the HTTP admin API
(`/admin/v1/...`, router/endpoints/admin.py). Each caller only parses its input and formats the
result; what an action does, and what it refuses, is decided here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.budgets.ledger import LedgerEntry, spend_from_ledger
from policies.budgets.money import nanos_to_usd
from policies.budgets.scopes import ScopeLimits
from policies.budgets.store import BudgetStore
from policies.config import AuthConfig, BudgetLimit
from policies.keys import AuthError, KeyRecord, KeyRing, bearer_token, hash_key, key_id_of
from policies.names import KEY_ID_MIN_LEN, check_key_id, check_name, check_team_to_read

# A key id is a prefix of the key's sha256; fewer digits than this would match too many keys.
MIN_KEY_ID_DIGITS = KEY_ID_MIN_LEN


class AdminInputError(KeyError):
    """An argument that cannot be used (CLI: exit 2; API: 400 naming `param`). A KeyError, like
    KeyRing.find's "no such key" (CLI: exit 2; API: 404), so the CLI treats both the same way."""

    def __init__(self, message: str, param: str = "key_id") -> None:
        super().__init__(message)
        self.param = param


def checked_name(kind: str, value: str, param: str) -> str:
    """policies/names.py's rule, refused as bad input naming `param` (the field or option)."""
    try:
        return check_name(kind, value)
    except ValueError as exc:
        raise AdminInputError(str(exc), param) from None


def check_key_names(team: str, user: str | None = None, name: str | None = None) -> None:
    """The names a new key is stored with; the CLI calls this before it says anything else
    about the team, the API's body model applies the same rule (policies/names.py)."""
    checked_name("team", team, "team")
    if user is not None:
        checked_name("user", user, "user")
    if name is not None:
        checked_name("key name", name, "name")


def checked_team(team: str, *, reading: bool = False) -> str:
    """A team an action names. Writes (limits, resets) refuse reserved names: an override on
    `__shadow__` would lift the shadow cap that `evaluation.daily_cap_usd` sets. Reads may name
    one (the shadow spend is shown like a team's) but must otherwise be a valid name."""
    try:
        return check_team_to_read(team) if reading else check_name("team", team)
    except ValueError as exc:
        raise AdminInputError(str(exc), "team") from None


def checked_key_id(key_id: str) -> str:
    try:
        return check_key_id(key_id)
    except ValueError as exc:
        raise AdminInputError(str(exc), "key_id") from None


class KeyNotFound(KeyError):
    """No key (or more than one) matches the key id given."""


class NotAdmin(Exception):
    """403: a valid team key on the admin API."""


class AdminAuth:
    """Who may use the admin API: the holders of `auth.admin_keys` (sha256 only, like every
    key). Admin keys are never team keys: they charge nothing and cannot call the models."""

    def __init__(self, auth: AuthConfig) -> None:
        self._keys = {k.key_sha256: k.name for k in auth.admin_keys}

    async def check(self, authorization: str | None, ring: KeyRing) -> str:
        """Who holds the key (its name, else its key id), for the log; raises AuthError (401:
        no key, unknown or revoked key) or NotAdmin (403: a team's key)."""
        token = bearer_token(authorization)
        if token is None:
            raise AuthError(
                "Missing admin key: send 'Authorization: Bearer <admin key>'.", "missing_api_key"
            )
        digest = hash_key(token)
        if digest in self._keys:
            return self._keys[digest] or key_id_of(digest)
        identity = await ring.authenticate(authorization)  # AuthError for unknown/revoked keys
        if identity.key_id is None:  # auth not required: an unknown key passes as anonymous
            raise AuthError("Incorrect admin key provided.")
        if not self._keys:
            raise NotAdmin("the admin API is off: no auth.admin_keys are configured")
        raise NotAdmin("a team's API key cannot use the admin API; use a key of auth.admin_keys")


@dataclass(frozen=True, slots=True)
class AuditRow:
    team: str
    scope: str
    period_id: str
    stored_nanos: int
    ledger_nanos: int

    @property
    def ok(self) -> bool:
        return self.stored_nanos == self.ledger_nanos


@dataclass(frozen=True, slots=True)
class Admin:
    """A deployment's keys and budgets: its budget store, its key ring and its configured
    limits (the `teams` and `keys` sections)."""

    store: BudgetStore
    ring: KeyRing
    limits: ScopeLimits

    # --- keys ---------------------------------------------------------------------------------

    def unlisted(self, team: str) -> bool:
        """A key of a team the config does not list has no spend limit."""
        return team not in self.limits.team_names

    async def create_key(
        self, team: str, user: str | None = None, name: str | None = None
    ) -> tuple[str, KeyRecord]:
        """The raw key (shown once; only its sha256 is stored) and its record."""
        check_key_names(team, user, name)
        if team in self.ring.removed_teams:
            # Its keys are refused at request time (docs/budgets.md): a new one would be dead.
            raise AdminInputError(
                f"team {team!r} is listed under removed_teams: its keys are refused", "team"
            )
        return await self.ring.create(team, user, name)

    async def find_key(self, key_id: str) -> KeyRecord:
        if len(key_id) < MIN_KEY_ID_DIGITS:
            raise AdminInputError(f"give at least {MIN_KEY_ID_DIGITS} hex digits of the key id")
        key_id = checked_key_id(key_id)
        try:
            return await self.ring.find(key_id)
        except KeyError as exc:
            raise KeyNotFound(str(exc.args[0] if exc.args else exc)) from None

    async def revoke_key(self, key_id: str) -> KeyRecord:
        """Every replica refuses the key within budgets.key_cache_s."""
        if len(key_id) < MIN_KEY_ID_DIGITS:
            raise AdminInputError(f"give at least {MIN_KEY_ID_DIGITS} hex digits of the key id")
        key_id = checked_key_id(key_id)
        try:
            return await self.ring.revoke(key_id)
        except KeyError as exc:
            raise KeyNotFound(str(exc.args[0] if exc.args else exc)) from None

    async def keys(self) -> list[KeyRecord]:
        return await self.ring.list()

    # --- teams and budgets --------------------------------------------------------------------

    async def teams(self) -> list[str]:
        """Configured teams and every team the store has seen spend or limits for."""
        return sorted(set(self.limits.team_names) | set(await self.store.teams()))

    async def standing(self, team: str | None = None) -> list[dict[str, Any]]:
        """Each scope's standing (team, and keys with their own limits) in the current period."""
        out = []
        names = [checked_team(team, reading=True)] if team is not None else await self.teams()
        for name in names:
            for status in await self.store.status(self.limits.scope(name)):
                out.append({"team": name, **status.to_json()})
        return out

    async def _key_id(self, key: str | None) -> str | None:
        return (await self.find_key(key)).key_id if key is not None else None

    async def set_limit(self, team: str, key: str | None, limit: BudgetLimit | None) -> None:
        """Override the team's (or one of its keys') limit at once; None drops the override,
        and the config's limit applies again."""
        await self.store.set_limit(checked_team(team), await self._key_id(key), limit)

    async def reset(self, team: str, key: str | None = None) -> int:
        """Zero the current period's spend; returns what was wiped (nanos). The ledger keeps a
        `reset` entry for audit."""
        return await self.store.reset(checked_team(team), await self._key_id(key))

    async def ledger(self, team: str) -> list[LedgerEntry]:
        return await self.store.ledger(checked_team(team, reading=True))

    async def audit(self, team: str | None = None) -> list[AuditRow]:
        """Spend rebuilt from the ledger next to the stored spend, per scope and period."""
        rows = []
        every = [checked_team(team, reading=True)] if team is not None else None
        for name in every or await self.store.teams():
            stored = await self.store.spend(name)
            rebuilt = spend_from_ledger(await self.store.ledger(name))
            for scope, pid in sorted(set(stored) | set(rebuilt)):
                rows.append(
                    AuditRow(
                        name, scope, pid, stored.get((scope, pid), 0), rebuilt.get((scope, pid), 0)
                    )
                )
        return rows


# --- the JSON both the CLI's --json and the API answer -----------------------------------------


def key_json(r: KeyRecord) -> dict[str, Any]:
    return {
        "key_id": r.key_id,
        "team": r.team,
        "user": r.user,
        "name": r.name,
        "source": r.source,
        "created": r.created,
        "revoked": r.revoked,
    }


def ledger_json(e: LedgerEntry) -> dict[str, Any]:
    return {
        "request_id": e.request_id,
        "key_id": e.key_id,
        "usd": nanos_to_usd(e.nanos),
        "kind": e.kind,
        "overage_usd": nanos_to_usd(e.overage_nanos),
        "periods": e.periods,
        "time": e.time,
    }


def audit_json(r: AuditRow) -> dict[str, Any]:
    return {
        "team": r.team,
        "scope": r.scope,
        "period_id": r.period_id,
        "stored_usd": nanos_to_usd(r.stored_nanos),
        "ledger_usd": nanos_to_usd(r.ledger_nanos),
        "ok": r.ok,
    }
