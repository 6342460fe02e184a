"""The router's configuration: `RouterConfig` composes each area's own section models and checks
the references between them; this module owns loading (YAML file + environment overrides).

Environment overrides use ``COST_ROUTER__`` with ``__`` between nested keys, e.g.
``COST_ROUTER__SERVER__PORT=9000`` or ``COST_ROUTER__BUDGETS__REDIS_URL=redis://host:6379/0``.
Values are parsed as YAML scalars, so ``true``/``8``/``0.5`` get their natural types.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from backends.config import SignalsConfig, StrictModel, TierConfig
from backends.registry import tier_problems
from classifiers.config import ClassifierConfig
from policies.budgets.factory import check_store_kind
from policies.config import (
    AuthConfig,
    BudgetsConfig,
    ConfigError,
    ExperimentConfig,
    KeyConfig,
    PolicyConfig,
    TeamConfig,
)
from policies.registry import PolicyEnv, check_routing

__all__ = ["ConfigError", "RouterConfig", "config_from_dict", "load_config", "section_from_env"]

ENV_PREFIX = "COST_ROUTER__"

Section = TypeVar("Section", bound=BaseModel)


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
        problems = [f"tiers.{i}.{key}: {msg}" for i, tier in enumerate(self.tiers)
                    for key, msg in tier_problems(tier)]
        if problems:
            raise ConfigError("; ".join(problems))
        check_store_kind(self.budgets.store)
        check_routing(self.policies, self.default_policy, {t.name for t in self.tiers},
                      self.teams, self.keys, self.experiments)
        return self

    def policy_env(self) -> PolicyEnv:
        """What building this config's policies needs besides their params."""
        return PolicyEnv(prices={t.name: t.price for t in self.tiers},
                         default_policy=self.default_policy,
                         model_path=self.classifier.model_path)

    def tier(self, name: str) -> TierConfig:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)


def _format_validation_error(err: ValidationError, source: str, section: str = "") -> str:
    """One line per error, each naming its key (under `section` when one section was checked)."""
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        path = [section, *e["loc"]] if section else list(e["loc"])
        loc = ".".join(str(p) for p in path)
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, ConfigError):
            # A cross-section check (policy params, tier kinds) already names its key.
            lines.append(f"  {cause}" if not e["loc"] else f"  {loc}: {cause}")
        else:
            lines.append(f"  {loc or '(top level)'}: {e['msg']}")
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


def section_from_env(
    name: str, model: type[Section], check: Callable[[Section], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Section:
    """One top-level section (e.g. `budgets`) from its defaults and its ``COST_ROUTER__<NAME>__*``
    overrides alone, for commands run without a config file. Problems raise ConfigError naming
    the key (``budgets.lease_s: ...``), as `config_from_dict` names them; `check` (raising
    ConfigError) adds what the whole config would check about this section."""
    data: dict[str, Any] = {}
    try:
        apply_env_overrides(data, environ)
    except (IndexError, ValueError, TypeError) as exc:
        raise ConfigError(f"bad environment override: {exc}") from exc
    source = f"the environment ({ENV_PREFIX}{name.upper()}__*)"
    try:
        section = model.model_validate(data.get(name) or {})
        if check is not None:
            check(section)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source, name)) from None
    except ConfigError as exc:
        raise ConfigError(f"invalid configuration in {source}:\n  {exc}") from None
    return section


def config_from_dict(
    data: Mapping[str, Any], source: str = "<dict>", environ: Mapping[str, str] | None = None
) -> RouterConfig:
    # Overrides are set in place deep inside the tree: copy it all, so the caller's data (a YAML
    # file `tune --write` saves back, a module's defaults) never carries environment values.
    merged = copy.deepcopy(dict(data))
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
