"""Configuration of routing and money: policies, experiments, teams, keys, auth, budgets."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from policies.names import check_name
from trace_format.config_base import StrictModel


def _named(kind: str) -> BeforeValidator:
    # policies/names.py's rule (one for the config, the CLI and the admin API), before the str
    # check: a bad name is one error naming its key; a value that is not a str is left to
    # pydantic's own error.
    return BeforeValidator(lambda v: check_name(kind, v) if isinstance(v, str) else v)


TeamName = Annotated[str, _named("team")]
UserName = Annotated[str, _named("user")]
KeyName = Annotated[str, _named("key name")]


def _team_keys(value: Any) -> Any:
    # Team names are mapping keys: checked before the sections, so a refused name (NUL, 10,000
    # characters) is reported once, escaped, under `teams`, never echoed raw as a key path.
    if isinstance(value, dict):
        for name in value:
            if isinstance(name, str):
                check_name("team", name)
    return value


class PolicyConfig(StrictModel):
    """One named policy: `type` and that type's params (the remaining keys).

    `type` is a plain str: the accepted names are policies/registry.py's SPECS, and the registry
    validates both (RouterConfig calls validate_policy_params), so a new type is one SPECS line.
    """

    model_config = ConfigDict(extra="allow")
    type: str
    model_path: str | None = Field(
        default=None,
        description="this policy's own classifier model (.onnx), e.g. a candidate model on one "
        "arm of an A/B experiment; None = classifier.model_path",
    )

    @field_validator("model_path")
    @classmethod
    def _onnx_file(cls, value: str | None) -> str | None:
        if value is not None and not value.endswith(".onnx"):
            raise ValueError(f"expected a path to an .onnx file, got {value!r}")
        return value


class ExperimentArm(StrictModel):
    policy: str
    weight: float = Field(gt=0)


class ExperimentConfig(StrictModel):
    """An A/B split: units hash (with the salt) to arms by weight; see policies/experiments.py."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    arms: dict[str, ExperimentArm] = Field(min_length=1)
    unit: Literal["team", "key", "user", "header", "session"] = Field(
        default="team",
        description="what is assigned to an arm: a team, an API key, the body's `user`, a "
        "header's value, or a conversation (session: docs/conversations.md, so a "
        "conversation never changes arm mid-way)",
    )
    header: str | None = Field(default=None, description="header name for unit 'header'")
    salt: str = Field(default="", description="'' = the experiment name")
    start: datetime | None = Field(default=None, description="ISO 8601; naive = UTC")
    stop: datetime | None = Field(default=None, description="ISO 8601; naive = UTC")
    teams: list[TeamName] | None = Field(default=None, description="None = all teams")

    @field_validator("start", "stop")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, arms: dict[str, ExperimentArm]) -> dict[str, ExperimentArm]:
        bad = [a for a in arms if not re.fullmatch(r"[A-Za-z0-9_.\-]+", a)]
        if bad:
            raise ValueError(f"arm names must match [A-Za-z0-9_.-]+: {bad}")
        return arms

    @model_validator(mode="after")
    def _header_named(self) -> ExperimentConfig:
        if self.unit == "header" and not self.header:
            raise ValueError("unit 'header' needs 'header'")
        if self.start and self.stop and self.stop <= self.start:
            raise ValueError("stop must be after start")
        return self


class BudgetLimit(StrictModel):
    limit_usd: float | None = Field(default=None, ge=0)
    period: Literal["hourly", "daily", "weekly", "monthly", "total"] = Field(
        default="monthly",
        description="the window spend resets on (policies/budgets/periods.py "
        "PERIODS): local hour, midnight, Monday midnight or the 1st in budgets.timezone; total "
        "never resets",
    )
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)


class TeamConfig(StrictModel):
    budget: BudgetLimit | None = None
    policy: str | None = None


# The `teams:` section (router/config.py RouterConfig.teams): team name -> its settings.
Teams = Annotated[dict[str, TeamConfig], BeforeValidator(_team_keys)]


class KeyConfig(StrictModel):
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the API key")
    team: TeamName
    user: UserName | None = None
    name: KeyName | None = None
    budget: BudgetLimit | None = None
    policy: str | None = None


class AdminKeyConfig(StrictModel):
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the admin key")
    name: str | None = Field(default=None, description="who holds it (shown in the log)")


