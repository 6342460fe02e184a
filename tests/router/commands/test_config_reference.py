"""docs/configuration.md is generated from the config models and must not drift from them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from router.cli import app
from router.commands.config_reference import COMMAND, reference_markdown
from router.config import RouterConfig

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "configuration.md"
runner = CliRunner()


def test_the_page_is_current() -> None:
    assert PAGE.read_text(encoding="utf-8") == reference_markdown(), (
        f"docs/configuration.md is stale: regenerate it with `.venv/bin/{COMMAND}`"
    )


def _schema_keys(schema: dict, node: dict, prefix: str) -> set[str]:
    """Every key path of the JSON schema pydantic derives (independently of the page's walk)."""
    keys: set[str] = set()
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    for option in node.get("anyOf", []):
        keys |= _schema_keys(schema, option, prefix)
    if node.get("type") == "array" and "items" in node:
        keys |= _schema_keys(schema, node["items"], prefix + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        keys |= _schema_keys(schema, node["additionalProperties"], prefix + ".<name>")
    for name, sub in node.get("properties", {}).items():
        key = f"{prefix}.{name}" if prefix else name
        keys.add(key)
        keys |= _schema_keys(schema, sub, key)
    return keys


def test_every_key_of_the_models_has_a_row() -> None:
    schema = RouterConfig.model_json_schema()
    keys = _schema_keys(schema, schema, "")
    assert {
        "server.port",
        "tiers[].price.input_per_mtok",
        "teams.<name>.budget.limit_usd",
        "classifier.model_path",
    } <= keys
    rows = set(re.findall(r"^\| `([^`]+)` \|", PAGE.read_text(encoding="utf-8"), re.M))
    assert not keys - rows, f"keys without a row: {sorted(keys - rows)}"


def test_rows_give_type_default_and_range() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert "| `server.port` | integer | `8080` | >= 1, <= 65535 |" in page
    assert "| `tiers[].model` | string | *required* |" in page
    assert "| `classifier.model_path` | string \\| null | `null` |" in page
    assert "#### `type: threshold`" in page  # each policy type's params, from the registry
    assert "| `policies.<name>.threshold` | number \\| null | `null` | >= 0, <= 1 |" in page


def test_the_pages_example_is_a_valid_config(tmp_path: Path) -> None:
    page = PAGE.read_text(encoding="utf-8")
    whole = page.split("## A whole example", 1)[1]
    example = re.search(r"```yaml\n(.*?)```", whole, re.S)
    assert example is not None
    config_file = tmp_path / "router.yaml"
    config_file.write_text(example.group(1), encoding="utf-8")
    res = runner.invoke(app, ["config", "check", str(config_file)])
    assert res.exit_code == 0, res.output
    assert "tiers" in yaml.safe_load(example.group(1))


def test_the_command_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    res = runner.invoke(app, ["config", "reference", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text(encoding="utf-8") == reference_markdown()
    printed = runner.invoke(app, ["config", "reference"])
    assert printed.exit_code == 0 and printed.stdout == reference_markdown()


def test_the_page_tells_how_to_route_with_a_trained_model() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert "### Using a model you trained" in page
    assert "classifier train" in page and "model_path: models/mine.onnx" in page
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/configuration.md" in readme
