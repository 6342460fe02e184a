"""`cost-router levers trial|plan` (registered by router/cli.py): measure quantization,
distillation and speculative decoding on logged prompts (docs/levers.md).

The trial is router/learning/levers.py's (the measuring and the statistics simulations/levers/'s);
this layer parses the options, loads the router config and prints the table. Exit status: 0 done
(and every gate passed); 1 a tier down (what was measured is kept: rerun to resume) or a gate
failed; 2 bad input (config, plan, data, arguments), one `error:` line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import typer
from pydantic import ValidationError

from router.commands.common import fail, load_config_or_exit
from router.commands.progress import counter
from router.learning.levers import LeverTrialError, TrialDown, TrialOptions, run_trial
from simulations.levers.plan import LEVERS, PlanCandidate, PlanError, TrialPlan, load_plan

levers_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)

CONFIG = typer.Option(..., "--config", "-c", help="router YAML: the tiers (and the llm judge)")
TRACES = typer.Option(
    None,
    "--traces",
    "-t",
    help="prompts: trace files/folders, RouteLLM CSVs (the plan's if not given)",
)
N = typer.Option(None, "--n", min=1, help="prompts replayed, a seeded sample (default 500)")
CONCURRENCY = typer.Option(
    None, "--concurrency", min=1, help="requests in flight per tier (default 4)"
)
MAX_TOKENS = typer.Option(None, "--max-tokens", min=1, help="per request (default 256)")
JUDGE = typer.Option(
    "auto",
    "--judge",
    help="auto: reference for prompts with a gold answer, llm for the others; reference; llm",
)
JUDGE_TIER = typer.Option(
    None, "--judge-tier", help="tier of the llm judge (default: evaluation.judges.llm.tier)"
)
OUT = typer.Option(
    Path("lever-trial"), "--out", "-o", help="results folder: written as it goes, a rerun resumes"
)
SEED = typer.Option(0, "--seed", help="prompt sample")
MAX_LOSS = typer.Option(
    None, "--max-quality-loss", help="gate: quality may drop at most this much (0.02 = 2 points)"
)
CONFIDENCE = typer.Option(
    0.95, "--confidence", min=0.5, max=0.999, help="gate: confidence of the quality interval"
)
MAX_P95 = typer.Option(None, "--max-p95-latency-s", help="gate: p95 end-to-end latency bound")
MIN_INFORMATIVE = typer.Option(
    None,
    "--min-informative-pairs",
    min=0,
    help="gate: judged pairs that are not ties needed to pass on quality (default 10)",
)


def _parse_candidate(text: str) -> PlanCandidate:
    tier, _, lever = text.partition(":")
    if not tier or (lever and lever not in LEVERS):
        raise fail(
            f"--candidate {text}: expected TIER or TIER:LEVER, LEVER one of {', '.join(LEVERS)}"
        )
    return PlanCandidate.model_validate({"tier": tier, "lever": lever or None})


def _resolve_plan(
    plan_file: Path | None, reference: str | None, candidates: Sequence[str]
) -> TrialPlan:
    if plan_file is not None:
        try:
            plan = load_plan(plan_file)
        except PlanError as exc:
            raise fail(str(exc)) from None
        if reference or candidates:
            raise fail("--plan: give the reference and candidates in the plan file, not both")
        return plan
    if not reference or not candidates:
        raise fail("give --reference TIER and at least one --candidate TIER (or --plan FILE)")
    parsed = [_parse_candidate(c) for c in candidates]
    try:
        return TrialPlan(reference=reference, candidates=parsed)
    except ValidationError as exc:
        raise fail("--candidate: " + "; ".join(str(e["msg"]) for e in exc.errors())) from None


def _trial(
    config_path: Path,
    plan: TrialPlan,
    traces: list[Path] | None,
    n: int | None,
    concurrency: int | None,
    max_tokens: int | None,
    judge: str,
    judge_tier: str | None,
    out: Path,
    seed: int,
    max_quality_loss: float | None,
    confidence: float,
    max_p95_latency_s: float | None,
    min_informative_pairs: int | None,
) -> None:
    from simulations import reports
    from simulations.levers.summary import HEADERS, table_rows

    router_config = load_config_or_exit(config_path)
    options = TrialOptions(
        traces,
        n,
        concurrency,
        max_tokens,
        judge,
        judge_tier,
        out,
        seed,
        max_quality_loss,
        confidence,
        max_p95_latency_s,
        min_informative_pairs,
    )
    try:
        result = run_trial(
            router_config.tiers,
            router_config.evaluation.judges,
            router_config.classifier.model_path,
            plan,
            options,
            str(config_path),
            counter,
        )
    except LeverTrialError as exc:
        raise fail(str(exc)) from None
    except TrialDown as exc:
        typer.echo(
            f"error: {exc}; {exc.kept} measurements so far kept in {out} (rerun the same "
            "command to resume)",
            err=True,
        )
        raise typer.Exit(1) from None
    spec = result.spec
    typer.echo(
        f"{result.prompts} prompts; reference {spec.reference.name}; temperature "
        f"{spec.temperature:g}, max_tokens {spec.max_tokens}; quality and shares with "
        f"{confidence:.0%} intervals; results in {out}"
    )
    typer.echo(reports.table(HEADERS, table_rows(result.rows)))
    if result.unparsed:
        typer.echo(
            f"{result.unparsed} pairs unparsed: the judge answered without a readable verdict "
            "(no label; not counted as win, tie or loss)"
        )
    if result.failed:
        typer.echo(
            f"{result.failed} pairs not judged: the judge's server failed (a rerun retries them)"
        )
    if result.unlabelled:
        typer.echo(
            f"{result.unlabelled} pairs without a judge: no gold answer, and no llm judge "
            "(--judge-tier or evaluation.judges.llm)"
        )
    typer.echo(
        f"wrote {out / 'levers.json'} (cost-router what-if --levers) and {out / 'summary.json'}"
    )
    for v in result.verdicts:
        typer.echo(f"gate {'PASS' if v.passed else 'FAIL'} {v.row}: {'; '.join(v.reasons)}")
    if not result.passed:
        raise typer.Exit(1)


@levers_app.command("trial")
def trial_cmd(
    config: Path = CONFIG,
    traces: list[Path] = TRACES,
    reference: str = typer.Option(
        None, "--reference", help="the tier candidates are compared with"
    ),
    candidate: list[str] = typer.Option(
        [],
        "--candidate",
        help="TIER or TIER:LEVER (quantization, distillation, speculative); repeatable",
    ),
    plan: Path = typer.Option(None, "--plan", help="a plan file instead (see `levers plan`)"),
    n: int = N,
    concurrency: int = CONCURRENCY,
    max_tokens: int = MAX_TOKENS,
    judge: str = JUDGE,
    judge_tier: str = JUDGE_TIER,
    out: Path = OUT,
    seed: int = SEED,
    max_quality_loss: float = MAX_LOSS,
    confidence: float = CONFIDENCE,
    max_p95_latency_s: float = MAX_P95,
    min_informative_pairs: int = MIN_INFORMATIVE,
) -> None:
    """Replay prompts on a reference tier and candidates; latency, cost and judged quality."""
    _trial(
        config,
        _resolve_plan(plan, reference, candidate),
        traces,
        n,
        concurrency,
        max_tokens,
        judge,
        judge_tier,
        out,
        seed,
        max_quality_loss,
        confidence,
        max_p95_latency_s,
        min_informative_pairs,
    )


@levers_app.command("plan")
def plan_cmd(
    plan_file: Path = typer.Argument(..., help="plan YAML (simulations/levers/plan.py)"),
    config: Path = CONFIG,
    traces: list[Path] = TRACES,
    n: int = N,
    concurrency: int = CONCURRENCY,
    max_tokens: int = MAX_TOKENS,
    judge: str = JUDGE,
    judge_tier: str = JUDGE_TIER,
    out: Path = OUT,
    seed: int = SEED,
    max_quality_loss: float = MAX_LOSS,
    confidence: float = CONFIDENCE,
    max_p95_latency_s: float = MAX_P95,
    min_informative_pairs: int = MIN_INFORMATIVE,
) -> None:
    """Reference, each candidate alone, then the combinations, in one table."""
    _trial(
        config,
        _resolve_plan(plan_file, None, []),
        traces,
        n,
        concurrency,
        max_tokens,
        judge,
        judge_tier,
        out,
        seed,
        max_quality_loss,
        confidence,
        max_p95_latency_s,
        min_informative_pairs,
    )
