"""`cost-router distill export|train|card` (registered by router/cli.py): distillation as a
lever (docs/levers.md, "Distillation"). The work is router/learning/distill/'s; this layer
parses options and prints. Exit status: 0 done; 2 bad input, one `error:` line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from router.commands.common import fail, load_config_or_exit
from router.commands.progress import counter

if TYPE_CHECKING:  # the command imports its library lazily: `--help` loads no model runtime
    from policies.workflow import ClusterSelect

distill_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


def _tags(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise fail(f"--tag {v}: expected KEY=VALUE (a request metadata tag)")
        out[key] = value
    return out


def _clusters(path: Path | None, ids: list[int]) -> ClusterSelect | None:
    if path is None and not ids:
        return None
    if path is None or not ids:
        raise fail("--clusters FILE and --cluster N go together (a workflow's prompt clusters)")
    from policies.workflow import cluster_select
    from trace_format.config_base import ConfigError

    try:
        return cluster_select(str(path), ids, "--cluster")
    except ConfigError as exc:
        raise fail(str(exc)) from None


@distill_app.command("export")
def export_cmd(
    traces: list[Path] = typer.Option(
        ..., "--traces", "-t", help="trace folders (requests, shadow.jsonl, labels, feedback)"
    ),
    teacher: str = typer.Option(..., "--teacher", help="the tier whose answers are taught"),
    out: Path = typer.Option(Path("distill-set"), "--out", "-o", help="folder written"),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="router YAML: only teams of its evaluation.store_content_teams are read",
    ),
    team: list[str] = typer.Option([], "--team", help="workflow: only these teams"),
    policy: list[str] = typer.Option([], "--policy", help="workflow: only these policies"),
    tag: list[str] = typer.Option([], "--tag", help="workflow: metadata KEY=VALUE (repeatable)"),
    heldout: float = typer.Option(0.2, "--heldout", help="share of conversations held out"),
    seed: int = typer.Option(0, "--seed", help="the split"),
    min_teacher_score: float = typer.Option(
        0.5, "--min-teacher-score", help="drop teacher answers a judge scored below this"
    ),
    min_feedback: float = typer.Option(
        0.5, "--min-feedback", help="drop answers whose mean user feedback is below this"
    ),
    clusters: Path | None = typer.Option(
        None, "--clusters", help="workflow: a cluster model `distill clusters` wrote"
    ),
    cluster: list[int] = typer.Option(
        [], "--cluster", help="workflow: only prompts of this cluster of --clusters (repeatable)"
    ),
) -> None:
    """A distillation set: prompts and the teacher's answers, filtered, split by conversation."""
    from router.learning.distill.export import ExportError, ExportOptions, Selector, export

    content_teams = None
    if config is not None:
        content_teams = load_config_or_exit(config).evaluation.store_content_teams
    options = ExportOptions(
        teacher=teacher,
        selector=Selector(tuple(team), tuple(policy), _tags(tag), _clusters(clusters, cluster)),
        heldout_share=heldout,
        seed=seed,
        min_teacher_score=min_teacher_score,
        min_feedback=min_feedback,
        content_teams=content_teams,
    )
    try:
        result = export(traces, out, options)
    except ExportError as exc:
        raise fail(str(exc)) from None
    c = result.card["counts"]
    dropped = ", ".join(f"{k} {v}" for k, v in c["dropped"].items() if v) or "none"
    typer.echo(
        f"{c['teacher_answers_read']} teacher answers read, {c['kept']} kept (dropped: "
        f"{dropped}); train {c['train_rows']} rows in {c['train_conversations']} conversations, "
        f"held out {c['heldout_rows']} in {c['heldout_conversations']}; traces sha256 "
        f"{result.card['traces_sha256'][:16]}; wrote {out}"
    )


@distill_app.command("clusters")
def clusters_cmd(
    traces: list[Path] = typer.Option(
        ..., "--traces", "-t", help="trace folders (requests, shadow.jsonl, labels, feedback)"
    ),
    teacher: str = typer.Option(..., "--teacher", help="the tier whose answers are taught"),
    k: int = typer.Option(8, "--k", help="how many clusters"),
    out: Path = typer.Option(Path("clusters.onnx"), "--out", "-o", help="the model written"),
    team: list[str] = typer.Option([], "--team", help="only these teams' rows"),
    policy: list[str] = typer.Option([], "--policy", help="only these policies' rows"),
    tag: list[str] = typer.Option([], "--tag", help="only rows with metadata KEY=VALUE"),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="router YAML: only its store_content_teams are read"
    ),
    seed: int = typer.Option(0, "--seed", help="k-means' seed"),
) -> None:
    """Cluster the prompts `distill export` would keep (k-means over their words, as ONNX):
    pick a cluster as a workflow with `export --clusters F --cluster N` and `workflows:`."""
    from router.learning.distill.clusters import fit_row_clusters
    from router.learning.distill.export import ExportError, ExportOptions, Selector

    content_teams = None
    if config is not None:
        content_teams = load_config_or_exit(config).evaluation.store_content_teams
    options = ExportOptions(
        teacher=teacher,
        selector=Selector(tuple(team), tuple(policy), _tags(tag)),
        content_teams=content_teams,
    )
    try:
        summary = fit_row_clusters(traces, options, k, out, seed=seed)
    except ExportError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"{summary['rows']} prompts in {summary['k']} clusters; wrote {out}")
    for i, (size, terms) in enumerate(zip(summary["sizes"], summary["terms"], strict=True)):
        typer.echo(f"  cluster {i}: {size} prompts  {' '.join(terms)}")


