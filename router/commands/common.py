"""What every command shares: load a config file, or exit 2 with the error naming the key."""

from __future__ import annotations

from pathlib import Path

import typer

from router.config import RouterConfig, load_config
from trace_format.config_base import ConfigError

# Exit status of a command that was given bad input (config, data, arguments): 2, as argparse and
# typer use for usage errors; 1 is left for "ran, and the answer is no" (e.g. a check that failed).
EXIT_BAD_INPUT = 2


def fail(message: str) -> typer.Exit:
    """Print `error: <message>` to stderr, one line per problem; the Exit to raise for bad input."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def load_config_or_exit(path: str | Path) -> RouterConfig:
    """The config at `path`; on any problem, print it (naming the key and file) and exit 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        raise fail(str(exc)) from None
