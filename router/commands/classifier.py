"""`cost-router classifier train|eval|score|bench` (registered by router/cli.py).

`train` is the retrain step of the learning loop (classifiers/retrain.py does the work);
`promote` and `rollback` join the group from router/commands/promote.py.

Heavy imports (scikit-learn, pandas, onnxruntime) happen inside the commands that need them, so
the rest of the CLI starts fast.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np
import typer

from classifiers.dataset import (
    DatasetError,
    RoutingDataset,
    concat,
    load_dataset,
    routellm_data_dir,
)
from classifiers.evaluate import report
from classifiers.labels import known
from classifiers.model_files import ModelFiles, model_file
from router.commands.common import fail
from router.learning.judges.feedback import append_feedback_labels
from trace_format.feedback import FEEDBACK_FILE
from trace_format.labels import labels_path_for

if TYPE_CHECKING:
    from classifiers.inference import DifficultyScorer
    from classifiers.train import TrainConfig

classifier_app = typer.Typer(no_args_is_help=True)

DATA_HELP = "RouteLLM-style CSV files/folders and/or JSONL trace files"


def _load(
    data: list[Path],
    small: str | None,
    large: str | None,
    contaminated: bool,
    labelled_only: bool = False,
) -> RoutingDataset:
    try:
        return load_dataset(
            data, small, large, exclude_contaminated=not contaminated, labelled_only=labelled_only
        )
    except DatasetError as exc:
        raise fail(f"{exc}") from None


# The out-of-fold report's folds by default: 3 fits plus the final one, fitted two at a time on
# two cores (5 folds one at a time, the thorough setting of earlier versions, made
# `--with-default-data` run about 23 minutes on 2 cores, silently).
DEFAULT_FOLDS = 3
# Wall time of one model fit (two-stage fit and source prior), per 1,000 training rows, two fits
# at once on the 2-core development machine: 107 s for 10,651 rows (docs/learning.md; 22 s before
# the source prior's cross-fitting went to 3 folds at tolerance 1e-3).
FIT_SECONDS_PER_1K_ROWS = 10.0


def training_plan(own: RoutingDataset, base: RoutingDataset | None, folds: int, jobs: int) -> str:
    """What `train` is about to do and roughly how long it takes, before it starts."""
    n_own = int(known(own.small, own.large).sum())
    n_base = 0 if base is None else int(known(base.small, base.large).sum())
    rows = n_own + n_base
    fold_rows = n_base + n_own * (folds - 1) // folds if folds else 0
    fit_s = FIT_SECONDS_PER_1K_ROWS * rows / 1000
    fold_s = FIT_SECONDS_PER_1K_ROWS * fold_rows / 1000
    if folds and jobs > 1:  # the folds and the final fit share `jobs` workers
        seconds = -(-(folds + 1) // jobs) * max(fit_s, fold_s)
    else:
        seconds = fit_s + folds * fold_s
    of_base = f" + {n_base:,} of the shipped data" if n_base else ""
    if folds:
        at_once = f", {jobs} at a time" if jobs > 1 else ""
        report = f"{folds}-fold out-of-fold report ({folds} fits of ~{fold_rows:,} rows{at_once})"
        skip = "; --folds 0 skips the report"
    else:
        report, skip = "no out-of-fold report (--folds 0)", ""
    return (
        f"training on {rows:,} labelled rows ({n_own:,} of DATA{of_base}): {report} and the "
        f"final fit; roughly {max(1, round(seconds / 60))} min on an unloaded 2-core machine{skip}"
    )


def default_out() -> Path:
    """Where `train` writes without --out: ./models/model-<UTC time>.onnx, never the package."""
    return Path("models") / f"model-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.onnx"


@classifier_app.command("train")
def train_cmd(
    data: list[Path] = typer.Argument(
        ..., help=f"{DATA_HELP}; a proxy trace folder's labels and feedback are merged in"
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="where to write the .onnx model (default: ./models/model-<time>)"
    ),
    overwrite_shipped: bool = typer.Option(
        False, "--overwrite-shipped", help="allow --out to be the shipped model's path"
    ),
    with_default_data: bool = typer.Option(
        False, "--with-default-data", help="also train on the shipped model's data (never scored)"
    ),
    own_weight: float = typer.Option(
        1.0, "--own-weight", help="weight of a row of DATA against a default-data row's 1"
    ),
    folds: int = typer.Option(
        DEFAULT_FOLDS,
        "--folds",
        help="out-of-fold report on DATA and <model>.oof.jsonl (0: skip; 5: the thorough "
        "report of earlier versions, ~1.5x the time)",
    ),
    jobs: int = typer.Option(
        0,
        "--jobs",
        min=0,
        help="fits at once, in forked workers: the folds and the final fit (0: one per CPU core)",
    ),
    current: Path | None = typer.Option(
        None, "--current", help="model the new one is compared with (default: shipped)"
    ),
    rounds: int = typer.Option(1000, "--bootstrap", min=1, help="bootstrap resamples"),
    small: str | None = typer.Option(None, help="small model's outcome column / trace tier"),
    large: str | None = typer.Option(None, help="large model's outcome column / trace tier"),
    seed: int = typer.Option(0, help="random seed (training is reproducible from it)"),
    margin: float = typer.Option(0.0, help="large must beat small by more than this (graded)"),
    include_contaminated: bool = typer.Option(False, help="keep RouteLLM-contaminated prompts"),
    feedback_labels: bool = typer.Option(
        True,
        "--feedback-labels/--no-feedback-labels",
        help="first write users' feedback beside the traces as labels (judge 'feedback')",
    ),
    report_kind: str | None = typer.Option(
        None,
        "--report",
        help="loso: also report leave-one-source-out APGR per training recipe on DATA "
        "(classifiers/loso.py; one fit per recipe and held-out source)",
    ),
    max_train_rows: int | None = typer.Option(
        None, "--loso-max-train-rows", min=2, help="--report loso: fit on at most this many rows"
    ),
    loso_recipes: list[str] | None = typer.Option(
        None,
        "--loso-recipe",
        help="--report loso: only these recipes (repeat; default: all, classifiers/loso.py)",
    ),
) -> None:
    """Train on routing outcomes (CSV, traces, a proxy trace folder with labels), export ONNX +
    metadata, and compare with the current model out of fold (paired bootstrap)."""
    # scikit-learn, pandas and onnx load for training only (see the module docstring).
    from classifiers.retrain import TrainOptions, train_model
    from classifiers.train import TrainConfig
    from router.commands.progress import phases

    out = out if out is not None else default_out()
    if out.resolve() == model_file(None) and not overwrite_shipped:
        raise fail(f"{out} is the shipped model; pass --overwrite-shipped to replace it")
    if folds == 1 or folds < 0:
        raise fail(f"--folds must be 0 (no report) or at least 2, got {folds}")
    if own_weight <= 0:
        raise fail(f"--own-weight must be > 0, got {own_weight}")
    if current is not None and not current.is_file():
        raise fail(f"--current {current}: no such file")
    if report_kind not in (None, "loso"):
        raise fail(f"--report: expected 'loso', got {report_kind!r}")
    jobs = max(1, min(jobs or os.cpu_count() or 1, folds + 1 if folds else 1))
    options = TrainOptions(
        config=TrainConfig(seed=seed, margin=margin),
        own_weight=own_weight,
        folds=folds,
        rounds=rounds,
        current_model=current,
        jobs=jobs,
    )
    # Phases: loading, each out-of-fold fold, scoring with the current model, the final fit,
    # the export; the fit's own sub-steps only relabel the bar. Piped (no bar), each phase is
    # a line on stderr with the time it took and, from the fits' pace, the time left.
    starts = ("fold ", "loading", "scoring with", "fitting the", "exporting")
    total = 1 + (folds + 1 if folds else 0) + 2
    if feedback_labels:
        _label_feedback(data)
    fits = ("fold ", "fitting the")
    with phases(
        total,
        "loading data",
        lambda m: m.startswith(starts),
        lines=True,
        timed=lambda m: m.startswith(fits),
        timed_total=folds + 1,
    ) as update:
        update("loading data")
        own = _load(data, small, large, include_contaminated, labelled_only=True)
        base = None
        if with_default_data:
            base = _load([routellm_data_dir()], None, None, include_contaminated)
        typer.echo(training_plan(own, base, folds, jobs), err=True)
        if report_kind == "loso":
            from classifiers.loso import RECIPES, holdouts

            unknown = [r for r in loso_recipes or [] if r not in RECIPES]
            if unknown:
                raise fail(
                    f"--loso-recipe: unknown {', '.join(unknown)} (known: {', '.join(RECIPES)})"
                )
            if not holdouts(own if base is None else concat(own, base)):
                raise fail(
                    "--report loso: leave-one-source-out needs 2+ benchmarks, or one "
                    "of 4+ sources, in DATA"
                )
        try:
            report = train_model(own, out, options, base, data, update)
        except ValueError as exc:
            raise fail(f"{exc}") from None
    left_out = ""
    if own.unlabelled or own.without_text:
        left_out = f" ({own.unlabelled} unlabelled and {own.without_text} without text left out)"
    base_note = f" + {report.base_rows} rows of the shipped data" if report.base_rows else ""
    typer.echo(f"trained on {report.labelled} labelled rows{left_out}{base_note}")
    if report.comparison is not None:
        typer.echo("\n".join(report.comparison.lines()))
    for warning in report.warnings:
        typer.echo(warning, err=True)
    files = ModelFiles(out)
    written = [str(files.card), str(files.prompts)]
    if report.oof_file is not None:
        written += [str(report.oof_file), str(files.scores)]
    typer.echo(f"wrote {out} ({report.metadata['onnx_bytes']} bytes), {', '.join(written)}")
    if report_kind == "loso":
        _loso(
            own if base is None else concat(own, base),
            options.config,
            rounds,
            max_train_rows,
            loso_recipes or [],
        )


def _loso(
    dataset: RoutingDataset,
    config: TrainConfig,
    rounds: int,
    max_train_rows: int | None,
    names: list[str],
) -> None:
    # scikit-learn: loaded by the training commands only.
    from classifiers.loso import RECIPES, loso_report
    from router.commands.progress import phases

    recipes = {n: RECIPES[n] for n in RECIPES if not names or n in names}
    try:
        with phases(1, "leave-one-source-out", lambda _m: False) as update:
            loso = loso_report(dataset, config, recipes, rounds, max_train_rows, update)
    except ValueError as exc:
        raise fail(f"--report loso: {exc}") from None
    typer.echo("leave-one-source-out (each held-out source scored by models not trained on it):")
    typer.echo("\n".join(loso.lines()))


def _label_feedback(data: list[Path]) -> None:
    """Each trace folder's feedback file becomes labels in its labels.jsonl (only the scores
    not yet labelled as they stand), so training on users' scores needs no separate step. The
    loader would read the feedback anyway; the labels record that the feedback judge made them."""
    folders = {p if p.is_dir() else p.parent for p in data}
    for folder in sorted(folders):
        if not (folder / FEEDBACK_FILE).is_file():
            continue
        try:
            added = append_feedback_labels(folder / FEEDBACK_FILE)
        except OSError as exc:
            raise fail(f"{folder}: cannot write feedback labels: {exc.strerror}") from None
        if added:
            labels = labels_path_for(folder / FEEDBACK_FILE)
            typer.echo(f"labelled {added} feedback scores in {labels}")


@classifier_app.command("eval")
def eval_cmd(
    data: list[Path] = typer.Argument(..., help=DATA_HELP),
    model: Path | None = typer.Option(None, "--model", "-m", help=".onnx (default: shipped)"),
    small: str | None = typer.Option(None, help="small model's outcome column / trace tier"),
    large: str | None = typer.Option(None, help="large model's outcome column / trace tier"),
    rounds: int = typer.Option(1000, help="bootstrap resamples for the 95% intervals"),
    seed: int = typer.Option(0, help="bootstrap seed"),
    include_contaminated: bool = typer.Option(False, help="keep RouteLLM-contaminated prompts"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """AUC, APGR, CPT(50%), CPT(80%) with bootstrap 95% CIs, per benchmark, vs a random router."""
    from rich.console import Console
    from rich.table import Table

    from router.commands.progress import counter

    scorer = _scorer(model)
    dataset = _load(data, small, large, include_contaminated, labelled_only=True)
    dataset = dataset.subset(known(dataset.small, dataset.large))
    if not len(dataset):
        raise fail(f"no labelled rows in {', '.join(map(str, data))}")
    _in_sample_note(scorer, data, dataset.prompts)
    scores = scorer.score_texts(dataset.prompts)
    groups = {b: dataset.benchmark == b for b in dataset.benchmarks}
    if len(groups) > 1:
        groups["all"] = np.ones(len(dataset), dtype=bool)
    results = {}
    names = list(groups)
    with counter(len(names), f"bootstrap: {names[0]}") as done:
        for i, (name, m) in enumerate(groups.items()):
            results[name] = report(scores[m], dataset.small[m], dataset.large[m], rounds, seed)
            done(f"bootstrap: {names[i + 1]}" if i + 1 < len(names) else "done")
    if as_json:
        out = {
            name: {
                # The interval's own three figures (the JSON this command has always printed).
                router: {
                    k: {"value": v.value, "low": v.low, "high": v.high} for k, v in metrics.items()
                }
                for router, metrics in result.items()
            }
            for name, result in results.items()
        }
        typer.echo(json.dumps(out, indent=2))
        return
    table = Table(title=f"{scorer.path.name} on {len(dataset)} prompts (95% bootstrap CI)")
    table.add_column("data")
    table.add_column("router")
    for metric in ("AUC", "APGR", "CPT(50%)", "CPT(80%)"):
        table.add_column(metric)
    for name, result in results.items():
        for router, metrics in result.items():
            table.add_row(name, router, *(str(v) for v in metrics.values()))
    Console().print(table)


def _in_sample_note(scorer: DifficultyScorer, data: list[Path], prompts: list[str]) -> None:
    """Warn when the prompts overlap the model's training prompts (by content: the model's
    `.prompts` sidecar); models without one fall back to the training paths they recorded."""
    from classifiers.provenance import in_sample_note, read_prompts

    if read_prompts(scorer.path) is not None:
        note = in_sample_note(scorer.path, prompts)
        if note:
            typer.echo(note, err=True)
        return
    trained_on = [Path(p).resolve() for p in scorer.metadata.get("data", [])]
    given = [p.resolve() for p in data]
    if any(g == t or t in g.parents for g in given for t in trained_on):
        typer.echo(
            "note: the model was trained on this data, so these figures are in-sample; "
            "benchmarks/classifier_quality.py gives cross-validated ones.",
            err=True,
        )


def _scorer(model: Path | None) -> DifficultyScorer:
    # onnxruntime loads here, for the commands that score, not for every CLI start.
    from classifiers.inference import DifficultyScorer, ModelLoadError

    try:
        return DifficultyScorer.load(model)
    except ModelLoadError as exc:
        raise fail(f"{exc}") from None


def _score_stream(
    scorer: DifficultyScorer, source: TextIO, sink: TextIO, context_turns: int
) -> int:
    count = 0
    for lineno, line in enumerate(source, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise fail(f"line {lineno}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not (
            isinstance(record.get("prompt"), str) or isinstance(record.get("messages"), list)
        ):
            raise fail(f"line {lineno}: expected an object with a 'prompt' string or 'messages'")
        record["score"] = scorer.score_request(record, context_turns)
        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        count += 1
    return count


@classifier_app.command("score")
def score_cmd(
    path: Path | None = typer.Argument(None, help="JSONL file (default: stdin)"),
    model: Path | None = typer.Option(None, "--model", "-m", help=".onnx (default: shipped)"),
    context_turns: int = typer.Option(2, help="earlier turns scored with the last user turn"),
) -> None:
    """Add a `score` to each JSONL line ({"prompt": ...} or {"messages": [...]}), in order."""
    scorer = _scorer(model)
    if path is None:
        _score_stream(scorer, sys.stdin, sys.stdout, context_turns)
        return
    try:
        with path.open(encoding="utf-8", errors="replace") as source:
            _score_stream(scorer, source, sys.stdout, context_turns)
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror}") from None


@classifier_app.command("bench")
def bench_cmd(
    data: Path = typer.Option(
        routellm_data_dir(), "--data", help="prompts to time (CSV folder/file)"
    ),
    model: Path | None = typer.Option(None, "--model", "-m", help=".onnx (default: shipped)"),
    queries: int = typer.Option(2000, help="single-query calls to time"),
    batch: int = typer.Option(4000, help="prompts in the batch run"),
) -> None:
    """Latency of one query at a time (p50/p99), batch throughput, model size, RSS added by load."""
    from classifiers.bench import run_bench  # onnxruntime: loaded by this command only

    try:
        figures = run_bench(data, model, queries, batch)
    except (OSError, ValueError) as exc:
        raise fail(f"{exc}") from None
    for key, value in figures.items():
        typer.echo(f"{key}: {value}")
