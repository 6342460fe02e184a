"""`cost-router grades import` (registered by router/cli.py): offline grades become labels
beside the traces (router/learning/grades.py does the work; docs/simulator.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from router.commands.common import fail, load_config_or_exit

grades_app = typer.Typer(no_args_is_help=True)


@grades_app.command("import")
def import_cmd(
    grades: Path = typer.Argument(
        ...,
        help="JSONL, one grade a line: {request_id, outcomes: {tier: quality in [0, 1]}} or "
        "{request_id, score} (the quality of the answer the tier that served it gave)",
    ),
    traces: Path = typer.Option(
        ..., "--traces", "-t", help="the trace folder (or file) that holds the graded requests"
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="router YAML: a grade of a tier it does not have is an error"
    ),
) -> None:
    """Import offline grades as labels that tune, simulate, what-if and training read."""
    from router.learning.grades import IMPORT_JUDGE, GradesError, import_grades

    tiers = None if config is None else [t.name for t in load_config_or_exit(config).tiers]
    try:
        result = import_grades(grades, traces, tiers)
    except GradesError as exc:
        raise fail(str(exc)) from None
    tiers = ", ".join(f"{t} {n}" for t, n in result.per_tier.items())
    scored = f" ({result.from_scores} from a score, on the tier that answered)"
    typer.echo(
        f"imported {result.grades} grades{scored if result.from_scores else ''} as judge "
        f"{IMPORT_JUDGE!r} version {result.judge_version}: {tiers}"
    )
    typer.echo("into " + ", ".join(str(p) for p in result.label_files))
    if result.unseen_tiers and config is None:
        typer.echo(
            f"note: no request in the traces was sent to {', '.join(result.unseen_tiers)}; "
            "if that is not a tier of the config, its grades are never read (--config checks)"
        )
    if result.multi_tier and result.tiers_equal == result.multi_tier:
        typer.echo(
            f"note: on all {result.multi_tier} grades of two tiers or more, every tier has the "
            "same quality: these labels cannot tell the tiers apart, so `tune` cannot pick a "
            "threshold from them"
        )
