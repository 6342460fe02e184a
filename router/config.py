"""The router's one configuration model: YAML file + environment overrides, validated by pydantic.

Environment overrides use ``COST_ROUTER__`` with ``__`` between nested keys, e.g.
``COST_ROUTER__SERVER__PORT=9000`` or ``COST_ROUTER__BUDGETS__REDIS_URL=redis://host:6379/0``.
Values are parsed as YAML scalars, so ``true``/``8``/``0.5`` get their natural types.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "COST_ROUTER__"


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


class StrictModel(BaseModel):
    # Unknown keys are almost always typos; reject them so the error names the key.
    model_config = ConfigDict(extra="forbid")


class Price(StrictModel):
    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens")
    output_per_mtok: float = Field(ge=0, description="USD per million completion tokens")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        spend = prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok
        return spend / 1e6


class SpeculativeConfig(StrictModel):
    """Speculative decoding of a tier's server (vLLM --speculative-config, llama.cpp lookup).

    `prompt_lookup` is accepted as another name for vLLM's `ngram` (both draft by matching n-grams
    of the prompt). Impossible combinations are rejected by `backends.launch.launch_problems`.
    """

    method: Literal["ngram", "eagle", "eagle3", "draft_model", "prompt_lookup"] = "ngram"
    num_speculative_tokens: int = Field(default=5, ge=1, le=64)
    draft_model: str | None = Field(default=None, description="draft model / EAGLE head (vLLM)")
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    quantization: Literal["awq", "gptq", "fp8"] | None = Field(
        default=None, description="quantization of the draft model's weights (vLLM)"
    )


class LaunchConfig(StrictModel):
    """How to start a tier's server (used by `cost-router backends plan|launch`)."""

    engine: Literal["vllm", "llama_cpp"] = "vllm"
    model: str = Field(
        description="HF id or path (vLLM); GGUF path or 'package:PKG/FILE.gguf' (llama.cpp)"
    )
    port: int = Field(default=8000, ge=1, le=65535)
    host: str = "127.0.0.1"
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    quantization: Literal["awq", "gptq", "fp8"] | None = None
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    speculative: SpeculativeConfig | None = None
    n_threads: int | None = Field(default=None, ge=1)
    n_ctx: int | None = Field(default=None, ge=1)
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(
        default_factory=dict, description="server environment, e.g. CUDA_VISIBLE_DEVICES"
    )
    ready_timeout_s: float = Field(default=600.0, gt=0, description="launch waits this long")

    @model_validator(mode="after")
    def _possible(self) -> LaunchConfig:
        # Imported here: backends.launch imports this module for its types.
        from backends.launch import launch_problems

        problems = launch_problems(self)
        if problems:
            raise ValueError("; ".join(f"{key}: {msg}" for key, msg in problems))
        return self


