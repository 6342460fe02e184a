"""API keys -> caller identity. Keys are only ever stored as sha256 hex.

Keys come from the config file (`keys:` with `key_sha256`) and from a run-time store (the budget
store's Redis, or in process: `policies/budgets/factory.py` builds it next to the budget store)
managed with `cost-router keys create|revoke|list`. A run-time record for a hash wins over the
config entry, which is how a config key gets revoked without a restart.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import orjson

from policies.config import AuthConfig, KeyConfig
from policies.names import is_reserved

log = logging.getLogger("cost_router.keys")

KEY_PREFIX = "sk-cr-"


def key_id_of(key_sha256: str) -> str:
    """Public id of an API key: a prefix of its hash (safe to log, show and put in traces)."""
    return key_sha256[:16]


@dataclass(frozen=True, slots=True)
class Identity:
    team: str
    key_id: str | None = None
    user: str | None = None


class AuthError(Exception):
    """401: missing, unknown or revoked key. `code` is the OpenAI-style error code."""

    status = 401

    def __init__(self, message: str, code: str = "invalid_api_key") -> None:
        super().__init__(message)
        self.code = code


class KeyStoreUnavailable(Exception):
    """The run-time key store cannot be reached and the key is not in the config file: 503."""


@dataclass(slots=True)
class KeyRecord:
    key_sha256: str
    team: str
    user: str | None = None
    name: str | None = None
    created: float = 0.0
    revoked: float | None = None  # UNIX seconds of revocation
    source: str = "runtime"  # runtime | config

    @property
    def key_id(self) -> str:
        return key_id_of(self.key_sha256)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> KeyRecord:
        return cls(**orjson.loads(raw))


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class KeyStore(Protocol):
    async def get(self, key_sha256: str) -> KeyRecord | None: ...

    async def put(self, record: KeyRecord) -> None: ...

    async def all(self) -> list[KeyRecord]: ...


class InMemoryKeyStore:
    def __init__(self) -> None:
        self._records: dict[str, KeyRecord] = {}

    async def get(self, key_sha256: str) -> KeyRecord | None:
        return self._records.get(key_sha256)

    async def put(self, record: KeyRecord) -> None:
        self._records[record.key_sha256] = record

    async def all(self) -> list[KeyRecord]:
        return list(self._records.values())


class RedisKeyStore:
    """Records sharded over 256 hashes by the first two hex digits of the key's sha256:
    `<prefix>:keys:{k<hh>}` (hh -> JSON record). Each command touches one key, and the hash tags
    spread the buckets over a Redis Cluster's masters. Records written before sharding, in the
    single hash `<prefix>:keys`, are still read; a bucket's record wins over one there."""

    def __init__(self, client: Any, prefix: str) -> None:
        self._redis = client
        self._prefix = prefix
        self._legacy = f"{prefix}:keys"

    def bucket(self, key_sha256: str) -> str:
        return f"{self._prefix}:keys:{{k{key_sha256[:2]}}}"

    async def get(self, key_sha256: str) -> KeyRecord | None:
        raw = await self._redis.hget(self.bucket(key_sha256), key_sha256)
        if raw is None:
            raw = await self._redis.hget(self._legacy, key_sha256)
        return None if raw is None else KeyRecord.from_json(raw)

    async def put(self, record: KeyRecord) -> None:
        await self._redis.hset(self.bucket(record.key_sha256), record.key_sha256, record.to_json())

    async def all(self) -> list[KeyRecord]:
        pipe = self._redis.pipeline(transaction=False)  # one round trip per node
        for name in [self._legacy, *(self.bucket(f"{i:02x}") for i in range(256))]:
            pipe.hgetall(name)
        merged: dict[bytes | str, bytes | str] = {}
        for raw in await pipe.execute():
            merged.update(raw)  # legacy first, so the buckets' records win
        return [KeyRecord.from_json(v) for v in merged.values()]


