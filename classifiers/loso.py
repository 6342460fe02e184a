"""Leave-one-source-out: how a training recipe does on sources it was not trained on.

In-distribution cross-validation rewards what does not travel (the source prior learns the MMLU
subjects by name). The shipped model meets traffic of other kinds, so its recipe is chosen by
held-out sources: each benchmark held out in turn (train on MMLU, test on GSM8K, and the
reverse), and within a benchmark made of several sources (the MMLU subjects; a trace folder's
files), half the sources trained on and the other half held out, both ways. Each recipe is the
shipped `TrainConfig` with some parts taken out (`RECIPES`); `choose` drops a part only when
held-out sources show it lowers APGR (leaving it out raises the mean, the paired interval above
0): the parts were chosen by in-distribution CV, and held-out sources veto what does not
travel. Offline only (scikit-learn, through classifiers.train).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from classifiers.dataset import RoutingDataset
from classifiers.evaluate import METRICS, Estimate, bootstrap, paired_bootstrap
from classifiers.forked import forked_map, shared
from classifiers.labels import gain_class, known
from classifiers.train import TrainConfig, fit_frame, frame, predict_scores

# The parts of the shipped recipe that a simpler one leaves out, and the simpler recipes.
PARTS: dict[str, dict[str, Any]] = {
    "source_prior": {"prior_weight": 0.0},
    "char_ngrams": {"char_sides": ()},
    "open_weight": {"open_weight": 1.0},
}
RECIPES: dict[str, tuple[str, ...]] = {  # name -> the parts it leaves out
    "shipped": (),
    "no_source_prior": ("source_prior",),
    "no_char_ngrams": ("char_ngrams",),
    "no_open_weight": ("open_weight",),
    "words_only": ("source_prior", "char_ngrams"),
}


def recipe_config(base: TrainConfig, without: tuple[str, ...]) -> TrainConfig:
    overrides: dict[str, Any] = {}
    for part in without:
        overrides.update(PARTS[part])
    return replace(base, **overrides)


@dataclass(frozen=True)
class Holdout:
    name: str  # "gsm8k (trained on mmlu)", "mmlu half 2 (trained on half 1)"
    train: np.ndarray  # row indices into the dataset
    test: np.ndarray


def holdouts(ds: RoutingDataset, seed: int = 0) -> list[Holdout]:
    """Every benchmark held out in turn (when there are 2+), then, within each benchmark of 4+
    sources, a seeded half of its sources against the other half, both ways."""
    rows = np.flatnonzero(known(ds.small, ds.large))
    bench = ds.benchmark[rows].astype(str)
    out: list[Holdout] = []
    names = sorted(set(bench.tolist()))
    if len(names) > 1:
        for name in names:
            others = "+".join(n for n in names if n != name)
            out.append(
                Holdout(f"{name} (trained on {others})", rows[bench != name], rows[bench == name])
            )
    rng = np.random.default_rng(seed)
    for name in names:
        mine = rows[bench == name]
        sources = sorted(set(ds.source[mine].astype(str).tolist()))
        if len(sources) < 4:
            continue
        order = rng.permutation(len(sources))
        half = {sources[i] for i in order[: len(sources) // 2]}
        first = np.asarray([str(s) in half for s in ds.source[mine]])
        out.append(Holdout(f"{name} half 2 (trained on half 1)", mine[first], mine[~first]))
        out.append(Holdout(f"{name} half 1 (trained on half 2)", mine[~first], mine[first]))
    return out


@dataclass(frozen=True)
class Result:
    recipe: str
    holdout: str
    apgr: Estimate
    auc: Estimate
    delta: Estimate | None  # APGR - the first recipe's on the same held-out rows (paired)


@dataclass(frozen=True)
class LosoReport:
    results: list[Result]
    train_rows: dict[str, int]  # per holdout, after `max_train_rows`
    test_rows: dict[str, int]

    def mean_apgr(self) -> dict[str, float]:
        """Per recipe, the mean over holdouts whose APGR is defined (NaN: the held-out rows'
        two models scored the same on average, so there is no gap to recover)."""
        by: dict[str, list[float]] = {}
        for r in self.results:
            by.setdefault(r.recipe, []).append(r.apgr.value)
        return {
            k: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for k, v in by.items()
        }

    def removal_effect(self, recipe: str) -> Estimate | None:
        """What leaving a recipe's parts out does to held-out APGR: the mean over holdouts of
        its paired difference from the first recipe, with a 95% interval that combines the
        holdouts' paired intervals (normal approximation: each interval's half-width / 1.96 is
        its standard error). Holdouts on which the two cannot differ (a paired interval of
        exactly [0, 0]: both score every held-out prompt alike) say nothing and are left out;
        None when no holdout is left."""
        deltas = [
            r.delta
            for r in self.results
            if r.recipe == recipe
            and r.delta is not None
            and np.isfinite(r.delta.value)
            and (r.delta.low, r.delta.high) != (0.0, 0.0)
        ]
        if not deltas:
            return None
        mean = float(np.mean([d.value for d in deltas]))
        se = float(np.sqrt(sum(((d.high - d.low) / (2 * 1.96)) ** 2 for d in deltas)) / len(deltas))
        return Estimate(mean, mean - 1.96 * se, mean + 1.96 * se, sum(d.n for d in deltas))

    def choose(self) -> tuple[str, list[str]]:
        """(the chosen recipe, why). The shipped recipe's parts each earned their place in
        in-distribution cross-validation; held-out sources are the check that a part travels.
        A part is dropped only when leaving it out raises the mean held-out APGR, the combined
        paired interval above 0 (a part shown to lower it); a part not shown to (the interval
        spans 0, or no holdout tells the two apart) is kept. The chosen recipe is the measured
        one that leaves out exactly the dropped parts; when that combination was not measured,
        the best measured recipe among the shipped one and those leaving out a dropped part.
        Without a shipped recipe in the report: the best mean held-out APGR."""
        means = self.mean_apgr()
        base = means.get("shipped")
        if base is None:
            best = max(means, key=lambda k: means[k])
            return best, [f"chosen: {best} (the best mean held-out APGR, {means[best]:.3f})"]
        why, drop = [], set()
        for name, parts in RECIPES.items():
            if len(parts) != 1 or name not in means:
                continue
            effect = self.removal_effect(name)
            if effect is None:
                why.append(f"without {parts[0]}: no holdout tells the two apart -> keep it")
                continue
            lowers = effect.low > 0
            why.append(
                f"without {parts[0]}: mean held-out APGR {effect.value:+.3f} "
                f"[{effect.low:+.3f}, {effect.high:+.3f}] -> "
                f"{'drop it (it lowers held-out APGR)' if lowers else 'keep it'}"
            )
            if lowers:
                drop.add(parts[0])
        chosen = next((n for n, p in RECIPES.items() if set(p) == drop and n in means), None)
        if chosen is None:
            candidates = ["shipped"] + [
                n for n, p in RECIPES.items() if n in means and p and set(p) <= drop
            ]
            chosen = max(candidates, key=lambda k: means[k])
        why.append(f"chosen: {chosen} (mean held-out APGR {means[chosen]:.3f}; shipped {base:.3f})")
        return chosen, why

    def lines(self) -> list[str]:
        first = self.results[0].recipe if self.results else "shipped"
        out = [f"{'recipe':<16} {'held out':<38} {'APGR (95%)':<22} {'AUC':<6} vs {first}"]
        for r in self.results:
            delta = "" if r.delta is None else str(r.delta)
            out.append(f"{r.recipe:<16} {r.holdout:<38} {r.apgr!s:<22} {r.auc.value:<6.3f} {delta}")
        means = self.mean_apgr()
        out.append("mean held-out APGR: " + ", ".join(f"{k} {v:.3f}" for k, v in means.items()))
        out.extend(self.choose()[1])
        return out

    def as_dict(self) -> dict[str, Any]:
        def est(e: Estimate | None) -> dict[str, float] | None:
            return None if e is None else {"value": e.value, "low": e.low, "high": e.high}

        chosen, why = self.choose()
        return {
            "results": [
                {
                    "recipe": r.recipe,
                    "holdout": r.holdout,
                    "apgr": est(r.apgr),
                    "auc": est(r.auc),
                    "apgr_vs_first": est(r.delta),
                }
                for r in self.results
            ],
            "mean_apgr": self.mean_apgr(),
            "train_rows": self.train_rows,
            "test_rows": self.test_rows,
            "chosen": chosen,
            "why": why,
        }


def loso_report(
    ds: RoutingDataset,
    base: TrainConfig,
    recipes: Mapping[str, tuple[str, ...]] = RECIPES,
    rounds: int = 200,
    max_train_rows: int | None = None,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
) -> LosoReport:
    """Fit each recipe on each holdout's training rows (at most `max_train_rows`, a seeded
    sample) and score its held-out rows: APGR and AUC with 95% bootstrap intervals, and the
    paired APGR difference from the first recipe (normally "shipped") on the same rows. With
    `jobs` > 1 the fits run in that many forked worker processes (each fit is independent and
    single-threaded; the results do not depend on `jobs`)."""
    splits = holdouts(ds, base.seed)
    if not splits:
        raise ValueError(
            "leave-one-source-out needs 2+ benchmarks, or one of 4+ sources "
            f"(got {', '.join(ds.benchmarks) or 'none'})"
        )
    rng = np.random.default_rng(base.seed)
    data = frame(ds.prompts)  # once: every fit takes its rows from it
    labels = gain_class(ds.small, ds.large, base.margin)
    train_rows, test_rows, fits = {}, {}, []
    for split in splits:
        train = split.train
        if max_train_rows is not None and len(train) > max_train_rows:
            train = np.sort(rng.choice(train, max_train_rows, replace=False))
        train_rows[split.name], test_rows[split.name] = len(train), len(split.test)
        for name, without in recipes.items():
            fits.append(_Fit(name, split.name, recipe_config(base, without), train, split.test))
    scored = []
    with closing(forked_map(_run_fit, fits, (data, labels, ds.source), jobs)) as scores_of:
        for fit in fits:
            if progress and jobs <= 1:
                progress(f"{fit.recipe}: {fit.holdout}")
            scored.append(next(scores_of))
            if progress and jobs > 1:
                progress(f"{fit.recipe}: {fit.holdout} (done)")
    results: list[Result] = []
    first: dict[str, np.ndarray] = {}
    for fit, scores in zip(fits, scored, strict=True):
        small, large = ds.small[fit.test], ds.large[fit.test]
        delta = None
        if fit.holdout not in first:
            first[fit.holdout] = scores
        else:
            delta = paired_bootstrap(
                METRICS["APGR"], first[fit.holdout], scores, small, large, rounds, base.seed
            )
        results.append(
            Result(
                fit.recipe,
                fit.holdout,
                bootstrap(METRICS["APGR"], scores, small, large, rounds, base.seed),
                bootstrap(METRICS["AUC"], scores, small, large, rounds, base.seed),
                delta,
            )
        )
    return LosoReport(results, train_rows, test_rows)


@dataclass(frozen=True)
class _Fit:
    recipe: str
    holdout: str
    config: TrainConfig
    train: np.ndarray
    test: np.ndarray


def _run_fit(fit: _Fit) -> np.ndarray:
    data, labels, sources = shared()  # (model inputs, labels, sources) of the whole dataset
    pipeline = fit_frame(data.iloc[fit.train], labels[fit.train], fit.config, sources[fit.train])
    return predict_scores(pipeline, data.iloc[fit.test])
