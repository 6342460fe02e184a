"""`drift report`: per-window drift of routing from the reference it was tuned on, streamed.

Each window (1 h or 1 d, aligned to UTC) accumulates, in bounded memory: the score histogram over
the reference's fixed bins (classifiers/score_reference.py), the large share, the sums of the
quality-retained ratio estimator over labelled requests, and cost. The stream feeds the large-share
CUSUM in arrival order. After the stream, each window is tested (simulations/drift_stats.py:
KS + PSI for score drift, CUSUM for the large share, a one-sided test for quality retained) at
the per-window level that spends the false-alarm budget uniformly over time, and flagged with
its reasons. The report also says which threshold restores the target share on the most recent
labelled window and whether retraining is advised.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from classifiers.score_reference import DEFAULT_BINS, PSI_BINS, ScoreReference, bin_counts, rebin
from classifiers.score_reference import quantile_from_counts as threshold_from_counts
from simulations.drift_limits import DriftLimits
from simulations.drift_sources import DriftBatch
from simulations.drift_stats import (
    BernoulliCusum,
    GaussianCusum,
    RetainedAccumulator,
    RetainedEstimate,
    cusum_limit,
    ks_binned,
    psi,
    window_alpha,
    windows_limit,
)

WINDOWS = {"1h": 3600.0, "1d": 86_400.0}
DETECTORS = 3  # score drift, large share, quality retained: each gets a third of the budget
RECENT_S = 86_400.0  # retraining advice looks at the last day of windows


@dataclass
class WindowAcc:
    start: float
    n: int = 0
    errors: int = 0
    tiered: int = 0
    large: int = 0
    cost: float = 0.0
    costed: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros(DEFAULT_BINS, np.int64))
    retained: RetainedAccumulator = field(default_factory=RetainedAccumulator)
    share_alarms: int = 0
    first_alarm_request: int | None = None  # offset in the stream of the first CUSUM alarm

    def add(self, b: DriftBatch, sel: np.ndarray, bins: int) -> None:
        self.n += int(sel.sum())
        self.errors += int(b.error[sel].sum())
        tiered = sel & b.tiered
        self.tiered += int(tiered.sum())
        self.large += int((tiered & b.large).sum())
        cost = b.cost[sel]
        known = ~np.isnan(cost)
        self.cost += float(cost[known].sum())
        self.costed += int(known.sum())
        score = b.score[sel]
        self.counts += bin_counts(score[~np.isnan(score)], bins)
        lab = sel & ~np.isnan(b.routed_outcome) & ~np.isnan(b.large_outcome)
        self.retained.add(b.routed_outcome[lab], b.large_outcome[lab])


@dataclass(frozen=True)
class WindowRow:
    start: float
    n: int
    scored: int
    psi: float
    ks_p: float
    large_share: float  # NaN: no tiered requests
    target: float | None
    retained: RetainedEstimate | None
    labels: int
    cost_per_1k: float  # NaN: no cost known
    error_rate: float
    share_alarms: int
    first_alarm_request: int | None
    flags: list[str]


@dataclass(frozen=True)
class DriftReport:
    window: str
    windows: list[WindowRow]
    reference_source: str
    reference_n: int
    threshold: float | None
    target: float | None
    alpha: float  # per window and test
    cusum_h: float | None
    quality_h: float
    limits: DriftLimits
    restore: tuple[float, float] | None  # (window start, threshold restoring the target)
    retrain_advised: bool
    advice: list[str]
    requests: int

    @property
    def flagged(self) -> list[WindowRow]:
        return [w for w in self.windows if w.flags]

    @property
    def alert(self) -> bool:
        return bool(self.flagged)


class DriftAccumulator:
    """Feeds batches in arrival order; `report()` tests the windows."""

    def __init__(
        self,
        window: str,
        reference: ScoreReference | None,
        threshold: float | None,
        target: float | None,
        limits: DriftLimits,
    ) -> None:
        if window not in WINDOWS:
            raise ValueError(f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
        self.window, self.width = window, WINDOWS[window]
        self.reference, self.threshold, self.target, self.limits = (
            reference,
            threshold,
            target,
            limits,
        )
        self.bins = reference.bins if reference is not None else DEFAULT_BINS
        self.windows: dict[int, WindowAcc] = {}
        share = limits.false_alarms_per_30_days / DETECTORS
        self.h = cusum_limit(share, limits.requests_per_hour)
        self.quality_h = windows_limit(share, self.width)
        self.cusum = (
            BernoulliCusum(target, limits.share_delta, self.h)
            if target is not None and 0 < target < 1
            else None
        )
        self.seen_tiered = 0
        self.requests = 0

    def add(self, batch: DriftBatch) -> None:
        if not len(batch):
            return
        self.requests += len(batch)
        key = np.floor(batch.time / self.width).astype(np.int64)
        for k in np.unique(key).tolist():
            acc = self.windows.get(k)
            if acc is None:
                acc = self.windows[k] = WindowAcc(
                    start=k * self.width, counts=np.zeros(self.bins, np.int64)
                )
            acc.add(batch, key == k, self.bins)
        if self.cusum is not None:
            tiered = np.flatnonzero(batch.tiered)
            for offset in self.cusum.update(batch.large[tiered]):
                # The alarm belongs to the window of the request that raised it.
                row = tiered[offset - self.seen_tiered]
                acc = self.windows[int(key[row])]
                acc.share_alarms += 1
                if acc.first_alarm_request is None:
                    acc.first_alarm_request = self.requests - len(batch) + int(row)
            self.seen_tiered += len(tiered)

    def report(self) -> DriftReport:
        limits = self.limits
        alpha = window_alpha(self.width, limits.false_alarms_per_30_days, DETECTORS)
        keys = sorted(self.windows)
        ref_counts, ref_source, ref_n = None, "", 0
        if self.reference is not None:
            ref_counts, ref_source, ref_n = (
                self.reference.counts,
                self.reference.source,
                self.reference.n,
            )
        elif keys:
            # No reference: the first window is the baseline the others are compared with.
            first = self.windows[keys[0]]
            if first.counts.sum():
                ref_counts, ref_source, ref_n = (
                    first.counts,
                    "the first window",
                    int(first.counts.sum()),
                )
        quality = GaussianCusum(
            limits.quality_limit, limits.quality_limit - limits.quality_delta, self.quality_h
        )
        rows = [self._row(self.windows[k], ref_counts, alpha, quality) for k in keys]
        restore, advice, retrain = self._advice(rows, keys)
        return DriftReport(
            window=self.window,
            windows=rows,
            reference_source=ref_source,
            reference_n=ref_n,
            threshold=self.threshold,
            target=self.target,
            alpha=alpha,
            cusum_h=self.h if self.cusum is not None else None,
            quality_h=self.quality_h,
            limits=limits,
            restore=restore,
            retrain_advised=retrain,
            advice=advice,
            requests=self.requests,
        )

    def _row(
        self, acc: WindowAcc, ref: np.ndarray | None, alpha: float, quality: GaussianCusum
    ) -> WindowRow:
        limits = self.limits
        flags: list[str] = []
        scored = int(acc.counts.sum())
        p_value = drift = float("nan")
        if ref is not None and scored:
            drift = psi(rebin(ref, PSI_BINS), rebin(acc.counts, PSI_BINS))
            p_value = ks_binned(ref, acc.counts).pvalue
            if drift >= limits.psi_limit and p_value < alpha:
                flags.append(
                    f"score drift: PSI {drift:.3f} >= {limits.psi_limit:g} and KS "
                    f"p {p_value:.2g} < {alpha:.2g}"
                )
        share = acc.large / acc.tiered if acc.tiered else float("nan")
        if acc.share_alarms and self.target is not None:
            flags.append(
                f"large share {share:.1%} vs target {self.target:.1%}: CUSUM alarm "
                f"(h {self.h:.1f}, shift {limits.share_delta:.0%})"
            )
        est = acc.retained.estimate()
        if est is not None and est.n >= limits.min_labels and quality.update(est.value, est.se):
            flags.append(
                f"quality retained {est.value:.3f} [{est.low:.3f}, {est.high:.3f}] "
                f"({est.n} labels): CUSUM over windows (h {self.quality_h:.1f}) finds "
                f"it under {limits.quality_limit:g}, tuned to a drop to "
                f"{limits.quality_limit - limits.quality_delta:.3g}"
            )
        return WindowRow(
            start=acc.start,
            n=acc.n,
            scored=scored,
            psi=drift,
            ks_p=p_value,
            large_share=share,
            target=self.target,
            retained=est,
            labels=acc.retained.n,
            cost_per_1k=acc.cost / acc.costed * 1000 if acc.costed else float("nan"),
            error_rate=acc.errors / acc.n if acc.n else 0.0,
            share_alarms=acc.share_alarms,
            first_alarm_request=acc.first_alarm_request,
            flags=flags,
        )

    def _advice(
        self, rows: list[WindowRow], keys: list[int]
    ) -> tuple[tuple[float, float] | None, list[str], bool]:
        advice: list[str] = []
        if not rows:
            return None, ["no requests in the input"], False
        labelled = [i for i, r in enumerate(rows) if r.labels > 0 and r.scored > 0]
        scored = [i for i, r in enumerate(rows) if r.scored > 0]
        pick = labelled[-1] if labelled else (scored[-1] if scored else None)
        restore = None
        if self.target is not None and pick is not None:
            acc = self.windows[keys[pick]]
            t = threshold_from_counts(acc.counts, self.target)
            restore = (rows[pick].start, t)
            what = "labelled window" if labelled else "window (none is labelled)"
            now = "" if self.threshold is None else f" (now {self.threshold:.4f})"
            advice.append(
                f"threshold {t:.4f} restores the {self.target:.0%} target on the most "
                f"recent {what}{now}"
            )
        last = rows[-1]
        # The quality CUSUM restarts after each alarm, so under a lasting drop it fires every
        # few windows, not every one: look at the last day of windows.
        recent = rows[-max(1, int(RECENT_S // self.width)) :]
        quality_low = any(f.startswith("quality retained") for w in recent for f in w.flags)
        far = not math.isnan(last.psi) and last.psi >= self.limits.retrain_psi
        retrain = quality_low or far
        if quality_low:
            advice.append(
                "retraining advised: quality retained fell below its limit in the last "
                "day of windows; a new threshold alone trades cost for it"
            )
        if far:
            advice.append(
                f"retraining advised: PSI {last.psi:.3f} >= {self.limits.retrain_psi:g}"
                ": today's prompts are far from the reference the model was tuned on"
            )
        if not retrain:
            advice.append(
                "retraining not advised: quality holds"
                + (
                    " and the score distribution is near the reference"
                    if not any(f.startswith("score drift") for f in last.flags)
                    else ""
                )
            )
        return restore, advice, retrain


def build_report(
    batches: Iterable[DriftBatch],
    window: str,
    reference: ScoreReference | None,
    threshold: float | None,
    target: float | None,
    limits: DriftLimits,
) -> DriftReport:
    acc = DriftAccumulator(window, reference, threshold, target, limits)
    for batch in batches:
        acc.add(batch)
    return acc.report()


def report_json(report: DriftReport) -> dict[str, object]:
    def est(e: RetainedEstimate | None) -> dict[str, float] | None:
        return None if e is None else {"value": e.value, "low": e.low, "high": e.high, "n": e.n}

    return {
        "window": report.window,
        "requests": report.requests,
        "reference": {"source": report.reference_source, "n": report.reference_n},
        "threshold": report.threshold,
        "target_large_share": report.target,
        "alpha_per_window_test": report.alpha,
        "cusum_h": report.cusum_h,
        "quality_cusum_h": report.quality_h,
        "limits": report.limits.model_dump(),
        "restore_threshold": None
        if report.restore is None
        else {"window_start": report.restore[0], "threshold": report.restore[1]},
        "retrain_advised": report.retrain_advised,
        "advice": report.advice,
        "alert": report.alert,
        "windows": [
            {
                "start": w.start,
                "n": w.n,
                "scored": w.scored,
                "psi": w.psi,
                "ks_p": w.ks_p,
                "large_share": w.large_share,
                "quality_retained": est(w.retained),
                "labels": w.labels,
                "cost_per_1k": w.cost_per_1k,
                "error_rate": w.error_rate,
                "share_alarms": w.share_alarms,
                "flags": w.flags,
            }
            for w in report.windows
        ],
    }
