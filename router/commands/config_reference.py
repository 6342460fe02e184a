"""`cost-router config reference`: the configuration reference page, generated from the pydantic
models (`RouterConfig` and the section models each area owns), so it cannot drift from them.

Every key with its type, default, allowed range and description; each policy type's params from
policies/registry.py's SPECS; each section's example from one example config that is validated
while the page is generated. Regenerate docs/configuration.md with

    .venv/bin/cost-router config reference --out docs/configuration.md

(tests/router/commands/test_config_reference.py fails while the page is stale).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from backends.registry import BACKENDS
from policies.registry import SPECS
from router.config import ENV_PREFIX, RouterConfig, config_from_dict
from trace_format.config_base import ConfigError

DOC_PAGE = Path("docs/configuration.md")
COMMAND = "cost-router config reference --out docs/configuration.md"

# One config that uses every section; validated (without environment overrides) each time the
# page is generated, so an example that stops being valid fails the generation, not a reader.
EXAMPLE: dict[str, Any] = {
    "server": {"host": "0.0.0.0", "port": 8080},
    "classifier": {"model_path": "models/model-20260101T000000Z.onnx", "context_turns": 2},
    "tiers": [
        {
            "name": "small",
            "base_url": "http://gpu-node-1:8001/v1",
            "model": "Qwen/Qwen2.5-7B-Instruct-AWQ",
            "price": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
            "max_inflight": 256,
            "fallback": ["large"],
        },
        {
            "name": "large",
            "base_url": "http://gpu-node-1:8002/v1",
            "model": "meta-llama/Llama-3.3-70B-Instruct",
            "api_key_env": "LARGE_API_KEY",
            "price": {"input_per_mtok": 10.0, "output_per_mtok": 30.0},
            "timeout_s": 120,
            "max_inflight": 128,
            "fallback": ["small"],
            "launch": {
                "engine": "vllm",
                "model": "meta-llama/Llama-3.3-70B-Instruct",
                "port": 8002,
                "tensor_parallel_size": 4,
                "speculative": {
                    "method": "ngram",
                    "num_speculative_tokens": 5,
                    "prompt_lookup_min": 2,
                    "prompt_lookup_max": 4,
                },
            },
        },
    ],
    "default_policy": "balanced",
    "policies": {
        "balanced": {
            "type": "threshold",
            "threshold": 0.55,
            "load_shed": {"max_waiting": 8, "margin": 0.1},
        },
        "everything-large": {"type": "fixed", "tier": "large"},
    },
    "experiments": [
        {
            "name": "routing-ab",
            "unit": "user",
            "arms": {
                "control": {"policy": "everything-large", "weight": 1},
                "treatment": {"policy": "balanced", "weight": 1},
            },
        },
    ],
    "teams": {"search": {"budget": {"limit_usd": 500, "period": "monthly"}}},
    "keys": [{"key_sha256": "0" * 64, "team": "search", "name": "search-prod"}],
    "auth": {"required": True},
    "budgets": {"store": "redis", "redis_url": "redis://127.0.0.1:6379/0"},
    "traces": {"path": "traces/requests.jsonl", "include_prompt": False},
    "signals": {"enabled": True, "interval_s": 2.0},
}

INTRO = f"""# Configuration reference

<!-- Generated from the pydantic models by `{COMMAND}`. Do not edit by hand:
     tests/router/commands/test_config_reference.py fails when this page is stale. -->

`cost-router serve --config router.yaml` reads one YAML file; `cost-router config check
router.yaml` validates it and names the offending key. Unknown keys are errors (typos are
caught). Every key can also be set from the environment: `{ENV_PREFIX}` then the path with `__`
between keys, e.g. `{ENV_PREFIX}SERVER__PORT=9000`, `{ENV_PREFIX}TIERS__0__BASE_URL=...`; values
are parsed as YAML scalars (`true`, `8`, `0.5`). Without `--config`, `cost-router serve` runs the
embedded demo (router/server/demo.py) and the simulator uses the same defaults.

Keys are written as paths: `tiers[].price.input_per_mtok` is a key of each list item,
`teams.<name>.budget` a key under a name you choose. *required* means the key has no default.
"""

# Hand-written guidance for keys whose use the models cannot tell; keyed by section.
GUIDES: dict[str, str] = {
    "classifier": """### Using a model you trained

