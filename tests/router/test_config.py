"""router.config: composing the sections, environment overrides, and `cost-router config check`."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from router.cli import app as cli
from router.config import config_from_dict, load_config
from trace_format.config_base import ConfigError

BASE = {
    "server": {"port": 8080},
    "tiers": [
        {
            "name": "small",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "s",
            "price": {"input_per_mtok": 1, "output_per_mtok": 1},
        },
        {
            "name": "large",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "l",
            "price": {"input_per_mtok": 10, "output_per_mtok": 30},
        },
    ],
}


def test_env_overrides_apply_to_the_config_not_to_the_callers_data() -> None:
    """Bug 1: overrides were set in place in the caller's nested dicts (a shallow copy), so
    `tune --write` saved environment values into the user's YAML."""
    data = copy.deepcopy(BASE)
    env = {"COST_ROUTER__SERVER__PORT": "9999", "COST_ROUTER__TIERS__0__BASE_URL": "http://x/v1"}
    cfg = config_from_dict(data, environ=env)
    assert cfg.server.port == 9999 and cfg.tiers[0].base_url == "http://x/v1"
    assert data == BASE  # untouched, nested levels included


def test_load_config_applies_env_and_leaves_the_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(BASE))
    before = path.read_text()
    cfg = load_config(path, environ={"COST_ROUTER__SERVER__PORT": "9000"})
    assert cfg.server.port == 9000
    assert path.read_text() == before


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"kind": "carrier-pigeon"}, "tiers.0.kind"),
        ({"base_url": None}, "tiers.0.base_url"),
        ({"price": {"input_per_mtok": -1, "output_per_mtok": 1}}, "tiers.0.price"),
    ],
)
def test_tier_problems_name_the_key(change: dict[str, object], key: str) -> None:
    data = copy.deepcopy(BASE)
    data["tiers"][0].update(change)  # type: ignore[index]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict(data, environ={})


def test_unknown_policy_type_is_rejected_naming_the_key() -> None:
    data = {**copy.deepcopy(BASE), "policies": {"p": {"type": "astrology"}}, "default_policy": "p"}
    with pytest.raises(ConfigError, match=r"policies\.p\.type"):
        config_from_dict(data, environ={})


def test_config_check_ok_and_bad_input_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(BASE))
    ok = CliRunner().invoke(cli, ["config", "check", str(good)])
    assert ok.exit_code == 0 and "OK (2 tiers" in ok.output

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**BASE, "server": {"port": "not-a-port"}}))
    res = CliRunner().invoke(cli, ["config", "check", str(bad)])
    assert res.exit_code == 2
    assert str(bad) in res.output and "server.port" in res.output
    assert "Traceback" not in res.output


def test_broken_yaml_names_the_file_and_line_not_a_unicode_string(tmp_path: Path) -> None:
    bad = tmp_path / "router.yaml"
    bad.write_text("tiers:\n  - name: a\n    base_url: [oops\nserver: {port: 1}\n")
    res = CliRunner().invoke(cli, ["config", "check", str(bad)])
    assert res.exit_code == 2
    assert "<unicode string>" not in res.output
    assert f"{bad} is not valid YAML: line 4, column 7" in res.output


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"COST_ROUTER__SERVER__PORT": "abc"},
            "server.port (set by COST_ROUTER__SERVER__PORT): Input should be a valid integer",
        ),
        ({"COST_ROUTER__SERVER__PROT": "1"}, "server.prot (set by COST_ROUTER__SERVER__PROT)"),
        (
            {"COST_ROUTER__SERVER__PORT": "["},
            "environment variable COST_ROUTER__SERVER__PORT: not a YAML value",
        ),
        (
            {"COST_ROUTER__TIERS__7__NAME": "x"},
            "environment variable COST_ROUTER__TIERS__7__NAME: no key tiers.7.name to set",
        ),
    ],
)
def test_a_bad_environment_override_names_the_variable_not_the_file(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ=env)
    assert expected in str(err.value)
    assert f"invalid configuration in {path}" not in str(err.value)  # the file is fine


def test_a_file_error_next_to_an_override_still_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({**BASE, "server": {"port": 0}}))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"COST_ROUTER__SERVER__HOST": "1"})
    message = str(err.value)
    assert f"invalid configuration in {path}" in message
    assert "server.host (set by COST_ROUTER__SERVER__HOST)" in message
    assert "  server.port: Input should be greater than or equal to 1" in message


# Names the config refuses (policies/names.py), and the refusal's words for each: the reserved
# shadow scope, NUL, a brace that would split the Redis Cluster hash tag, an unbounded name.
BAD_NAMES = [
    ("__shadow__", "reserved for internal scopes"),
    ("a\x00b", "'a\\x00b': must start with a letter or digit"),
    ("x}y{z", "'x}y{z': must start with a letter or digit"),
    ("t" * 10_000, "(10000 characters): must be at most 128 characters"),
]


def _config_with(section: dict[str, object]) -> dict[str, object]:
    return {**copy.deepcopy(BASE), **section}


@pytest.mark.parametrize(("name", "words"), BAD_NAMES)
@pytest.mark.parametrize(
    ("where", "key"),
    [
        (lambda n: {"teams": {n: {}}}, "teams"),
        (lambda n: {"keys": [{"key_sha256": "0" * 64, "team": n}]}, "keys.0.team"),
        (lambda n: {"keys": [{"key_sha256": "0" * 64, "team": "ok", "user": n}]}, "keys.0.user"),
        (lambda n: {"keys": [{"key_sha256": "0" * 64, "team": "ok", "name": n}]}, "keys.0.name"),
        (lambda n: {"auth": {"default_team": n}}, "auth.default_team"),
    ],
)
def test_a_bad_team_user_or_key_name_is_refused_naming_key_and_file(
    tmp_path: Path, name: str, words: str, where: Callable[[str], dict[str, object]], key: str
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_config_with(where(name))), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(path, environ={})
    message = str(refused.value)
    assert str(path) in message and f"  {key}: " in message, message
    assert words in message
    # Shown escaped and cut: never a raw NUL or 10,000 characters in an error line.
    assert "\x00" not in message and len(message) < 500


def test_names_in_use_still_load() -> None:
    cfg = config_from_dict(
        _config_with(
            {
                "teams": {"search": {}, "team-1.eu": {}, "org:ml": {}},
                "keys": [
                    {"key_sha256": "0" * 64, "team": "search", "user": "ann+ci@example.com"},
                ],
                "auth": {"default_team": "search"},
            }
        ),
        environ={},
    )
    assert set(cfg.teams) == {"search", "team-1.eu", "org:ml"}