@distill_app.command("train")
def train_cmd(
    dataset: Path = typer.Argument(..., help="a folder written by `distill export`"),
    out: Path = typer.Option(Path("student"), "--out", "-o", help="student folder"),
    base: str = typer.Option(
        None, "--base", help="GGUF file, package:PKG/FILE or HF folder (default: SmolLM2-135M)"
    ),
    method: str = typer.Option("lora", "--method", help="lora or full"),
    epochs: float = typer.Option(1.0, "--epochs", min=0.0),
    max_steps: int = typer.Option(None, "--max-steps", min=0, help="optimizer steps (0: base)"),
    lr: float = typer.Option(None, "--lr", help="default 2e-4 (lora), 2e-5 (full)"),
    grad_accum: int = typer.Option(4, "--grad-accum", min=1, help="examples per step"),
    max_length: int = typer.Option(512, "--max-length", min=8, help="tokens per example"),
    lora_r: int = typer.Option(16, "--lora-r", min=1),
    save_every: int = typer.Option(25, "--save-every", min=1, help="checkpoint every N steps"),
    seed: int = typer.Option(0, "--seed"),
    threads: int = typer.Option(None, "--threads", min=1, help="torch CPU threads"),
    max_minutes: float = typer.Option(
        None, "--max-minutes", help="stop (checkpointed) at the first step past this wall time"
    ),
    out_format: str = typer.Option("gguf", "--format", help="gguf (llama.cpp) or hf (vLLM)"),
) -> None:
    """Fine-tune a small student on the set (the `distill` extra); resumable."""
    from router.learning.distill.train import SHIPPED_BASE, TrainError, TrainOptions, train

    options = TrainOptions(
        base=base or SHIPPED_BASE,
        method=method,
        epochs=epochs,
        max_steps=max_steps,
        lr=lr,
        grad_accum=grad_accum,
        max_length=max_length,
        lora_r=lora_r,
        lora_alpha=2 * lora_r,
        save_every=save_every,
        seed=seed,
        threads=threads,
        max_minutes=max_minutes,
        out_format=out_format,
    )
    try:
        result = train(dataset, out, options, counter, lambda m: typer.echo(m, err=True))
    except TrainError as exc:
        raise fail(str(exc)) from None
    loss = (
        f"loss {result.first_loss:.3f} -> {result.last_loss:.3f}"
        if result.first_loss is not None and result.last_loss is not None
        else "no step run"
    )
    typer.echo(
        f"{result.steps} steps ({result.examples_seen} examples; resumed at "
        f"{result.resumed_from}), {loss}, {result.wall_s:.0f} s; wrote {result.model} and "
        f"{out / 'model-card.json'}"
    )


@distill_app.command("card")
def card_cmd(
    student: Path = typer.Argument(..., help="a folder written by `distill train`"),
    trial: Path = typer.Option(..., "--trial", help="the `levers trial` results folder"),
    tier: str = typer.Option(..., "--tier", help="the student's tier in that trial"),
) -> None:
    """Add a lever trial's held-out figures to the student's model card."""
    from router.learning.distill.card import CardError, add_heldout

    try:
        figures = add_heldout(student, trial, tier)
    except CardError as exc:
        raise fail(str(exc)) from None
    # Shares with Wilson intervals where the verdicts are whole points (the reference judge).
    acc = figures.get("accuracy_wilson") or figures["accuracy"]
    ref = figures.get("reference_accuracy_wilson") or figures["reference_accuracy"]
    diff = figures["paired_difference"]

    def fmt(e: dict | None) -> str:
        if not e or e.get("value") is None:
            return "n/a"
        return f"{e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"

    typer.echo(
        f"{tier}: accuracy {fmt(acc)}; {figures['reference']}: {fmt(ref)}; paired "
        f"difference {fmt(diff)} on {figures['judged_pairs']} judged pairs; wrote "
        f"{student / 'model-card.json'}"
    )
