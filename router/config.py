"""The router's configuration: `RouterConfig` composes each area's own section models and checks
the references between them; this module owns loading (YAML file + environment overrides) and
editing the file (`edit_config`).

Environment overrides use ``COST_ROUTER__`` with ``__`` between nested keys, e.g.
``COST_ROUTER__SERVER__PORT=9000`` or ``COST_ROUTER__BUDGETS__REDIS_URL=redis://host:6379/0``.
Values are parsed as YAML scalars, so ``true``/``8``/``0.5`` get their natural types.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from backends.config import SignalsConfig, TierConfig
from backends.registry import tier_problems
from classifiers.config import ClassifierConfig
from policies.budgets.factory import check_store_kind
from policies.config import (
    AuthConfig,
    BudgetsConfig,
    ExperimentConfig,
    KeyConfig,
    PolicyConfig,
    TeamName,
    Teams,
)
from policies.registry import PolicyEnv, check_routing
from router.learning.config import EvaluationConfig, check_evaluation
from router.observability.config import MonitoringConfig
from router.observability.telemetry_config import TelemetryConfig
from simulations.sim_config import SimConfig, defaults_document, set_threshold
from trace_format.config_base import ConfigError, StrictModel

__all__ = [
    "RouterConfig",
    "sim_config_from",
    "simulator_defaults",
    "write_threshold",
    "config_from_dict",
    "config_from_yaml",
    "edit_config",
    "load_config",
    "section_from_env",
    "write_atomically",
]

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
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="a request's head and body must arrive within this many seconds of its "
        "first byte (a new connection's first byte too); later: 408 and the connection closed, "
        "so slow-drip clients cannot hold connections",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=4096,
        description="request line plus headers larger than this: 431 and the connection closed",
    )
    max_headers: int = Field(
        default=100,
        ge=16,
        description="requests with more header fields than this: 431",
    )
    reload_debounce_s: float = Field(
        default=1.0,
        ge=0,
        description="hot reload applies a changed config file only once it has stayed unchanged "
        "this long (router/proxy/reload.py)",
    )


class EmbeddingsConfig(StrictModel):
    """`POST /v1/embeddings` (router/endpoints/embeddings.py): passed through to one tier,
    unrouted."""

    tier: str | None = Field(
        default=None,
        description="the tier of an embedding model that serves every /v1/embeddings request "
        "(charged by input tokens at its prompt price); None: /v1/embeddings answers 404",
    )


def _check_removed_teams(config: RouterConfig) -> None:
    """A removed team is refused everywhere, so nothing may still name it as its own."""
    removed = set(config.removed_teams)
    problems = [f"removed_teams: {t!r} is also under teams" for t in config.teams if t in removed]
    problems += [
        f"keys.{i}.team: {k.team!r} is listed under removed_teams"
        for i, k in enumerate(config.keys)
        if k.team in removed
    ]
    if config.auth.default_team in removed:
        problems.append(f"auth.default_team: {config.auth.default_team!r} is under removed_teams")
    if problems:
        raise ConfigError("; ".join(problems))


class RouterConfig(StrictModel):
    server: ServerConfig = Field(default_factory=ServerConfig)
    classifier: ClassifierConfig = Field(default_factory=ClassifierConfig)
    tiers: Annotated[list[TierConfig], Field(min_length=1)]
    default_policy: str = "balanced"
    policies: dict[str, PolicyConfig] = Field(default_factory=dict)
    experiments: list[ExperimentConfig] = Field(default_factory=list)
    teams: Teams = Field(default_factory=dict)
    removed_teams: list[TeamName] = Field(
        default_factory=list,
        description="teams removed on purpose: a hot reload may drop their `teams` sections "
        "(one that drops a team not listed here is refused), and their run-time keys are "
        'refused (401 team_removed); docs/budgets.md, "Reloads that remove a team"',
    )
    keys: list[KeyConfig] = Field(default_factory=list)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    budgets: BudgetsConfig = Field(default_factory=BudgetsConfig)
    traces: TracesConfig = Field(default_factory=TracesConfig)
    signals: SignalsConfig = Field(default_factory=SignalsConfig)
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig,
        description="shadow comparisons and judges (docs/learning.md)",
    )
    embeddings: EmbeddingsConfig = Field(
        default_factory=EmbeddingsConfig, description="the /v1/embeddings passthrough"
    )
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig,
        description="OpenTelemetry tracing over OTLP (router/observability/telemetry.py; "
        "the `otel` extra)",
    )
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig,
        description="live drift gauges: score drift, large share, calibrated threshold",
    )

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
        problems = [
            f"tiers.{i}.{key}: {msg}"
            for i, tier in enumerate(self.tiers)
            for key, msg in tier_problems(tier)
        ]
        if problems:
            raise ConfigError("; ".join(problems))
        check_store_kind(self.budgets.store)
        if self.embeddings.tier is not None and self.embeddings.tier not in {
            t.name for t in self.tiers
        }:
            raise ConfigError(
                f"embeddings.tier: no tier named {self.embeddings.tier!r} (tiers: "
                f"{', '.join(t.name for t in self.tiers)})"
            )
        check_routing(
            self.policies,
            self.default_policy,
            {t.name for t in self.tiers},
            self.teams,
            self.keys,
            self.experiments,
        )
        _check_removed_teams(self)
        team_names = {*self.teams, *(k.team for k in self.keys), self.auth.default_team}
        check_evaluation(
            self.evaluation,
            {t.name for t in self.tiers},
            team_names,
            set(self.policies) or {self.default_policy},
            self.traces.path,
        )
        return self

    def policy_env(self) -> PolicyEnv:
        """What building this config's policies needs besides their params."""
        return PolicyEnv(
            prices={t.name: t.price for t in self.tiers},
            default_policy=self.default_policy,
            model_path=self.classifier.model_path,
        )

    @cached_property
    def tiers_by_name(self) -> Mapping[str, TierConfig]:
        """The tiers by name, in config order. Computed once: a config's tiers never change
        after validation (a reload builds a new config)."""
        return {t.name: t for t in self.tiers}

    def tier(self, name: str) -> TierConfig:
        return self.tiers_by_name[name]  # KeyError(name) when there is none