class TierConfig(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    kind: Literal["openai", "litellm", "replay"] = "openai"
    base_url: str | None = None
    model: str = Field(description="model name sent upstream")
    api_key_env: str | None = Field(default=None, description="env var holding the upstream key")
    price: Price
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    connect_retries: int = Field(default=2, ge=0, le=10)
    max_inflight: int = Field(default=64, ge=1)
    queue_timeout_s: float = Field(default=0.5, ge=0)
    fallback: list[str] = Field(
        default_factory=list, description="tiers to try, in order, on failure"
    )
    metrics_url: str | None = Field(default=None, description="Prometheus /metrics of the server")
    replay_trace: str | None = Field(default=None, description="trace file for kind=replay")
    launch: LaunchConfig | None = None

    @model_validator(mode="after")
    def _needs_endpoint(self) -> TierConfig:
        if self.kind == "openai" and not self.base_url:
            raise ValueError("base_url is required for kind 'openai'")
        if self.kind == "replay" and not self.replay_trace:
            raise ValueError("replay_trace is required for kind 'replay'")
        return self


class ClassifierConfig(StrictModel):
    model_path: str | None = Field(default=None, description=".onnx file; None = shipped default")
    context_turns: int = Field(default=2, ge=0, le=20)


class PolicyConfig(StrictModel):
    """One named policy. `type` picks the class in policies/; the remaining keys are its params."""

    model_config = ConfigDict(extra="allow")
    type: Literal["threshold", "tiers", "budget_pacing", "fixed", "random"]


class ExperimentArm(StrictModel):
    policy: str
    weight: float = Field(gt=0)


class ExperimentConfig(StrictModel):
    """An A/B split: units hash (with the salt) to arms by weight; see policies/experiments.py."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    arms: dict[str, ExperimentArm] = Field(min_length=1)
    unit: Literal["team", "key", "user", "header"] = "team"
    header: str | None = Field(default=None, description="header name for unit 'header'")
    salt: str = Field(default="", description="'' = the experiment name")
    start: datetime | None = Field(default=None, description="ISO 8601; naive = UTC")
    stop: datetime | None = Field(default=None, description="ISO 8601; naive = UTC")
    teams: list[str] | None = Field(default=None, description="None = all teams")

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
    period: Literal["daily", "monthly", "total"] = "monthly"
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)


class TeamConfig(StrictModel):
    budget: BudgetLimit | None = None
    policy: str | None = None


class KeyConfig(StrictModel):
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the API key")
    team: str
    user: str | None = None
    name: str | None = None
    budget: BudgetLimit | None = None
    policy: str | None = None


class AuthConfig(StrictModel):
    required: bool = Field(default=False, description="require Authorization: Bearer <key>")
    default_team: str = "default"


class BudgetsConfig(StrictModel):
    store: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="cr", pattern=r"^[A-Za-z0-9_.\-]+$")
    fail_mode: Literal["closed", "open"] = "closed"
    lease_s: float = Field(default=120.0, gt=0, description="reservation lease before reclaim")
    default_max_tokens: int = Field(default=1024, ge=1)
    enforce_max_tokens: bool = Field(
        default=True,
        description="send default_max_tokens upstream when the client gave none, so the "
        "reserved worst case is a true upper bound",
    )
    prompt_estimate: Literal["bytes", "tiktoken"] = Field(
        default="bytes",
        description="prompt-token bound for reservations: 'bytes' (UTF-8 bytes, a strict upper "
        "bound for byte-level BPE) or 'tiktoken' (tighter, not a strict bound)",
    )
    timezone: str = "UTC"
    downgrade: bool = True
    redis_timeout_s: float = Field(default=1.0, gt=0, description="per-command socket timeout")
    sweep_interval_s: float = Field(default=10.0, gt=0, description="expired-lease sweeper")
    key_cache_s: float = Field(default=5.0, ge=0, description="cache of run-time key lookups")
    view_cache_s: float = Field(
        default=1.0, ge=0,
        description="how stale the budget view a policy sees may be (reserve is always exact)",
    )
    journal_path: str | None = Field(
        default=None,
        description="file for charges made while Redis was down (fail_mode open or a settle "
        "that could not reach Redis); None keeps them in memory",
    )

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, zone: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {zone!r}") from None
        return zone


class TracesConfig(StrictModel):
    path: str | None = Field(default="traces/requests.jsonl", description="None disables traces")
    max_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    backups: int = Field(default=5, ge=0)
    include_prompt: bool = False


class ServerConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    drain_timeout_s: float = Field(default=30.0, ge=0)


class SignalsConfig(StrictModel):
    """Polling of each tier's /metrics (backends/signals.py) for load-aware routing and traces."""

    enabled: bool = True
    interval_s: float = Field(default=2.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    stale_after_s: float = Field(
        default=10.0, gt=0, description="older readings are not given to policies"
    )


class RouterConfig(StrictModel):
    server: ServerConfig = Field(default_factory=ServerConfig)
    classifier: ClassifierConfig = Field(default_factory=ClassifierConfig)
    tiers: Annotated[list[TierConfig], Field(min_length=1)]
    default_policy: str = "balanced"
    policies: dict[str, PolicyConfig] = Field(default_factory=dict)
    experiments: list[ExperimentConfig] = Field(default_factory=list)
    teams: dict[str, TeamConfig] = Field(default_factory=dict)
    keys: list[KeyConfig] = Field(default_factory=list)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    budgets: BudgetsConfig = Field(default_factory=BudgetsConfig)
    traces: TracesConfig = Field(default_factory=TracesConfig)
    signals: SignalsConfig = Field(default_factory=SignalsConfig)

    @field_validator("tiers")
    @classmethod
    def _unique_tiers(cls, tiers: list[TierConfig]) -> list[TierConfig]:
        names = [t.name for t in tiers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate tier names: {dupes}")
        known = set(names)
        for i, tier in enumerate(tiers):
            for fb in tier.fallback:
                if fb not in known:
                    raise ValueError(f"tiers[{i}].fallback names unknown tier {fb!r}")
        return tiers

    @model_validator(mode="after")
    def _references_resolve(self) -> RouterConfig:
        tiers = {t.name for t in self.tiers}
        if self.policies and self.default_policy not in self.policies:
            raise ValueError(f"default_policy {self.default_policy!r} is not in policies")
        # With no policies configured, the default policy is built in (policies/registry.py).
        known = set(self.policies) or {self.default_policy}
        for name, team in self.teams.items():
            if team.policy and team.policy not in known:
                raise ValueError(f"teams.{name}.policy names unknown policy {team.policy!r}")
        for i, key in enumerate(self.keys):
            if key.policy and key.policy not in known:
                raise ValueError(f"keys[{i}].policy names unknown policy {key.policy!r}")
        names = [e.name for e in self.experiments]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate experiment names: {dupes}")
        for i, exp in enumerate(self.experiments):
            for arm, spec in exp.arms.items():
                if spec.policy not in known:
                    raise ValueError(
                        f"experiments[{i}].arms.{arm}.policy names unknown policy {spec.policy!r}"
                    )
        for name, pol in self.policies.items():
            for field in ("small", "large", "tier"):
                ref = (pol.model_extra or {}).get(field)
                if isinstance(ref, str) and ref not in tiers:
                    raise ValueError(f"policies.{name}.{field} names unknown tier {ref!r}")
        # Imported here: policies.registry imports this module. Checks params without file I/O.
        from policies.registry import validate_policy_params

        validate_policy_params(self)
        return self

    def tier(self, name: str) -> TierConfig:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    node: Any = data
    for part in path[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
            continue
        node = node.setdefault(part, {})
    last = path[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if path:
            _set_path(data, path, yaml.safe_load(raw) if raw != "" else "")


def config_from_dict(
    data: Mapping[str, Any], source: str = "<dict>", environ: Mapping[str, str] | None = None
) -> RouterConfig:
    merged = dict(data)
    try:
        apply_env_overrides(merged, environ)
    except (IndexError, ValueError, TypeError) as exc:
        raise ConfigError(f"bad environment override: {exc}") from exc
    try:
        return RouterConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> RouterConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return config_from_dict(data, source=str(p), environ=environ)
