"""`cost-router levers trial|plan` (registered by router/cli.py): measure quantization,
distillation and speculative decoding on logged prompts (docs/levers.md).

The work is in simulations/levers/; this layer loads the router config (the tiers), builds the
judges (router/learning/judges: the reference judge for prompts with a gold answer, the llm
judge for the others) and hands the run one function per judged pair. Exit status: 0 done (and
every gate passed); 1 a tier down (what was measured is kept: rerun to resume) or a gate failed;
2 bad input (config, plan, data, arguments), one `error:` line.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import ValidationError

from backends.base import Backend
from backends.config import TierConfig
from backends.launch import LaunchError, plan_tier
from router.commands.common import fail, load_config_or_exit
from router.commands.progress import counter
from router.config import RouterConfig
from router.learning.config import JudgesConfig, LlmJudgeConfig, ReferenceJudgeConfig
from router.learning.judges.base import Answer, Case, Judge, Judgement
from router.learning.judges.registry import build_judges
from simulations.levers.plan import (
    LEVERS,
    PlanCandidate,
    PlanError,
    TrialPlan,
    check_tiers,
    load_plan,
)
from simulations.levers.prompts import TrialPrompt
from simulations.levers.records import Measurement, TierDownError, TrialTier
from simulations.levers.store import JudgeRow, JudgeStatus, TrialStoreError

if TYPE_CHECKING:  # the run loads `openai` and httpx: inside the commands (module docstring)
    from simulations.levers.store import TrialStore
    from simulations.levers.trial import TrialSpec

levers_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)

JUDGE_MODES = ("auto", "reference", "llm")
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

DEFAULT_N, DEFAULT_CONCURRENCY, DEFAULT_MAX_TOKENS = 500, 4, 256


def _parse_candidate(text: str) -> PlanCandidate:
    tier, _, lever = text.partition(":")
    if not tier or (lever and lever not in LEVERS):
        raise fail(
            f"--candidate {text}: expected TIER or TIER:LEVER, LEVER one of {', '.join(LEVERS)}"
        )
    return PlanCandidate.model_validate({"tier": tier, "lever": lever or None})


def _trial_tier(tier: TierConfig, index: int, lever: str | None) -> TrialTier:
    if not tier.base_url:
        raise fail(
            f"tiers.{index}.base_url: tier {tier.name!r} has none; a lever trial talks "
            "to OpenAI-compatible servers (vLLM, llama.cpp, ...)"
        )
    metrics_url = tier.metrics_url
    if metrics_url is None and tier.launch is not None:
        try:
            metrics_url = plan_tier(tier).metrics_url
        except LaunchError:
            metrics_url = None  # an unusable launch profile just means no counters to read
    if lever is None and tier.launch is not None and tier.launch.speculative is not None:
        lever = "speculative"
    api_key = os.environ.get(tier.api_key_env) if tier.api_key_env else None
    return TrialTier(
        tier.name,
        tier.base_url,
        tier.model,
        tier.price,
        api_key,
        tier.timeout_s,
        metrics_url,
        lever,
    )


def _judges(
    config: RouterConfig, mode: str, judge_tier: str | None
) -> tuple[JudgesConfig, list[str]]:
    """The judges config of this trial and the tiers its llm judge needs."""
    if mode not in JUDGE_MODES:
        raise fail(f"--judge {mode}: expected one of {', '.join(JUDGE_MODES)}")
    configured = config.evaluation.judges.llm
    llm: LlmJudgeConfig | None = None
    if mode != "reference":
        if judge_tier is not None:
            base = configured.model_dump() if configured is not None else {}
            llm = LlmJudgeConfig.model_validate({**base, "tier": judge_tier})
        else:
            llm = configured
        if llm is None and mode == "llm":
            raise fail("--judge llm: give --judge-tier or set evaluation.judges.llm.tier")
        if llm is not None and llm.tier not in {t.name for t in config.tiers}:
            raise fail(f"--judge-tier: unknown tier {llm.tier!r}")
    # GSM8K gold answers are answer texts the data marks correct: their last number is the gold
    # one, so the reference judge matches numerically (simulations/levers/prompts.py).
    reference = None if mode == "llm" else ReferenceJudgeConfig(match="numeric")
    return JudgesConfig(llm=llm, reference=reference), [llm.tier] if llm is not None else []


def _status(j: Judgement) -> JudgeStatus:
    if j.outcomes:
        return "label"
    if j.unparseable:
        return "unparsed"
    return "failed" if j.failed else "no-label"


class PairJudge:
    """The trial's judge of one pair: the reference judge when the prompt has a gold answer,
    else the llm judge (identical answers: a tie without asking it), else no label."""

    def __init__(self, judges: Sequence[Judge]) -> None:
        self.by_kind = {j.name: j for j in judges}

    async def __call__(self, prompt: TrialPrompt, ref: Measurement, cand: Measurement) -> JudgeRow:
        judge = self.by_kind.get("reference") if prompt.reference else None
        judge = judge or self.by_kind.get("llm")
        if judge is None:
            return JudgeRow(prompt.id, cand.tier, ref.tier, None, None, "no-label", None, None)
        if judge.name == "llm" and ref.text == cand.text:
            # The same answer twice is a tie by definition (what both orders of a pairwise
            # judge cancel to); speculative decoding's answers mostly are: no judge call.
            return JudgeRow(
                prompt.id,
                cand.tier,
                ref.tier,
                judge.name,
                judge.version,
                "label",
                0.5,
                0.5,
                "identical answers",
            )
        body = {
            "messages": [{"role": "user", "content": prompt.text}],
            "metadata": {"reference_answer": prompt.reference} if prompt.reference else {},
        }
        case = Case(
            prompt.id, prompt.text, (Answer(ref.tier, ref.text), Answer(cand.tier, cand.text)), body
        )
        j = await judge.judge(case)
        out = j.outcomes or {}
        return JudgeRow(
            prompt.id,
            cand.tier,
            ref.tier,
            judge.name,
            judge.version,
            _status(j),
            out.get(ref.tier),
            out.get(cand.tier),
            j.verdict or j.detail,
            j.cost_usd,
        )


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


async def _execute(
    spec: TrialSpec,
    prompts: list[TrialPrompt],
    store: TrialStore,
    judges_settings: JudgesConfig,
    judge_tiers: list[str],
    tiers: Mapping[str, TierConfig],
) -> None:
    from backends.registry import build_backends, close_backends
    from simulations.levers.trial import judge_all, measure_all, pending_pairs, pending_requests

    total = pending_requests(spec, prompts, store)
    if total:
        with counter(total, "measuring") as done:
            await measure_all(spec, prompts, store, done)
    backends: dict[str, Backend] = build_backends([tiers[t] for t in judge_tiers])
    try:
        judges = build_judges(judges_settings, tiers, backends)
        pairs = pending_pairs(spec, prompts, store)
        if pairs:
            with counter(pairs, "judging") as done:
                await judge_all(spec, prompts, store, PairJudge(judges), done)
    finally:
        await close_backends(backends)


def run_trial(
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
) -> None:
    from classifiers.dataset import DatasetError
    from simulations import reports
    from simulations.levers.gate import Tolerance, verdicts
    from simulations.levers.levers_file import write_levers
    from simulations.levers.prompts import load_prompts
    from simulations.levers.store import TrialStore
    from simulations.levers.summary import HEADERS, Combination, summarize, table_rows
    from simulations.levers.trial import TrialSpec

    router_config = load_config_or_exit(config_path)
    index = {t.name: (i, t) for i, t in enumerate(router_config.tiers)}
    try:
        check_tiers(plan, set(index), str(config_path))
    except PlanError as exc:
        raise fail(str(exc)) from None
    candidates = plan.all_candidates()
    reference = _trial_tier(index[plan.reference][1], index[plan.reference][0], None)
    spec = TrialSpec(
        reference,
        tuple(_trial_tier(index[c.tier][1], index[c.tier][0], c.lever) for c in candidates),
        max_tokens=max_tokens or plan.max_tokens or DEFAULT_MAX_TOKENS,
        concurrency=concurrency or plan.concurrency or DEFAULT_CONCURRENCY,
    )
    sources = traces or [Path(p) for p in plan.traces]
    if not sources:
        raise fail("--traces: no prompts given (and the plan names no `traces:`)")
    judges_settings, judge_tiers = _judges(router_config, judge, judge_tier)
    try:
        prompts = load_prompts(sources, n or plan.n or DEFAULT_N, seed)
        store = TrialStore(out, {**spec.settings(), "reference": reference.name, "seed": seed})
    except (DatasetError, TrialStoreError) as exc:
        raise fail(str(exc)) from None
    tiers = {t.name: t for t in router_config.tiers}
    try:
        asyncio.run(_execute(spec, prompts, store, judges_settings, judge_tiers, tiers))
    except TierDownError as exc:
        kept = len(store.measurements)
        typer.echo(
            f"error: {exc}; {kept} measurements so far kept in {out} (rerun the same "
            "command to resume)",
            err=True,
        )
        raise typer.Exit(1) from None
    finally:
        store.close()
    scores, combos = None, []
    if plan.combinations:
        from policies.target_share import threshold_for_share
        from simulations.replay import score_texts

        scores = score_texts([p.text for p in prompts], router_config.classifier.model_path)
        default = (
            plan.threshold
            if plan.large_share is None
            else threshold_for_share(scores, plan.large_share)
        )
        combos = [
            Combination(c.name, c.small, c.large, default if c.threshold is None else c.threshold)
            for c in plan.combinations
        ]
    rows = summarize(spec, prompts, store, combos, scores, confidence)
    typer.echo(
        f"{len(prompts)} prompts; reference {reference.name}; temperature "
        f"{spec.temperature:g}, max_tokens {spec.max_tokens}; quality and shares with "
        f"{confidence:.0%} intervals; results in {out}"
    )
    typer.echo(reports.table(HEADERS, table_rows(rows)))
    alone = [r.quality for r in rows if r.quality is not None and r.kind == "alone"]
    unparsed = sum(q.unparsed for q in alone)
    if unparsed:
        typer.echo(
            f"{unparsed} pairs unparsed: the judge answered without a readable verdict "
            "(no label; not counted as win, tie or loss)"
        )
    if failed := sum(q.failed for q in alone):
        typer.echo(f"{failed} pairs not judged: the judge's server failed (a rerun retries them)")
    if unlabelled := sum(q.unlabelled for q in alone):
        typer.echo(
            f"{unlabelled} pairs without a judge: no gold answer, and no llm judge "
            "(--judge-tier or evaluation.judges.llm)"
        )
    write_levers(out / "levers.json", rows, len(prompts))
    tol = Tolerance(max_quality_loss, max_p95_latency_s, confidence)
    results = verdicts(rows, tol) if tol.active else []
    reports.write_json(
        out / "summary.json",
        {"rows": [asdict(r) for r in rows], "gate": [asdict(v) for v in results]},
    )
    typer.echo(
        f"wrote {out / 'levers.json'} (cost-router what-if --levers) and {out / 'summary.json'}"
    )
    for v in results:
        typer.echo(f"gate {'PASS' if v.passed else 'FAIL'} {v.row}: {'; '.join(v.reasons)}")
    if not all(v.passed for v in results):
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
) -> None:
    """Replay prompts on a reference tier and candidates; latency, cost and judged quality."""
    run_trial(
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
) -> None:
    """Reference, each candidate alone, then the combinations, in one table."""
    run_trial(
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
    )