# Which environment variable set which key: (lower-cased key path) -> variable name.
Overrides = dict[tuple[str, ...], str]


def _override_of(loc: tuple[str, ...], overrides: Overrides) -> str | None:
    """The variable that set the key at `loc` (or a section containing it), if any."""
    for path, name in overrides.items():
        if loc[: len(path)] == path:
            return name
    return None


def _format_validation_error(
    err: ValidationError, source: str, section: str = "", overrides: Overrides | None = None
) -> str:
    """One line per error, each naming its key (under `section` when one section was checked)
    and, when an environment override set that key, the variable rather than the file."""
    lines: list[str] = []
    from_env = 0
    for e in err.errors():
        path = [section, *e["loc"]] if section else list(e["loc"])
        loc = ".".join(str(p) for p in path)
        var = _override_of(tuple(str(p).lower() for p in path), overrides or {})
        where = f" (set by {var})" if var and path else ""
        from_env += bool(where)
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, ConfigError):
            # A cross-section check (policy params, tier kinds) already names its key.
            lines.append(f"  {cause}" if not e["loc"] else f"  {loc}{where}: {cause}")
        else:
            lines.append(f"  {loc or '(top level)'}{where}: {e['msg']}")
    head = (
        f"invalid environment override (on top of {source}):"
        if from_env == len(lines)
        else f"invalid configuration in {source}:"
    )
    return "\n".join([head, *lines])


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


def apply_env_overrides(
    data: dict[str, Any], environ: Mapping[str, str] | None = None
) -> Overrides:
    """Set every ``COST_ROUTER__*`` variable's value in `data`, in place; returns which variable
    set which key. A variable that cannot be applied raises ConfigError naming it."""
    env = os.environ if environ is None else environ
    applied: Overrides = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise ConfigError(f"environment variable {name}: not a YAML value: {problem}") from None
        try:
            _set_path(data, path, value)
        except (IndexError, ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"environment variable {name}: no key {'.'.join(path)} to set "
                f"({type(exc).__name__}: {exc})"
            ) from None
        applied[tuple(path)] = name
    return applied


