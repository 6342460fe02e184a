"""What the Redis store and its Lua scripts agree on: key names and the encoding of a limit.

Every key of a team carries the hash tag ``{team}`` so each script touches a single slot and runs
unchanged on Redis Cluster. Layout under ``<prefix>:{<team>}:``:

- ``spend``    HASH ``scope|period-id`` -> nanos settled (scope: ``team`` or ``key:<key id>``)
- ``reserved`` HASH scope -> nanos held by open reservations
- ``res``      HASH request id -> reservation record (amount, tokens, periods, rate key)
- ``lease``    ZSET request id -> lease expiry (ms, Redis server time)
- ``limits``   HASH scope -> operator override ``nanos|period|rpm|tpm``
- ``rate:<minute>`` HASH ``scope|r`` / ``scope|t`` requests and tokens in that minute (TTL 120 s)
- ``done:<hour>`` HASH request id -> nanos charged, for requests reserved in that UTC hour;
  TTL 1 day (idempotent settle and journal replay; one key per hour keeps the keyspace small)
- ``ledger``   STREAM, one entry per charge (append-only audit trail; spend can be rebuilt from it)
"""

from __future__ import annotations

from policies.budgets.money import nanos_to_usd, usd_to_nanos
from policies.config import BudgetLimit


class TeamKeys:
    """Key names of one team; all share the hash tag {team}."""

    __slots__ = ("base",)

    def __init__(self, prefix: str, team: str) -> None:
        self.base = f"{prefix}:{{{team}}}"

    def __getattr__(self, name: str) -> str:  # spend, reserved, res, lease, limits, ledger
        return f"{self.base}:{name}"

    def rate(self, minute: int) -> str:
        return f"{self.base}:rate:{minute}"

    def done(self, minute: int) -> str:
        """Settled markers of the requests reserved in this minute's UTC hour."""
        return f"{self.base}:done:{minute // 60}"


def team_of_key(prefix: str, key: str) -> str:
    """The team a key of `prefix` belongs to (the text inside its hash tag)."""
    return key[len(prefix) + 2 : key.rindex("}")]


def encode_limit(limit: BudgetLimit | None) -> str:
    """A limit as the Lua scripts read it: limit_nanos|period|rpm|tpm, -1 meaning none."""
    if limit is None:
        return "-1|total|-1|-1"
    nanos = -1 if limit.limit_usd is None else usd_to_nanos(limit.limit_usd)
    return f"{nanos}|{limit.period}|{limit.rpm or -1}|{limit.tpm or -1}"


def decode_limit(text: str) -> BudgetLimit | None:
    nanos, period, rpm, tpm = text.split("|")
    if int(nanos) < 0 and int(rpm) < 0 and int(tpm) < 0:
        return None
    return BudgetLimit(
        limit_usd=None if int(nanos) < 0 else nanos_to_usd(int(nanos)),
        period=period,  # type: ignore[arg-type]
        rpm=None if int(rpm) < 0 else int(rpm),
        tpm=None if int(tpm) < 0 else int(tpm),
    )
