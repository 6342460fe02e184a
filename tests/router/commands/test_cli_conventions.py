"""One command line convention everywhere (README "Command line conventions"): flags are shown as
flags, the router config is `-c/--config` in every command, bad input exits 2."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from router.cli import app


# typer builds its commands on its own copy of click: groups are known by their sub-commands.
def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if hasattr(group, "commands"):
        for name, sub in group.commands.items():
            yield from commands(sub, (*path, name))
    else:
        yield path


def command_of(path: tuple[str, ...]) -> Any:
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


ALL = sorted(commands(typer.main.get_command(app)))


def test_every_command_is_checked() -> None:
    assert ("serve",) in ALL and ("ab", "assign") in ALL and ("keys", "create") in ALL


@pytest.mark.parametrize("path", ALL, ids=" ".join)
def test_flags_show_as_flags_and_the_config_is_dash_c(path: tuple[str, ...]) -> None:
    cmd = command_of(path)
    for param in cmd.params:
        if param.name == "config":
            assert param.param_type_name == "option", f"{path}: the config must be -c/--config"
            assert {"-c", "--config"} <= set(param.opts), f"{path}: {param.opts}"
    res = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output


def test_a_flag_given_a_value_is_a_usage_error_exit_2() -> None:
    res = CliRunner().invoke(app, ["simulate", "-t", "x.jsonl", "--budgets", "true"])
    assert res.exit_code == 2 and "unexpected extra argument" in res.output
