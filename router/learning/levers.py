"""A lever trial judged by the learning loop's judges: measure quantization, distillation and
speculative decoding on logged prompts (docs/levers.md), for `cost-router levers trial|plan` and
any other caller.

The measuring, the statistics and the gate are simulations/levers/'s; this module turns tier
sections into trial tiers, chooses the judges (the reference judge for prompts with a gold
answer, the llm judge for the others), judges each pair and runs the whole trial. Bad input
raises `LeverTrialError`; a tier that goes down raises `TrialDown` (what was measured is kept:
the same trial again resumes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from backends.base import Backend
from backends.config import TierConfig
from backends.launch import LaunchError, plan_tier
from router.learning.config import JudgesConfig, LlmJudgeConfig, ReferenceJudgeConfig
from router.learning.judges.base import Answer, Case, Judge, Judgement
from router.learning.judges.registry import build_judges
from simulations.levers.plan import PlanError, TrialPlan, check_tiers
from simulations.levers.prompts import TrialPrompt
from simulations.levers.records import Measurement, TierDownError, TrialTier
from simulations.levers.store import JudgeRow, JudgeStatus, TrialStoreError

if TYPE_CHECKING:  # the run loads `openai`, httpx, onnxruntime and scipy: inside run_trial
    from simulations.levers.gate import Verdict
    from simulations.levers.store import TrialStore
    from simulations.levers.summary import Row
    from simulations.levers.trial import TrialSpec

JUDGE_MODES = ("auto", "reference", "llm")
DEFAULT_N, DEFAULT_CONCURRENCY, DEFAULT_MAX_TOKENS = 500, 4, 256

# progress(total, label): a context manager yielding the callback that marks one item done and
# names the next (a command draws a bar; a library caller may pass `no_progress`).
Progress = Callable[[int, str], AbstractContextManager[Callable[[str], None]]]


class LeverTrialError(ValueError):
    """A trial that cannot run as asked (config, plan, data, options); the message says why."""


class TrialDown(RuntimeError):
    """A tier stopped answering mid-trial; `kept` measurements are stored in the results
    folder, and the same trial again resumes from them."""

    def __init__(self, message: str, kept: int) -> None:
        super().__init__(message)
        self.kept = kept


@contextmanager
def no_progress(total: int, label: str) -> Iterator[Callable[[str], None]]:
    yield lambda _next: None


@dataclass(frozen=True)
class TrialOptions:
    """What a trial run may set beyond its plan (None: the plan's, else the default)."""

    traces: Sequence[Path] | None = None
    n: int | None = None
    concurrency: int | None = None
    max_tokens: int | None = None
    judge: str = "auto"
    judge_tier: str | None = None
    out: Path = Path("lever-trial")
    seed: int = 0
    max_quality_loss: float | None = None
    confidence: float = 0.95
    max_p95_latency_s: float | None = None
    min_informative_pairs: int | None = None  # None: the gate's default


@dataclass(frozen=True)
class TrialResult:
    spec: TrialSpec
    prompts: int
    rows: list[Row]
    verdicts: list[Verdict]
    unparsed: int  # pairs the judge answered without a readable verdict
    failed: int  # pairs not judged: the judge's server failed
    unlabelled: int  # pairs without a judge (no gold answer, no llm judge)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)


def trial_tier(tier: TierConfig, index: int, lever: str | None) -> TrialTier:
    """The tier section `tiers.<index>` as a trial talks to it."""
    if not tier.base_url:
        raise LeverTrialError(
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


def trial_judges(
    configured: JudgesConfig, tier_names: set[str], mode: str, judge_tier: str | None
) -> tuple[JudgesConfig, list[str]]:
    """The judges of a trial (from the `evaluation.judges` section, `mode` and an llm judge
    tier given for the trial) and the tiers its llm judge needs."""
    if mode not in JUDGE_MODES:
        raise LeverTrialError(f"--judge {mode}: expected one of {', '.join(JUDGE_MODES)}")
    llm: LlmJudgeConfig | None = None
    if mode != "reference":
        if judge_tier is not None:
            base = configured.llm.model_dump() if configured.llm is not None else {}
            llm = LlmJudgeConfig.model_validate({**base, "tier": judge_tier})
        else:
            llm = configured.llm
        if llm is None and mode == "llm":
            raise LeverTrialError(
                "--judge llm: give --judge-tier or set evaluation.judges.llm.tier"
            )
        if llm is not None and llm.tier not in tier_names:
            raise LeverTrialError(f"--judge-tier: unknown tier {llm.tier!r}")
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


async def execute(
    spec: TrialSpec,
    prompts: list[TrialPrompt],
    store: TrialStore,
    judges_settings: JudgesConfig,
    judge_tiers: list[str],
    tiers: Mapping[str, TierConfig],
    progress: Progress = no_progress,
) -> None:
    """Measure what the store lacks, then judge the pairs not judged yet."""
    from backends.registry import build_backends, close_backends
    from simulations.levers.trial import judge_all, measure_all, pending_pairs, pending_requests

    total = pending_requests(spec, prompts, store)
    if total:
        with progress(total, "measuring") as done:
            await measure_all(spec, prompts, store, done)
    backends: dict[str, Backend] = build_backends([tiers[t] for t in judge_tiers])
    try:
        judges = build_judges(judges_settings, tiers, backends)
        pairs = pending_pairs(spec, prompts, store)
        if pairs:
            with progress(pairs, "judging") as done:
                await judge_all(spec, prompts, store, PairJudge(judges), done)
    finally:
        await close_backends(backends)


def run_trial(
    tiers: Sequence[TierConfig],
    judges: JudgesConfig,
    model_path: str | None,
    plan: TrialPlan,
    options: TrialOptions,
    source: str,
    progress: Progress = no_progress,
) -> TrialResult:
    """Run the trial `plan` asks for on `tiers` (the `tiers:` section; `source` names its
    file in errors), judged by the `evaluation.judges` section's judges, combinations scored
    with the classifier at `model_path`; writes `levers.json` and `summary.json` in
    `options.out`."""
    import asyncio

    from classifiers.dataset import DatasetError
    from simulations import reports
    from simulations.levers.gate import Tolerance, verdicts
    from simulations.levers.levers_file import write_levers
    from simulations.levers.prompts import load_prompts
    from simulations.levers.store import TrialStore
    from simulations.levers.summary import Combination, summarize
    from simulations.levers.trial import TrialSpec

    index = {t.name: (i, t) for i, t in enumerate(tiers)}
    try:
        check_tiers(plan, set(index), source)
    except PlanError as exc:
        raise LeverTrialError(str(exc)) from None
    candidates = plan.all_candidates()
    reference = trial_tier(index[plan.reference][1], index[plan.reference][0], None)
    spec = TrialSpec(
        reference,
        tuple(trial_tier(index[c.tier][1], index[c.tier][0], c.lever) for c in candidates),
        max_tokens=options.max_tokens or plan.max_tokens or DEFAULT_MAX_TOKENS,
        concurrency=options.concurrency or plan.concurrency or DEFAULT_CONCURRENCY,
    )
    sources = list(options.traces or [Path(p) for p in plan.traces])
    if not sources:
        raise LeverTrialError("--traces: no prompts given (and the plan names no `traces:`)")
    judges_settings, judge_tiers = trial_judges(
        judges, set(index), options.judge, options.judge_tier
    )
    out = options.out
    try:
        prompts = load_prompts(sources, options.n or plan.n or DEFAULT_N, options.seed)
        store = TrialStore(
            out, {**spec.settings(), "reference": reference.name, "seed": options.seed}
        )
    except (DatasetError, TrialStoreError) as exc:
        raise LeverTrialError(str(exc)) from None
    by_name = {name: tier for name, (_, tier) in index.items()}
    try:
        asyncio.run(execute(spec, prompts, store, judges_settings, judge_tiers, by_name, progress))
    except TierDownError as exc:
        raise TrialDown(str(exc), len(store.measurements)) from None
    finally:
        store.close()
    scores, combos = None, []
    if plan.combinations:
        from policies.target_share import threshold_for_share
        from simulations.replay import score_texts

        scores = score_texts([p.text for p in prompts], model_path)
        default = (
            plan.threshold
            if plan.large_share is None
            else threshold_for_share(scores, plan.large_share)
        )
        combos = [
            Combination(c.name, c.small, c.large, default if c.threshold is None else c.threshold)
            for c in plan.combinations
        ]
    rows = summarize(spec, prompts, store, combos, scores, options.confidence)
    alone = [r.quality for r in rows if r.quality is not None and r.kind == "alone"]
    write_levers(out / "levers.json", rows, len(prompts))
    tol = Tolerance(options.max_quality_loss, options.max_p95_latency_s, options.confidence)
    if options.min_informative_pairs is not None:
        tol = replace(tol, min_informative_pairs=options.min_informative_pairs)
    results = verdicts(rows, tol) if tol.active else []
    reports.write_json(
        out / "summary.json",
        {"rows": [asdict(r) for r in rows], "gate": [asdict(v) for v in results]},
    )
    return TrialResult(
        spec,
        len(prompts),
        rows,
        results,
        unparsed=sum(q.unparsed for q in alone),
        failed=sum(q.failed for q in alone),
        unlabelled=sum(q.unlabelled for q in alone),
    )
