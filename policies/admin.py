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

# A key id is a prefix of the key's sha256; fewer digits than this would match too many keys.
MIN_KEY_ID_DIGITS = 8


class AdminInputError(KeyError):
    """An argument that cannot be used (CLI: exit 2; API: 400). A KeyError, like KeyRing.find's
    "no such key" (CLI: exit 2; API: 404), so the CLI treats both the same way."""


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
        return await self.ring.create(team, user, name)

    async def find_key(self, key_id: str) -> KeyRecord:
        if len(key_id) < MIN_KEY_ID_DIGITS:
            raise AdminInputError(f"give at least {MIN_KEY_ID_DIGITS} hex digits of the key id")
        try:
            return await self.ring.find(key_id)
        except KeyError as exc:
            raise KeyNotFound(str(exc.args[0] if exc.args else exc)) from None

    async def revoke_key(self, key_id: str) -> KeyRecord:
        """Every replica refuses the key within budgets.key_cache_s."""
        if len(key_id) < MIN_KEY_ID_DIGITS:
            raise AdminInputError(f"give at least {MIN_KEY_ID_DIGITS} hex digits of the key id")
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
        for name in [team] if team else await self.teams():
            for status in await self.store.status(self.limits.scope(name)):
                out.append({"team": name, **status.to_json()})
        return out

    async def _key_id(self, key: str | None) -> str | None:
        return (await self.find_key(key)).key_id if key else None

    async def set_limit(self, team: str, key: str | None, limit: BudgetLimit | None) -> None:
        """Override the team's (or one of its keys') limit at once; None drops the override,
        and the config's limit applies again."""
        await self.store.set_limit(team, await self._key_id(key), limit)

    async def reset(self, team: str, key: str | None = None) -> int:
        """Zero the current period's spend; returns what was wiped (nanos). The ledger keeps a
        `reset` entry for audit."""
        return await self.store.reset(team, await self._key_id(key))

    async def ledger(self, team: str) -> list[LedgerEntry]:
        return await self.store.ledger(team)

    async def audit(self, team: str | None = None) -> list[AuditRow]:
        """Spend rebuilt from the ledger next to the stored spend, per scope and period."""
        rows = []
        for name in [team] if team else await self.store.teams():
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