def section_from_env(
    name: str,
    model: type[Section],
    check: Callable[[Section], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Section:
    """One top-level section (e.g. `budgets`) from its defaults and its ``COST_ROUTER__<NAME>__*``
    overrides alone, for commands run without a config file. Problems raise ConfigError naming
    the key (``budgets.lease_s: ...``), as `config_from_dict` names them; `check` (raising
    ConfigError) adds what the whole config would check about this section."""
    data: dict[str, Any] = {}
    apply_env_overrides(data, environ)
    # Every value here comes from a variable; the source says so, each line names its key.
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
    overrides = apply_env_overrides(merged, environ)
    try:
        return RouterConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source, overrides=overrides)) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error without its `in "<unicode string>"` (the caller names the file)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return str(exc).replace('in "<unicode string>", ', "")
    context = getattr(exc, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (
        f" ({context})" if context else ""
    )


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> RouterConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    return config_from_yaml(text, p, environ)


def config_from_yaml(
    text: str, path: str | Path, environ: Mapping[str, str] | None = None
) -> RouterConfig:
    """The config in `text`, read from `path` (named in errors). A hot reload parses the very
    bytes it saw stay unchanged, never a second read that a writer may have cut."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return config_from_dict(data, source=str(path), environ=environ)


# Editing a config file from a command (`tune --write`, `classifier promote|rollback`). The edited
# document is validated as a whole (environment overrides included, on a copy: their values never
# reach the file) before the file is replaced, and it is replaced atomically, so a proxy watching
# the file (router/proxy/reload.py) never reads half of it. YAML comments are not kept (PyYAML
# does not keep them).


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one step (same folder, then os.replace), keeping its mode."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def edit_config(path: str | Path, edit: Callable[[dict[str, Any]], None]) -> RouterConfig:
    """Apply `edit` to the YAML document at `path`, validate, replace the file atomically; returns
    the validated config. Raises ConfigError naming the key (the file is then unchanged)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    edit(data)
    config = config_from_dict(data, source=str(p))
    write_atomically(p, yaml.safe_dump(data, sort_keys=False).encode())
    return config


# What the simulator replays of a router config (`simulate`, `tune`, `what-if --config`), and the
# threshold `tune --write` sets.


def sim_config_from(config: RouterConfig) -> SimConfig:
    """The sections of a router config that the simulator replays."""
    return SimConfig.from_sections(
        config.tiers,
        config.policies,
        config.default_policy,
        config.classifier,
        config.teams,
        config.budgets,
    )


def simulator_defaults() -> SimConfig:
    """The simulator's defaults with the `COST_ROUTER__*` environment overrides applied (to a
    copy: the module's defaults never change), as they apply to a router config file."""
    doc = defaults_document()
    try:
        apply_env_overrides(doc)
    except (IndexError, ValueError, TypeError) as exc:
        raise ConfigError(f"bad environment override: {exc}") from exc
    return SimConfig.from_document(doc, "the simulator's defaults (with COST_ROUTER__* overrides)")


def write_threshold(
    path: str | Path, policy: str | None, threshold: float, target: tuple[str, float] | None = None
) -> str:
    """Set `policies.<policy>.threshold` in the YAML file, and `tuned_for`
    (simulations.sim_config.set_threshold), for `tune --write`; returns the policy name written.

    The edited document is validated as a whole before the file is replaced atomically
    (router.config.edit_config). YAML comments are not preserved (PyYAML does not keep them).
    """
    p = Path(path)
    written: list[str] = []

    def edit(data: dict[str, Any]) -> None:
        written.append(set_threshold(data, policy, threshold, target, str(p)))

    edit_config(p, edit)  # RouterConfig validation parses every policy's params
    return written[0]