class KeyRing:
    """Authenticates requests and manages keys (config keys + the run-time store).

    `cache_s` (budgets.key_cache_s) bounds how long a revocation takes to reach this replica.
    While the store is unreachable (`outage_grace_s`, budgets.key_outage_grace_s): a key this
    replica has seen revoked stays refused (401) for the life of the process; a key it verified
    against the store at most `outage_grace_s` before its last successful store call is judged
    as the store last said; any other key, config keys included (the store may hold their
    revocation), is refused with 503 when auth is required and treated as anonymous otherwise.

    `removed_teams` (the config's `removed_teams`): teams an operator removed on purpose. Their
    keys are refused (401 team_removed) rather than admitted as a team without a config section,
    which would have no spend limit."""

    def __init__(
        self,
        keys: Sequence[KeyConfig],
        auth: AuthConfig,
        store: KeyStore,
        cache_s: float = 5.0,
        outage_grace_s: float = 300.0,
        removed_teams: Collection[str] = (),
    ) -> None:
        self.required = auth.required
        self.removed_teams = frozenset(removed_teams)
        self.default_team = auth.default_team
        # Admin keys serve the admin API only: on the models they are told so, not "incorrect".
        self._admin_keys = frozenset(k.key_sha256 for k in auth.admin_keys)
        self.store = store
        self.cache_s = cache_s
        self.outage_grace_s = outage_grace_s
        self._config: dict[str, KeyRecord] = {
            k.key_sha256: KeyRecord(k.key_sha256, k.team, k.user, k.name, source="config")
            for k in keys
        }
        self._cache: dict[str, tuple[KeyRecord | None, float]] = {}
        # What the store last said about a key and when (monotonic), for outages; bounded like
        # the cache. Revocations seen are kept apart and never forgotten: they are few.
        self._verified: dict[str, tuple[KeyRecord | None, float]] = {}
        self._revoked: set[str] = set()
        self._last_contact = float("-inf")

    async def _runtime(self, key_sha256: str) -> KeyRecord | None:
        hit = self._cache.get(key_sha256)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        record = await self.store.get(key_sha256)
        self._learn(key_sha256, record, time.monotonic())
        if self.cache_s > 0:
            if len(self._cache) > 100_000:
                self._cache.clear()  # bounded: unknown keys must not grow memory forever
            self._cache[key_sha256] = (record, now + self.cache_s)
        return record

    def adopt(self, previous: KeyRing) -> None:
        """Take over what `previous` (the ring before a reload) learnt from the store."""
        self._verified = previous._verified
        self._revoked = previous._revoked
        self._last_contact = previous._last_contact

    def _learn(self, key_sha256: str, record: KeyRecord | None, when: float) -> None:
        self._last_contact = when
        if record is not None and record.revoked is not None:
            self._revoked.add(key_sha256)
        if len(self._verified) > 100_000:
            self._verified.clear()
        self._verified[key_sha256] = (record, when)

    def _during_outage(self, digest: str, exc: Exception) -> KeyRecord | None:
        """The record to judge `digest` by while the store is unreachable (see the class doc);
        raises when the key cannot be vouched for."""
        if digest in self._revoked:
            raise AuthError("This API key has been revoked.", "revoked_api_key")
        seen = self._verified.get(digest)
        if seen is not None and seen[1] >= self._last_contact - self.outage_grace_s:
            log.warning(
                "key store unreachable, judging key %s as last verified: %s", key_id_of(digest), exc
            )
            return seen[0] or self._config.get(digest)
        if self.required:
            raise KeyStoreUnavailable(f"key store unreachable: {exc}") from None
        log.warning(
            "key store unreachable, key %s not verified recently: anonymous (%s)",
            key_id_of(digest),
            exc,
        )
        return None

    async def authenticate(self, authorization: str | None) -> Identity:
        token = bearer_token(authorization)
        if token is None:
            if self.required:
                raise AuthError(
                    "Missing API key: send 'Authorization: Bearer <key>'.", "missing_api_key"
                )
            return Identity(self.default_team)
        digest = hash_key(token)
        if digest in self._admin_keys:
            # Refused with or without auth.required: an admin key charges no team.
            raise AuthError(
                "This is an admin key (auth.admin_keys): it serves the admin API (/admin/v1) "
                "only; call the models with a team's API key.",
                "admin_key_not_allowed",
            )
        try:
            record = await self._runtime(digest) or self._config.get(digest)
        except Exception as exc:  # noqa: BLE001 - any store failure is an outage here
            record = self._during_outage(digest, exc)
            if record is None:
                return Identity(self.default_team)
        if record is None:
            if self.required:
                raise AuthError("Incorrect API key provided.")
            return Identity(self.default_team)
        if record.revoked is not None:
            raise AuthError("This API key has been revoked.", "revoked_api_key")
        if record.team in self.removed_teams:
            raise AuthError(
                f"This API key's team {record.team!r} has been removed from the configuration "
                "(removed_teams).",
                "team_removed",
            )
        if is_reserved(record.team):
            # A run-time key made before names were checked (policies/names.py) would spend
            # against an internal scope, such as the shadow cap, with no limit of its own.
            raise AuthError(
                "This API key's team name is reserved for internal scopes; create a key of "
                "another team.",
                "reserved_team",
            )
        return Identity(record.team, record.key_id, record.user)

    async def create(
        self, team: str, user: str | None = None, name: str | None = None
    ) -> tuple[str, KeyRecord]:
        """Returns the raw key (shown once, never stored) and its record."""
        raw = generate_key()
        record = KeyRecord(hash_key(raw), team, user, name, created=time.time())
        await self.store.put(record)
        return raw, record

    async def find(self, key_id: str) -> KeyRecord:
        """By key id (hash prefix, at least 8 hex digits) or full sha256."""
        key_id = key_id.lower()
        if len(key_id) < 8:
            raise KeyError("give at least 8 hex digits of the key id")
        matches = {r.key_sha256: r for r in await self.list() if r.key_sha256.startswith(key_id)}
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} keys match {key_id!r}")
        return next(iter(matches.values()))

    async def revoke(self, key_id: str) -> KeyRecord:
        record = await self.find(key_id)
        record.revoked = time.time()
        await self.store.put(record)
        self._cache.pop(record.key_sha256, None)
        self._learn(record.key_sha256, record, time.monotonic())
        return record

    async def list(self) -> list[KeyRecord]:
        merged = dict(self._config)
        merged.update({r.key_sha256: r for r in await self.store.all()})
        return sorted(merged.values(), key=lambda r: (r.team, r.created, r.key_sha256))
