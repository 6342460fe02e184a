"""A trial's rows, in the order the plan runs them: the reference, each candidate alone, then the
combinations.

Per row: latency (TTFT, ITL, end-to-end p50/p95), tokens, cost per 1,000 requests, speed against
the reference on the same prompts (decode: ratio of median ITL; end to end: ratio of median
latency), and quality against the reference from the judged pairs: the candidate's mean and the
reference's, their paired difference, and the win / tie / loss shares, each with an interval at
the trial's confidence (scipy: a paired percentile bootstrap for means and the difference, the
Wilson interval for shares; `classifiers.evaluate.Estimate` is the one interval type). Pairs the
judge answered with no readable verdict are counted as "unparsed", never guessed. For
speculative decoding (lossless at temperature 0): the share of identical outputs and the
acceptance rate from the server's counters when it exposes them.

A combination (routing between a small and a large tier on the classifier's score) sends no
request of its own: per prompt it takes the measurement and judged pair of the tier the routing
picks, so it is measured on the same prompts and answers as the levers alone.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import stats

from backends.config import Price
from classifiers.evaluate import Estimate
from simulations.levers.prompts import TrialPrompt
from simulations.levers.records import Measurement
from simulations.levers.store import JudgeRow, TrialStore
from simulations.levers.trial import TrialSpec

NAN = float("nan")
RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class Combination:
    name: str
    small: str  # tier a prompt scoring below `threshold` goes to
    large: str
    threshold: float


@dataclass(frozen=True)
class Quality:
    labelled: int  # pairs with a verdict
    unparsed: int  # the judge answered, its verdict unreadable
    failed: int  # the judge could not be asked
    unlabelled: int  # no judge fits (no gold answer and no llm judge)
    judges: dict[str, int]
    reference: Estimate  # mean outcome of the reference's answers on the labelled pairs
    candidate: Estimate
    delta: Estimate  # candidate - reference, paired (see score_bound for the interval)
    win: Estimate
    tie: Estimate
    loss: Estimate
    informative: int = 0  # labelled pairs that are not ties (a win or a loss)


@dataclass(frozen=True)
class Row:
    name: str
    kind: str  # reference | alone | combined
    lever: str | None
    prompts: int  # measured (answered) prompts
    errors: int  # failed requests
    ttft_p50_s: float
    ttft_p95_s: float
    itl_p50_s: float
    e2e_p50_s: float
    e2e_p95_s: float
    completion_tokens: float  # mean per request
    cost_per_1k: float
    decode_speed: float  # reference's median ITL / this row's, same prompts (>1: faster)
    e2e_speed: float
    price_ratio: float  # this row's tokens at its price / the same tokens at the reference's
    quality: Quality | None = None
    identical: Estimate | None = None  # share of outputs identical to the reference's
    acceptance: float | None = None  # speculative: accepted / drafted tokens (server counters)
    large_share: float | None = None  # combinations: share routed to the large tier
    tiers: dict[str, int] = field(default_factory=dict)  # combinations: prompts per tier


def _pct(values: Sequence[float | None], q: float) -> float:
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else NAN


def _share(k: int, n: int, confidence: float) -> Estimate:
    if n == 0:
        return Estimate(NAN, NAN, NAN, 0)
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Estimate(k / n, float(ci.low), float(ci.high), n)


def _boot(
    samples: tuple[np.ndarray, ...], fn: Callable[..., np.ndarray], confidence: float
) -> Estimate:
    n = len(samples[0])
    point = float(fn(*samples, axis=-1)) if n else NAN
    if n < 2:
        return Estimate(point, NAN, NAN, n)
    if all(np.ptp(s) == 0 for s in samples):
        return Estimate(point, point, point, n)  # no spread: every resample gives the point
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on near-degenerate resamples
        res = stats.bootstrap(
            samples,
            fn,
            paired=True,
            vectorized=True,
            confidence_level=confidence,
            n_resamples=RESAMPLES,
            method="percentile",
            random_state=0,
        )
    ci = res.confidence_interval
    return Estimate(point, float(ci.low), float(ci.high), n)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _diff(c: np.ndarray, r: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(c - r, axis=axis)


def quality(rows: Sequence[JudgeRow], confidence: float) -> Quality:
    labelled = [
        r
        for r in rows
        if r.status == "label"
        and r.candidate_outcome is not None
        and r.reference_outcome is not None
    ]
    counts = Counter(r.status for r in rows)
    cand = np.asarray([r.candidate_outcome for r in labelled], dtype=np.float64)
    ref = np.asarray([r.reference_outcome for r in labelled], dtype=np.float64)
    n = len(labelled)
    wins, ties = int((cand > ref).sum()), int((cand == ref).sum())
    boot = _boot((cand, ref), _diff, confidence)
    low, high = score_bound(cand - ref, confidence)
    return Quality(
        labelled=n,
        unparsed=counts["unparsed"],
        failed=counts["failed"],
        unlabelled=counts["no-label"],
        judges=dict(Counter(r.judge for r in labelled if r.judge is not None)),
        reference=_boot((ref,), _mean, confidence),
        candidate=_boot((cand,), _mean, confidence),
        # The wider of the two: the bootstrap alone is zero-width when every pair ties.
        delta=Estimate(boot.value, _lowest(boot.low, low), _highest(boot.high, high), n),
        win=_share(wins, n, confidence),
        tie=_share(ties, n, confidence),
        loss=_share(n - wins - ties, n, confidence),
        informative=n - ties,
    )


def score_bound(diff: np.ndarray, confidence: float) -> tuple[float, float]:
    """An interval of the mean paired difference (each in [-1, 1]) honest at small n and when
    every pair ties: the share of wins' Wilson interval and the share of losses', each at
    1 - (1 - confidence) / 2 so both hold together (Bonferroni). A loss can cost at most a whole
    point; a win counts as the smallest win seen (with the trial's judges every win or loss is a
    whole point). 8 ties of 8 give [-0.39, +0.39] where a bootstrap gives [0, 0]."""
    n = len(diff)
    if n == 0:
        return NAN, NAN
    each = 1 - (1 - confidence) / 2
    wins, losses = diff[diff > 0], diff[diff < 0]
    win, loss = _share(len(wins), n, each), _share(len(losses), n, each)
    smallest_win = float(wins.min()) if wins.size else 0.0
    smallest_loss = float(-losses.max()) if losses.size else 0.0
    return win.low * smallest_win - loss.high, win.high - loss.low * smallest_loss


def _lowest(a: float, b: float) -> float:
    return float(np.nanmin([a, b])) if np.isfinite([a, b]).any() else NAN


def _highest(a: float, b: float) -> float:
    return float(np.nanmax([a, b])) if np.isfinite([a, b]).any() else NAN


def _ratio(a: float, b: float) -> float:
    return a / b if b and np.isfinite(a) and np.isfinite(b) else NAN


def _row(
    name: str,
    kind: str,
    lever: str | None,
    chosen: Sequence[Measurement],
    errors: int,
    ref: Mapping[str, Measurement],
    prices: Mapping[str, Price],
    reference: str,
) -> Row:
    same = [m for m in chosen if m.prompt_id in ref]
    ref_same = [ref[m.prompt_id] for m in same]
    own = sum(m.cost_usd for m in chosen)
    at_ref = sum(prices[reference].cost(m.prompt_tokens, m.completion_tokens) for m in chosen)
    return Row(
        name=name,
        kind=kind,
        lever=lever,
        prompts=len(chosen),
        errors=errors,
        ttft_p50_s=_pct([m.ttft_s for m in chosen], 50),
        ttft_p95_s=_pct([m.ttft_s for m in chosen], 95),
        itl_p50_s=_pct([m.itl_s for m in chosen], 50),
        e2e_p50_s=_pct([m.e2e_s for m in chosen], 50),
        e2e_p95_s=_pct([m.e2e_s for m in chosen], 95),
        completion_tokens=float(np.mean([m.completion_tokens for m in chosen])) if chosen else NAN,
        cost_per_1k=own / len(chosen) * 1000 if chosen else NAN,
        decode_speed=_ratio(
            _pct([m.itl_s for m in ref_same], 50), _pct([m.itl_s for m in same], 50)
        ),
        e2e_speed=_ratio(_pct([m.e2e_s for m in ref_same], 50), _pct([m.e2e_s for m in same], 50)),
        price_ratio=_ratio(own, at_ref),
    )


def _identical(
    chosen: Sequence[Measurement], ref: Mapping[str, Measurement], confidence: float
) -> Estimate:
    same = [m for m in chosen if m.prompt_id in ref]
    return _share(sum(m.text == ref[m.prompt_id].text for m in same), len(same), confidence)


def _acceptance(store: TrialStore, tier: str) -> float | None:
    counts = store.spec.get(tier)
    if counts is None or counts.draft_tokens <= 0:
        return None
    return counts.accepted_tokens / counts.draft_tokens


def summarize(
    spec: TrialSpec,
    prompts: Sequence[TrialPrompt],
    store: TrialStore,
    combinations: Sequence[Combination] = (),
    scores: np.ndarray | None = None,
    confidence: float = 0.95,
) -> list[Row]:
    """The trial's rows: reference, candidates alone, combinations (module docstring)."""
    refname = spec.reference.name
    prices = {t.name: t.price for t in spec.tiers}

    def ok(tier: str) -> dict[str, Measurement]:
        return {p.id: m for p in prompts if (m := store.measured(p.id, tier)) is not None}

    def errors(tier: str) -> int:
        return sum(
            1
            for p in prompts
            if (m := store.measurements.get((p.id, tier))) is not None and not m.ok
        )

    ref = ok(refname)
    rows = [
        _row(refname, "reference", None, list(ref.values()), errors(refname), ref, prices, refname)
    ]
    judged: dict[str, dict[str, JudgeRow]] = {}
    for cand in spec.candidates:
        mine = ok(cand.name)
        judged[cand.name] = {
            p.id: row
            for p in prompts
            if (row := store.judgements.get((p.id, cand.name))) is not None
        }
        base = _row(
            cand.name,
            "alone",
            cand.lever,
            list(mine.values()),
            errors(cand.name),
            ref,
            prices,
            refname,
        )
        rows.append(
            _with(
                base,
                quality=quality(list(judged[cand.name].values()), confidence),
                identical=_identical(list(mine.values()), ref, confidence),
                acceptance=_acceptance(store, cand.name),
            )
        )
    if combinations:
        if scores is None or len(scores) != len(prompts):
            raise ValueError("combinations need one classifier score per prompt")
        for combo in combinations:
            rows.append(
                _combined(combo, spec, prompts, scores, store, judged, ok, ref, prices, confidence)
            )
    return rows


