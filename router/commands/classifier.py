"""`cost-router classifier train|eval|score|bench` (registered by router/cli.py).

Heavy imports (scikit-learn, pandas, onnxruntime) happen inside the commands that need them, so
the rest of the CLI starts fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np
import typer

from classifiers.config import DEFAULT_MODEL
from classifiers.dataset import DatasetError, RoutingDataset, load_dataset, routellm_data_dir
from classifiers.evaluate import report
from classifiers.labels import known
from router.commands.common import fail

if TYPE_CHECKING:
    from classifiers.inference import DifficultyScorer

classifier_app = typer.Typer(no_args_is_help=True)

DATA_HELP = "RouteLLM-style CSV files/folders and/or JSONL trace files"


def _load(
    data: list[Path], small: str | None, large: str | None, contaminated: bool
) -> RoutingDataset:
    try:
        return load_dataset(data, small, large, exclude_contaminated=not contaminated)
    except DatasetError as exc:
        raise fail(f"{exc}") from None


@classifier_app.command("train")
def train_cmd(
    data: list[Path] = typer.Argument(..., help=DATA_HELP),
    out: Path = typer.Option(DEFAULT_MODEL, "--out", "-o", help="where to write the .onnx model"),
    small: str | None = typer.Option(None, help="small model's outcome column / trace tier"),
    large: str | None = typer.Option(None, help="large model's outcome column / trace tier"),
    seed: int = typer.Option(0, help="random seed (training is reproducible from it)"),
    margin: float = typer.Option(0.0, help="large must beat small by more than this (graded)"),
    include_contaminated: bool = typer.Option(False, help="keep RouteLLM-contaminated prompts"),
) -> None:
    """Train on routing outcomes, export ONNX + metadata JSON (progress bar on stderr)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    # scikit-learn, pandas and onnx load for training only (see the module docstring).
    from classifiers.export import export, metadata_for
    from classifiers.train import TrainConfig, fit

    config = TrainConfig(seed=seed, margin=margin)
    steps = ["load", "features", "fit", "export"]
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=False,
    ) as progress:
        task = progress.add_task("loading data", total=len(steps))
        dataset = _load(data, small, large, include_contaminated)
        progress.update(task, advance=1, description=f"featurizing {len(dataset)} prompts")

        def on_step(name: str) -> None:
            if name == "fit":
                progress.update(task, advance=1, description="fitting the model")
            elif name == "done":
                progress.update(task, advance=1, description="exporting to ONNX")

        try:
            pipeline = fit(dataset, config, on_step)
        except ValueError as exc:
            raise fail(f"{exc}") from None
        meta = export(pipeline, out, metadata_for(dataset, config, pipeline, data))
        progress.update(task, advance=1, description="done")
    typer.echo(f"wrote {out} ({meta['onnx_bytes']} bytes) and {out.with_suffix('.json')}")


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

    scorer = _scorer(model)
    dataset = _load(data, small, large, include_contaminated)
    dataset = dataset.subset(known(dataset.small, dataset.large))
    scores = scorer.score_texts(dataset.prompts)
    groups = {b: dataset.benchmark == b for b in dataset.benchmarks}
    if len(groups) > 1:
        groups["all"] = np.ones(len(dataset), dtype=bool)
    results = {
        name: report(scores[m], dataset.small[m], dataset.large[m], rounds, seed)
        for name, m in groups.items()
    }
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
            raise fail(
                f"line {lineno}: expected an object with a 'prompt' string or 'messages'"
            )
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
