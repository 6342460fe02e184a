"""`cost-router tune|simulate|what-if ...` (registered by router/cli.py)."""

from __future__ import annotations

import typer


def register_simulation_commands(app: typer.Typer) -> None:
    """Adds the simulator's top-level commands to the root app."""