class AuthConfig(StrictModel):
    required: bool = Field(default=False, description="require Authorization: Bearer <key>")
    default_team: TeamName = "default"
    admin_keys: list[AdminKeyConfig] = Field(
        default_factory=list,
        description="keys of the admin API (/admin/v1/...), stored as sha256 like every key; "
        "a team key is refused there (403); none = the admin API refuses every caller",
    )


REDIS_SCHEMES = ("redis", "rediss", "unix")


class BudgetsConfig(StrictModel):
    store: str = Field(
        default="memory",
        description="a store kind of policies/budgets/factory.py: memory | redis | redis-cluster",
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="redis://, rediss:// or unix:// URL; with store redis-cluster the "
        "redis:// or rediss:// address of any node (the client discovers the rest), db 0",
    )
    redis_wait_replicas: int = Field(
        default=0,
        ge=0,
        description="after each reserve and settle, WAIT until this many replicas have the "
        "write (bounds what a failover can lose; 0 = no wait)",
    )
    redis_wait_timeout_ms: int = Field(
        default=100,
        ge=1,
        description="longest WAIT for redis_wait_replicas; a write not replicated by then is "
        "kept, logged and counted, and the request goes on",
    )
    key_prefix: str = Field(default="cr", pattern=r"^[A-Za-z0-9_.\-]+$")
    fail_mode: Literal["closed", "open"] = "closed"
    lease_s: float = Field(default=120.0, gt=0, description="reservation lease before reclaim")
    default_max_tokens: int = Field(default=1024, ge=1)
    enforce_max_tokens: bool = Field(
        default=True,
        description="send default_max_tokens upstream when the client gave none, so the "
        "reserved worst case is a true upper bound",
    )
    prompt_estimate: Literal["tokenizer", "bytes", "tiktoken"] = Field(
        default="tokenizer",
        description="prompt-token bound for reservations: 'tokenizer' (the tier's own tokenizer "
        "and chat template where known, a llama.cpp tier launched from a GGUF, plus 2% and 8 "
        "tokens; else bytes), 'bytes' (UTF-8 bytes of the prompt's JSON, a strict upper bound "
        "for byte-level BPE, ~4x over) or 'tiktoken' (cl100k +25%, not a bound for other "
        "tokenizers)",
    )
    timezone: str = "UTC"
    downgrade: bool = True
    redis_timeout_s: float = Field(default=1.0, gt=0, description="per-command socket timeout")
    sweep_interval_s: float = Field(default=10.0, gt=0, description="expired-lease sweeper")
    key_cache_s: float = Field(default=5.0, ge=0, description="cache of run-time key lookups")
    key_outage_grace_s: float = Field(
        default=300.0,
        ge=0,
        description="while the key store is unreachable, admit a key only if this replica "
        "verified it against the store at most this long before it last reached the store; "
        "a key it saw revoked is refused whatever this says",
    )
    view_cache_s: float = Field(
        default=1.0,
        ge=0,
        description="how stale the budget view a policy sees may be (reserve is always exact)",
    )
    journal_path: str | None = Field(
        default=None,
        description="file for charges made while Redis was down (fail_mode open or a settle "
        "that could not reach Redis); None keeps them in memory",
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str, info: ValidationInfo) -> str:
        # Checked here, not when serve connects: a bad URL is a config error naming this key.
        cluster = info.data.get("store") == "redis-cluster"
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a port that is not a number
        except ValueError as exc:
            raise ValueError(f"not a valid URL ({exc})") from None
        hint = (
            "; for Redis Cluster use budgets.store: redis-cluster with a redis:// URL of any node"
            if "cluster" in parts.scheme
            else ""
        )
        if parts.scheme not in REDIS_SCHEMES:
            raise ValueError(
                f"unsupported scheme {parts.scheme!r} (use one of "
                f"{', '.join(s + '://' for s in REDIS_SCHEMES)}){hint}"
            )
        db = parts.path.strip("/")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError(f"no host in {url!r}")
        if parts.scheme != "unix" and db and not db.isdigit():
            raise ValueError(f"the path names the db and must be a number, not {db!r}")
        if cluster:
            if parts.scheme == "unix":
                raise ValueError("a Redis Cluster is reached over TCP: use redis:// or rediss://")
            if db not in ("", "0"):
                raise ValueError("a Redis Cluster has only db 0")
        return url

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, zone: str) -> str:
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {zone!r}") from None
        return zone
