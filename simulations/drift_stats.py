"""Drift statistics with a controlled false-alarm rate: PSI, a two-sample KS test on binned
scores, per-window alpha spending, a two-sided Bernoulli CUSUM, and a one-sided test on quality
retained. Used by `drift report` (simulations/drift_report.py), the detection benchmarks and the
proxy's live drift gauges; numpy and the standard library only (no scipy: the proxy imports this
module, and scipy stays off the request path).

How an alarm is decided (docs/monitoring.md, "Sound detection"):

- **Windowed tests, alpha spent uniformly over time.** An operator states a false-alarm budget
  `false_alarms_per_30_days` (default 1). A window of length w then gets the significance level
  alpha_w = budget * w / 30 days / k, for k detectors sharing the budget (Bonferroni over windows
  and detectors): the expected number of false alarms over 30 days of stationary traffic is at
  most the budget, whatever the traffic volume. One hour, budget 1, k = 3: alpha_w = 4.6e-4.
- **Score drift** alarms only when the two-sample KS test rejects at alpha_w AND the PSI is at
  least `psi_limit` (default 0.2, the usual "significant shift" line): with hundreds of thousands of
  scores a KS test rejects differences too small to matter, and PSI alone is a noisy number with an
  upward bias of about (B - 1) * (1/n + 1/m) at small n. Both must agree.
- **Large share off target**: two one-sided Bernoulli CUSUMs on "this request went large",
  in-control share p0 (the target), out-of-control p0 +- delta (default 5 points). Each CUSUM of
  log-likelihood ratios has in-control average run length >= e^h (Wald's bound via the
  likelihood-ratio martingale), so h = ln(2 * N / budget) for N requests in 30 days at the planned
  rate gives at most `budget` false alarms per 30 days. Shifts under about delta / 2 drift the
  statistic down, not up: an indifference zone, by design.
- **Quality retained** (routed mix / all-large on labelled requests, delta-method 95% interval):
  a one-sided Gaussian CUSUM over windows (`GaussianCusum`), in control at `quality_limit`, out
  of control at `quality_limit - quality_delta`, fed each window with at least `min_labels`
  labels; h = ln(windows in 30 days / budget). Evidence adds up across windows, so a drop too
  small for one window's labels is still found a few windows later.

The three detectors (score drift, large share, quality) split the budget in equal parts, so
together they stay within it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from simulations.kolmogorov import kolmogorov_sf

# PSI compares proportions by log ratio; a bin empty on one side would be infinite. Proportions
# are floored at PSI_EPSILON before the sum: an empty bin then adds at most
# p * ln(p / 1e-4) (about 0.92 for p = 0.1), large enough to flag and finite. 1e-4 is the common
# choice in credit-scoring practice, where PSI comes from.
PSI_EPSILON = 1e-4
SECONDS_PER_30_DAYS = 30 * 86_400.0
# The two-sided 95% normal quantile, 1.959963984540054.
Z_975 = NormalDist().inv_cdf(0.975)


def psi(reference: np.ndarray, current: np.ndarray, eps: float = PSI_EPSILON) -> float:
    """Population stability index sum((c - r) * ln(c / r)) of two histograms over the same bins
    (proportions floored at eps). NaN when either is empty."""
    ref = np.asarray(reference, dtype=np.float64)
    cur = np.asarray(current, dtype=np.float64)
    if ref.shape != cur.shape:
        raise ValueError(f"histograms differ in bins: {ref.shape} vs {cur.shape}")
    if ref.sum() <= 0 or cur.sum() <= 0:
        return float("nan")
    r = np.maximum(ref / ref.sum(), eps)
    c = np.maximum(cur / cur.sum(), eps)
    return float(np.sum((c - r) * np.log(c / r)))


@dataclass(frozen=True, slots=True)
class KsResult:
    statistic: float
    pvalue: float


def ks_binned(reference: np.ndarray, current: np.ndarray) -> KsResult:
    """Two-sample Kolmogorov-Smirnov test of two histograms over the same fine bins.

    The statistic is the largest gap between the two binned CDFs: exactly what
    `scipy.stats.ks_2samp` gives for samples placed at the bin centres. The p-value is scipy's
    asymptotic one, `kstwo.sf(D, round(n*m / (n+m)))` (as ks_2samp's method='asymp'; here
    simulations/kolmogorov.py's `kolmogorov_sf`), computed from the counts so a window of a
    million scores costs one pass over the bins. Binning ties scores within a bin, which can
    only shrink D: the test is conservative (fewer false alarms).
    """
    ref = np.asarray(reference, dtype=np.float64)
    cur = np.asarray(current, dtype=np.float64)
    n, m = ref.sum(), cur.sum()
    if n <= 0 or m <= 0:
        return KsResult(float("nan"), float("nan"))
    d = float(np.max(np.abs(np.cumsum(ref) / n - np.cumsum(cur) / m)))
    en = round(n * m / (n + m))
    return KsResult(d, kolmogorov_sf(d, max(int(en), 1)))


def window_alpha(window_s: float, false_alarms_per_30_days: float, tests: int = 1) -> float:
    """Significance level of one test in one window under uniform alpha spending."""
    if window_s <= 0 or false_alarms_per_30_days <= 0 or tests < 1:
        raise ValueError("window, false-alarm budget and number of tests must be positive")
    return min(false_alarms_per_30_days * window_s / SECONDS_PER_30_DAYS / tests, 0.5)


def cusum_limit(false_alarms_per_30_days: float, requests_per_hour: float, sides: int = 2) -> float:
    """Decision limit h of a likelihood-ratio CUSUM: ARL0 >= e^h per side, so h = ln(sides * N /
    budget) for N requests in 30 days keeps false alarms within the budget."""
    requests = requests_per_hour * 24 * 30
    return math.log(max(sides * requests / false_alarms_per_30_days, math.e))


class BernoulliCusum:
    """Two-sided CUSUM on 0/1 events with in-control rate p0 and shift delta.

    `update(events)` takes events in arrival order (a numpy bool array, vectorised: S_t = C_t -
    min(-S_0, min_{s<=t} C_s) for the cumulative log-likelihood ratios C) and returns the offsets
    of the events at which an alarm fired; after an alarm both sides restart at 0.
    """

    def __init__(self, p0: float, delta: float, h: float) -> None:
        if not 0 < p0 < 1:
            raise ValueError(f"in-control share must be in (0, 1), got {p0}")
        self.p0, self.h = p0, h
        up = min(p0 + delta, 1 - 1e-6)
        down = max(p0 - delta, 1e-6)
        # LLR increments for an event (1) and a non-event (0), per side.
        self._inc = [
            (math.log(up / p0), math.log((1 - up) / (1 - p0))),
            (math.log(down / p0), math.log((1 - down) / (1 - p0))),
        ]
        self.state = [0.0, 0.0]
        self.seen = 0

    def update(self, events: np.ndarray) -> list[int]:
        events = np.asarray(events, dtype=bool)
        alarms: list[int] = []
        offset = 0
        # Blocks that double while quiet and shrink after an alarm: once a shift persists, the
        # CUSUM fires every few hundred events, and recomputing the whole rest of a batch after
        # each alarm would cost O(batch) per alarm.
        size = 1024
        while offset < len(events):
            chunk = events[offset : offset + size]
            first: int | None = None
            paths = []
            for side, (yes, no) in enumerate(self._inc):
                c = np.cumsum(np.where(chunk, yes, no))
                s = c - np.minimum(-self.state[side], np.minimum.accumulate(c))
                paths.append(s)
                over = np.flatnonzero(s >= self.h)
                if over.size and (first is None or over[0] < first):
                    first = int(over[0])
            if first is None:
                self.state = [float(p[-1]) for p in paths]
                offset += len(chunk)
                size *= 2
                continue
            alarms.append(self.seen + offset + first)
            self.state = [0.0, 0.0]
            offset += first + 1
            size = 1024
        self.seen += len(events)
        return alarms

    @property
    def statistic(self) -> float:
        """The larger side's current value, in units of h (>= 1 is an alarm)."""
        return max(self.state) / self.h


@dataclass(frozen=True, slots=True)
class RetainedEstimate:
    """Quality retained = mean(routed outcome) / mean(all-large outcome), delta-method 95%."""

    value: float
    low: float
    high: float
    se: float
    n: int


class RetainedAccumulator:
    """Running sums for the ratio estimator of quality retained (bounded memory)."""

    __slots__ = ("n", "sr", "sl", "srr", "sll", "srl")

    def __init__(self) -> None:
        self.n = 0
        self.sr = self.sl = self.srr = self.sll = self.srl = 0.0

    def add(self, routed: np.ndarray, large: np.ndarray) -> None:
        r = np.asarray(routed, dtype=np.float64)
        lg = np.asarray(large, dtype=np.float64)
        self.n += len(r)
        self.sr += float(r.sum())
        self.sl += float(lg.sum())
        self.srr += float((r * r).sum())
        self.sll += float((lg * lg).sum())
        self.srl += float((r * lg).sum())

    def estimate(self) -> RetainedEstimate | None:
        n = self.n
        if n < 2 or self.sl <= 0:
            return None
        mr, ml = self.sr / n, self.sl / n
        ratio = mr / ml
        var_r = max(self.srr / n - mr * mr, 0.0)
        var_l = max(self.sll / n - ml * ml, 0.0)
        cov = self.srl / n - mr * ml
        # Delta method for a ratio of means: Var(R) ~ (var_r - 2R cov + R^2 var_l) / (n ml^2).
        var = max(var_r - 2 * ratio * cov + ratio * ratio * var_l, 0.0) / (n * ml * ml)
        se = math.sqrt(var * n / (n - 1))
        return RetainedEstimate(ratio, ratio - Z_975 * se, ratio + Z_975 * se, se, n)


class GaussianCusum:
    """One-sided CUSUM over windows for a drop in a mean estimated per window with a standard
    error: in control mu0, out of control mu1 < mu0. Each window adds the Gaussian log-likelihood
    ratio ((x - mu0)^2 - (x - mu1)^2) / (2 se^2); it alarms at h and restarts. With exact
    likelihood ratios ARL0 >= e^h windows (Gaussian: the estimate's normal approximation, good
    with the dozens of labels a window needs)."""

    def __init__(self, mu0: float, mu1: float, h: float) -> None:
        if not mu1 < mu0:
            raise ValueError("the out-of-control mean must be below the in-control one")
        self.mu0, self.mu1, self.h = mu0, mu1, h
        self.state = 0.0

    def update(self, x: float, se: float) -> bool:
        var = max(se * se, 1e-12)
        llr = ((x - self.mu0) ** 2 - (x - self.mu1) ** 2) / (2 * var)
        self.state = max(0.0, self.state + llr)
        if self.state >= self.h:
            self.state = 0.0
            return True
        return False


def windows_limit(false_alarms_per_30_days: float, window_s: float) -> float:
    """h of a one-sided CUSUM over windows: ARL0 >= e^h windows = 30 days / budget."""
    windows = SECONDS_PER_30_DAYS / window_s
    return math.log(max(windows / false_alarms_per_30_days, math.e))
