"""`cost-router classifier promote|rollback` (registered in router/cli.py).

    cost-router classifier promote models/new.onnx --config router.yaml --traces traces/
    cost-router classifier rollback --config router.yaml

The work is router/learning/promotion.py's (the gate, the re-tune, the history, the copy of the
previous model); these commands parse, load the config, call it, print and map its errors to exit
statuses. `--policy NAME` promotes into one policy only (`policies.NAME.model_path`): a canary
that an A/B experiment can compare live with the arm on the current model (`cost-router ab
report`). A running proxy picks the change up on its next reload (file watch or SIGHUP).

Exit status: 0 promoted (or rolled back); 1 refused by the gate, or a rollback the config no
longer matches; 2 bad input. Heavy imports (onnxruntime, the trace loader) happen inside.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import typer

from router.commands.common import fail, load_config_or_exit
from router.config import RouterConfig, edit_config, write_atomically
from router.learning.promotion import (
    ConfigFile,
    PromotionError,
    RoutingSections,
    evaluate,
    promote,
    rollback,
)


def _sections(config: RouterConfig) -> RoutingSections:
    return RoutingSections(config.classifier, config.policies, config.policy_env())


def _config_file(path: Path) -> ConfigFile:
    return ConfigFile(path, partial(edit_config, path), write_atomically)


def _exit(exc: PromotionError, force_hint: str) -> typer.Exit:
    """Print the error (`force_hint` after one that --force overrides); the Exit to raise."""
    if exc.bad_input:
        return fail(str(exc))
    typer.echo(f"error: {exc}{force_hint if exc.forcible else ''}", err=True)
    return typer.Exit(1)


def promote_cmd(
    model: Path = typer.Argument(..., help="the new .onnx model (e.g. from `classifier train`)"),
    config: Path = typer.Option(..., "--config", "-c", help="the router YAML to promote into"),
    traces: list[Path] | None = typer.Option(
        None,
        "--traces",
        "-t",
        help="labelled requests to compare on (a proxy trace folder with labels, CSV, JSONL); "
        "default: the comparison `classifier train` recorded in the model's card",
    ),
    policy: str | None = typer.Option(
        None, "--policy", "-p", help="promote into this policy only (a canary), not the classifier"
    ),
    force: bool = typer.Option(False, "--force", help="promote even if not shown better"),
    rounds: int = typer.Option(1000, "--bootstrap", min=10, help="bootstrap resamples"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed"),
) -> None:
    """Swap in a new model if it beats the current one on labelled traffic (paired bootstrap
    interval of the APGR gain above 0), re-tune thresholds, keep the old model for rollback."""
    router_config = load_config_or_exit(config)
    known = sorted(router_config.policies)
    if policy is not None and policy not in known:
        raise fail(f"--policy {policy}: no such policy in {config} (known: {known})")
    try:
        candidate = evaluate(model, _sections(router_config), policy, traces, rounds, seed)
    except PromotionError as exc:
        raise _exit(exc, "") from None
    for note in candidate.notes:
        typer.echo(note, err=True)
    try:
        done = promote(candidate, _config_file(config), force, say=typer.echo)
    except PromotionError as exc:
        if exc.forcible:
            typer.echo(f"refused: {exc} (--force promotes anyway)", err=True)
            raise typer.Exit(1) from None
        raise _exit(exc, "") from None
    typer.echo(
        f"promoted {done.model} as {done.scope.key} in {config}; previous model kept as "
        f"{done.saved} (`cost-router classifier rollback --config {config}` restores it); a "
        "running proxy picks it up on its next reload"
    )


def rollback_cmd(
    config: Path = typer.Option(..., "--config", "-c", help="the router YAML promoted into"),
    force: bool = typer.Option(
        False, "--force", help="roll back even if the config was edited since the promotion"
    ),
) -> None:
    """Undo the last `classifier promote` into CONFIG: its model and thresholds as before."""
    sections = _sections(load_config_or_exit(config))
    try:
        done = rollback(sections, _config_file(config), force, say=typer.echo)
    except PromotionError as exc:
        raise _exit(exc, "; --force rolls back anyway") from None
    typer.echo(
        f"rolled back {done.key} to {done.restored or 'the shipped model'} in {config}; a "
        "running proxy picks it up on its next reload"
    )