`cost-router classifier train DATA --out models/mine.onnx` writes `models/mine.onnx` with its
metadata `models/mine.json` (the training data, the metrics and `default_threshold`, the median
training score) and `models/mine.prompts` next to it; `cost-router classifier eval DATA --model
models/mine.onnx` measures it. To route with it, point `classifier.model_path` at the `.onnx` file
(a relative path is read from the proxy's working directory) and keep the `.json` beside it:

```yaml
classifier:
  model_path: models/mine.onnx
```

`cost-router config check` does not load the model; `cost-router serve` does at startup and
exits naming the file if it is missing or not a model of this format. A policy that gives no
`threshold` uses the model's `default_threshold` (else 0.5), so a new model's scores keep about
the same share of traffic going large. The simulator scores with the same key (`cost-router
simulate --config router.yaml`), so replay a trace before switching. A hot reload (the file
changed, or SIGHUP) loads a new `model_path`, or a model file replaced at the same path, off the
event loop, and swaps it in with the policies; requests in flight finish on the model they started
with. `cost-router classifier promote` does the switch behind a quality gate (docs/learning.md). A
policy may score with its own model (`policies.<name>.model_path`, e.g. a candidate on one arm of
an A/B experiment). Leave `model_path` unset (`null`) for the shipped model (classifiers/default,
see its MODEL_CARD.md).
""",
}


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    allowed: str
    description: str


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


SCALARS = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    datetime: "date-time (ISO 8601)",
    type(None): "null",
}


def type_name(tp: Any) -> str:
    """A reader's name for an annotation: `integer`, `string | null`, `list of string`."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return type_name(args[0])
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if _is_model(tp):
        return "mapping (keys below)"
    return SCALARS.get(tp, getattr(tp, "__name__", str(tp)))


def _submodels(tp: Any) -> Iterator[tuple[type[BaseModel], str]]:
    """Models nested in an annotation, with the path text that leads into them."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        yield from _submodels(args[0])
    elif origin in (Union, types.UnionType):
        for a in args:
            yield from _submodels(a)
    elif origin is list:
        yield from ((m, "[]" + sep) for m, sep in _submodels(args[0]))
    elif origin is dict:
        yield from ((m, ".<name>" + sep) for m, sep in _submodels(args[1]))
    elif _is_model(tp):
        yield tp, "."


def _yaml(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000).strip()
    return text.removesuffix("...").strip()


def default_text(f: FieldInfo) -> str:
    if f.default_factory is not None:
        value = f.default_factory()  # type: ignore[call-arg]
        return "" if isinstance(value, BaseModel) else f"`{_yaml(value)}`"
    if f.default is PydanticUndefined:
        return "*required*"
    return f"`{_yaml(f.default)}`"


CONSTRAINTS = (
    ("ge", ">= {}"),
    ("gt", "> {}"),
    ("le", "<= {}"),
    ("lt", "< {}"),
    ("min_length", "length >= {}"),
    ("max_length", "length <= {}"),
    ("pattern", "matches `{}`"),
)


def allowed_text(f: FieldInfo) -> str:
    parts = []
    for meta in f.metadata:
        for attr, fmt in CONSTRAINTS:
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(fmt.format(value))
    return ", ".join(parts)


def model_rows(model: type[BaseModel], prefix: str = "", skip: tuple[str, ...] = ()) -> list[Row]:
    """One row per key of `model` and of the models nested in it, depth first."""
    rows = []
    for name, f in model.model_fields.items():
        if name in skip:
            continue
        key = prefix + name
        rows.append(
            Row(key, type_name(f.annotation), default_text(f), allowed_text(f), f.description or "")
        )
        for sub, sep in _submodels(f.annotation):
            rows += model_rows(sub, key + sep)
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(rows: list[Row]) -> str:
    lines = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    lines += [
        f"| `{_cell(r.key)}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.allowed)} | "
        f"{_cell(r.description)} |"
        for r in rows
    ]
    return "\n".join(lines)


def _doc(model: type[BaseModel]) -> str:
    # Only a docstring the model itself defines (not BaseModel's), first paragraph.
    doc = model.__dict__.get("__doc__") or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _example(section: str) -> str:
    return "```yaml\n" + yaml.safe_dump({section: EXAMPLE[section]}, sort_keys=False) + "```"


def _policy_types() -> str:
    out = [
        "### Policy types",
        "",
        "`policies.<name>.type` picks one of these (policies/registry.py); the other keys of "
        "the entry are that type's params. Unknown params are errors.",
    ]
    for name, spec in SPECS.items():
        out += ["", f"#### `type: {name}`", ""]
        if doc := _doc(spec.params):
            out += [doc, ""]
        out.append(table(model_rows(spec.params, "policies.<name>.", skip=("type",))))
    return "\n".join(out)


def _tier_kinds() -> str:
    kinds = ", ".join(
        f"`{name}`"
        + (
            f" (needs {', '.join(f'`{k}`' for k in kind.required_keys)})"
            if kind.required_keys
            else ""
        )
        for name, kind in BACKENDS.items()
    )
    return f"`tiers[].kind` is one of {kinds} (backends/registry.py)."


def reference_markdown() -> str:
    """The whole page; raises ConfigError if the example no longer validates."""
    config_from_dict(EXAMPLE, source="the reference page's example", environ={})
    parts = [INTRO]
    top_level = []
    for name, f in RouterConfig.model_fields.items():
        nested = list(_submodels(f.annotation))
        if not nested:
            top_level.append(
                Row(
                    name,
                    type_name(f.annotation),
                    default_text(f),
                    allowed_text(f),
                    f.description or "",
                )
            )
            continue
        model, sep = nested[0]
        section = [f"## `{name}`", ""]
        if doc := _doc(model):
            section += [doc, ""]
        if name == "tiers":
            section += [_tier_kinds(), ""]
        head = Row(
            name, type_name(f.annotation), default_text(f), allowed_text(f), f.description or ""
        )
        section += [table([head, *model_rows(model, name + sep)]), ""]
        if name == "policies":
            section += [_policy_types(), ""]
        if name in GUIDES:
            section += [GUIDES[name], ""]
        if name in EXAMPLE:
            section += ["Example:", "", _example(name), ""]
        parts.append("\n".join(section))
    parts.insert(1, "## Top-level keys\n\n" + table(top_level) + "\n")
    parts.append(
        "## A whole example\n\n```yaml\n" + yaml.safe_dump(EXAMPLE, sort_keys=False) + "```\n"
    )
    return "\n".join(parts).rstrip() + "\n"


def config_reference_cmd(
    out: Path | None = typer.Option(
        None, "--out", "-o", help=f"write the page here (the docs' page: {DOC_PAGE})"
    ),
) -> None:
    """Print (or write) the configuration reference generated from the config models."""
    try:
        text = reference_markdown()
    except ConfigError as exc:  # the page's example no longer fits the models: fix EXAMPLE
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if out is None:
        typer.echo(text, nl=False)
        return
    out.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {out}")


def register_config_reference(config_app: typer.Typer) -> None:
    """Adds `reference` to the `cost-router config` group."""
    config_app.command("reference")(config_reference_cmd)