def _with(row: Row, **changes: object) -> Row:
    return replace(row, **changes)  # type: ignore[arg-type]


def _self_pair(
    prompt_id: str, reference: str, judged: Mapping[str, Mapping[str, JudgeRow]], name: str
) -> JudgeRow:
    """The reference's answer against itself: a tie at the reference's own outcome (taken from
    any labelled pair of this prompt), or no label when no pair of it was labelled."""
    for rows in judged.values():
        row = rows.get(prompt_id)
        if row is not None and row.status == "label":
            x = row.reference_outcome if row.judge == "reference" else 0.5
            return JudgeRow(prompt_id, name, reference, row.judge, row.version, "label", x, x)
    return JudgeRow(prompt_id, name, reference, None, None, "no-label", None, None)


def _combined(
    combo: Combination,
    spec: TrialSpec,
    prompts: Sequence[TrialPrompt],
    scores: np.ndarray,
    store: TrialStore,
    judged: Mapping[str, Mapping[str, JudgeRow]],
    ok: Callable[[str], dict[str, Measurement]],
    ref: Mapping[str, Measurement],
    prices: Mapping[str, Price],
    confidence: float,
) -> Row:
    refname = spec.reference.name
    measured = {t: ok(t) for t in (combo.small, combo.large)}
    chosen: list[Measurement] = []
    pairs: list[JudgeRow] = []
    picked: Counter[str] = Counter()
    errors = 0
    for p, score in zip(prompts, scores, strict=True):
        tier = combo.small if score < combo.threshold else combo.large
        m = measured[tier].get(p.id)
        if m is None:
            errors += 1
            continue
        picked[tier] += 1
        chosen.append(m)
        if tier == refname:
            pairs.append(_self_pair(p.id, refname, judged, combo.name))
        elif (row := judged.get(tier, {}).get(p.id)) is not None:
            pairs.append(row)
    levers = sorted(
        {c.lever for c in spec.candidates if c.name in (combo.small, combo.large) and c.lever}
    )
    base = _row(
        combo.name, "combined", "+".join(levers) or None, chosen, errors, ref, prices, refname
    )
    return _with(
        base,
        quality=quality(pairs, confidence),
        identical=_identical(chosen, ref, confidence),
        large_share=picked[combo.large] / len(chosen) if chosen else NAN,
        tiers=dict(picked),
    )


def _est(e: Estimate | None, pct: bool = False) -> str:
    if e is None or e.n == 0 or not np.isfinite(e.value):
        return "-"
    if pct:
        return (
            f"{e.value:.0%} [{e.low:.0%}, {e.high:.0%}]" if np.isfinite(e.low) else f"{e.value:.0%}"
        )
    if not np.isfinite(e.low):
        return f"{e.value:+.3f}"
    return f"{e.value:+.3f} [{e.low:+.3f}, {e.high:+.3f}]"


def _ms(s: float) -> str:
    if not np.isfinite(s):
        return "-"
    return f"{s * 1e3:.0f}" if s >= 0.01 else f"{s * 1e3:.2f}"


def _x(v: float) -> str:
    return "-" if not np.isfinite(v) else f"{v:.2f}x"


HEADERS = [
    "row",
    "lever",
    "n",
    "err",
    "ttft p50 ms",
    "itl p50 ms",
    "e2e p50 ms",
    "e2e p95 ms",
    "tokens",
    "$/1k",
    "decode speed",
    "e2e speed",
    "quality delta",
    "win",
    "tie",
    "loss",
    "judged",
    "unparsed",
    "identical",
    "acceptance",
]


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        q = r.quality
        acc = "-" if r.acceptance is None else f"{r.acceptance:.1%}"
        if r.kind == "alone" and r.lever == "speculative" and r.acceptance is None:
            acc = "not exposed"
        label = r.name if r.kind != "combined" else f"{r.name} ({r.large_share:.0%} large)"
        out.append(
            [
                label,
                r.lever or r.kind,
                str(r.prompts),
                str(r.errors),
                _ms(r.ttft_p50_s),
                _ms(r.itl_p50_s),
                _ms(r.e2e_p50_s),
                _ms(r.e2e_p95_s),
                "-" if not np.isfinite(r.completion_tokens) else f"{r.completion_tokens:.1f}",
                "-" if not np.isfinite(r.cost_per_1k) else f"{r.cost_per_1k:.4f}",
                _x(r.decode_speed),
                _x(r.e2e_speed),
                _est(q.delta) if q else "-",
                _est(q.win, True) if q else "-",
                _est(q.tie, True) if q else "-",
                _est(q.loss, True) if q else "-",
                str(q.labelled) if q else "-",
                str(q.unparsed) if q else "-",
                _est(r.identical, True) if r.identical else "-",
                acc,
            ]
        )
    return out
