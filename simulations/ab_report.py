"""A/B experiment report from the proxy's own traces (and the feedback file).

Per arm: requests (with the arm's share of the experiment's traffic), share routed to the large
tier, cost per 1k requests, latency p50/p95 and mean feedback, each with a 95% confidence
interval; then each arm against the control with the difference, its 95% CI and a significance
test:

| metric | CI per arm | difference CI | test |
|---|---|---|---|
| shares | Wilson | normal (Wald) | chi-square on the 2x2 table |
| cost, feedback (means) | Student t | Welch | Welch t-test |
| latency p50 | order statistics (distribution-free) | bootstrap (percentile) | Mood's median test |
| latency p95 | order statistics | bootstrap (percentile) | bootstrap (two-sided) |

Requests are counted whatever their status; cost counts every request (errors cost 0); latency
uses the successful ones (status < 400).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from classifiers.evaluate import Estimate
from trace_format.feedback import FEEDBACK_FILE, feedback_path_for, load_feedback
from trace_format.reader import TraceFormatError, iter_lines, trace_files

Z95 = 1.959963984540054


class ReportError(ValueError):
    """Missing or unusable input; the message says which."""


@dataclass(frozen=True)
class ArmStats:
    arm: str
    requests: int
    traffic: Estimate
    large_share: Estimate
    cost_per_1k: Estimate
    latency_p50: Estimate
    latency_p95: Estimate
    feedback: Estimate


@dataclass(frozen=True)
class Comparison:
    metric: str
    arm: str
    control: str
    diff: Estimate
    p_value: float
    test: str


@dataclass
class ABReport:
    experiment: str
    control: str
    large_tier: str
    arms: list[ArmStats]
    comparisons: list[Comparison] = field(default_factory=list)
    # Sample-ratio check (needs the configured weights): chi-square of requests per arm against
    # the weights. A tiny p means assignment or logging is broken and the comparison is suspect.
    srm_p: float | None = None

    @property
    def total(self) -> int:
        return sum(a.requests for a in self.arms)


NAN_EST = Estimate(math.nan, math.nan, math.nan, 0)


# ---------------------------------------------------------------- reading


def load_experiment(paths: Iterable[str | Path], experiment: str) -> list[dict[str, Any]]:
    """The experiment's traced requests (those with an arm), through the one trace reader."""
    records: list[dict[str, Any]] = []
    try:
        files = trace_files(paths)
        if not files:
            raise ReportError("no trace files given")
        for path in files:
            # Lines that do not mention the experiment are skipped unparsed: traces are large.
            for _, rec in iter_lines(path, contains=experiment.encode()):
                if rec.get("experiment") == experiment and rec.get("arm"):
                    records.append(rec)
    except TraceFormatError as exc:
        raise ReportError(str(exc)) from None
    return records


def default_feedback_path(paths: Sequence[str | Path]) -> Path:
    first = Path(paths[0])
    return first / FEEDBACK_FILE if first.is_dir() else feedback_path_for(first)


def infer_large_tier(records: list[dict[str, Any]]) -> str:
    """The tier with the highest cost per token in the traces (or one named 'large')."""
    per_token: dict[str, list[float]] = {}
    for r in records:
        tokens = (r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0)
        if r.get("tier") and r.get("cost_usd") is not None and tokens > 0:
            per_token.setdefault(r["tier"], []).append(r["cost_usd"] / tokens)
    if per_token:
        return max(per_token, key=lambda t: float(np.mean(per_token[t])))
    tiers = {r.get("tier") for r in records}
    if "large" in tiers:
        return "large"
    raise ReportError("cannot tell which tier is the large one; pass --large-tier")


# ---------------------------------------------------------------- estimates


def wilson(k: int, n: int) -> Estimate:
    if n == 0:
        return NAN_EST
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
    return Estimate(k / n, float(ci.low), float(ci.high), n)


def mean_ci(x: np.ndarray, scale: float = 1.0) -> Estimate:
    n = len(x)
    if n == 0:
        return NAN_EST
    m = float(np.mean(x)) * scale
    if n < 2:
        return Estimate(m, math.nan, math.nan, n)
    sem = float(stats.sem(x)) * scale
    if np.ptp(x) == 0:
        return Estimate(m, m, m, n)
    lo, hi = stats.t.interval(0.95, n - 1, loc=m, scale=sem)
    return Estimate(m, float(lo), float(hi), n)


def quantile_ci(x: np.ndarray, q: float) -> Estimate:
    n = len(x)
    if n == 0:
        return NAN_EST
    value = float(np.quantile(x, q))
    ci = stats.quantile_test(x, q=value, p=q).confidence_interval(0.95)
    return Estimate(value, float(ci.low), float(ci.high), n)


# ---------------------------------------------------------------- differences


def _diff_shares(k1: int, n1: int, k0: int, n0: int) -> tuple[Estimate, float]:
    if min(n1, n0) == 0:
        return NAN_EST, math.nan
    p1, p0 = k1 / n1, k0 / n0
    se = math.sqrt(p1 * (1 - p1) / n1 + p0 * (1 - p0) / n0)
    d = p1 - p0
    table = np.array([[k1, n1 - k1], [k0, n0 - k0]])
    # Nobody (or everybody) large in both arms: no difference to test.
    degenerate = bool((table.sum(axis=0) == 0).any())
    p = 1.0 if degenerate else float(stats.chi2_contingency(table).pvalue)
    return Estimate(d, d - Z95 * se, d + Z95 * se, n1 + n0), p


def _diff_means(x1: np.ndarray, x0: np.ndarray, scale: float = 1.0) -> tuple[Estimate, float]:
    if min(len(x1), len(x0)) < 2:
        return NAN_EST, math.nan
    d = (float(np.mean(x1)) - float(np.mean(x0))) * scale
    if np.ptp(x1) == 0 and np.ptp(x0) == 0:  # constant samples: t is undefined
        return Estimate(d, d, d, len(x1) + len(x0)), (1.0 if d == 0 else 0.0)
    res = stats.ttest_ind(x1, x0, equal_var=False)
    ci = res.confidence_interval(0.95)
    return Estimate(d, float(ci.low) * scale, float(ci.high) * scale, len(x1) + len(x0)), float(
        res.pvalue
    )


def _diff_quantile(x1: np.ndarray, x0: np.ndarray, q: float, seed: int) -> tuple[Estimate, Any]:
    d = float(np.quantile(x1, q) - np.quantile(x0, q))

    def stat(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.quantile(a, q, axis=axis) - np.quantile(b, q, axis=axis)

    res = stats.bootstrap((x1, x0), stat, n_resamples=999, method="percentile", batch=100,
                          random_state=np.random.default_rng(seed))
    ci = res.confidence_interval
    return Estimate(d, float(ci.low), float(ci.high), len(x1) + len(x0)), res


def _diff_latency(x1: np.ndarray, x0: np.ndarray, q: float, seed: int) -> tuple[Estimate, float]:
    if min(len(x1), len(x0)) < 2:
        return NAN_EST, math.nan
    est, boot = _diff_quantile(x1, x0, q, seed)
    if q == 0.5:
        try:
            return est, float(stats.median_test(x1, x0).pvalue)
        except ValueError:  # every value on one side of the grand median
            return est, 1.0
    dist = np.asarray(boot.bootstrap_distribution)
    p = min(1.0, 2 * min(float(np.mean(dist <= 0)), float(np.mean(dist >= 0))))
    return est, p


# ---------------------------------------------------------------- the report


@dataclass
class _ArmData:
    arm: str
    n: int
    k_large: int
    n_tiered: int
    cost: np.ndarray
    latency: np.ndarray
    feedback: np.ndarray


def _arm_data(arm: str, records: list[dict[str, Any]], large: str,
              feedback: dict[str, float]) -> _ArmData:
    tiered = [r for r in records if r.get("tier")]
    lat = [r["latency_ms"] for r in records
           if r.get("latency_ms") is not None and (r.get("status") or 200) < 400]
    fb = [feedback[r["id"]] if r.get("id") in feedback else r.get("feedback") for r in records]
    return _ArmData(
        arm=arm, n=len(records), k_large=sum(r["tier"] == large for r in tiered),
        n_tiered=len(tiered),
        cost=np.asarray([r.get("cost_usd") or 0.0 for r in records], dtype=np.float64),
        latency=np.asarray(lat, dtype=np.float64),
        feedback=np.asarray([f for f in fb if f is not None], dtype=np.float64),
    )


def _arm_stats(d: _ArmData, total: int) -> ArmStats:
    return ArmStats(
        arm=d.arm, requests=d.n, traffic=wilson(d.n, total),
        large_share=wilson(d.k_large, d.n_tiered), cost_per_1k=mean_ci(d.cost, 1000.0),
        latency_p50=quantile_ci(d.latency, 0.5), latency_p95=quantile_ci(d.latency, 0.95),
        feedback=mean_ci(d.feedback),
    )


def _compare(d: _ArmData, c: _ArmData, seed: int) -> list[Comparison]:
    out = []

    def add(metric: str, result: tuple[Estimate, float], test: str) -> None:
        out.append(Comparison(metric, d.arm, c.arm, result[0], result[1], test))

    add("large_share", _diff_shares(d.k_large, d.n_tiered, c.k_large, c.n_tiered), "chi-square")
    add("cost_per_1k", _diff_means(d.cost, c.cost, 1000.0), "Welch t")
    add("latency_p50_ms", _diff_latency(d.latency, c.latency, 0.5, seed), "Mood median")
    add("latency_p95_ms", _diff_latency(d.latency, c.latency, 0.95, seed), "bootstrap")
    add("feedback", _diff_means(d.feedback, c.feedback), "Welch t")
    return out


def sample_ratio_p(counts: dict[str, int], weights: dict[str, float]) -> float:
    arms = sorted(weights)
    observed = np.asarray([counts.get(a, 0) for a in arms], dtype=np.float64)
    total_w = sum(weights.values())
    expected = np.asarray([observed.sum() * weights[a] / total_w for a in arms])
    if len(arms) < 2 or observed.sum() == 0:
        return 1.0
    return float(stats.chisquare(observed, expected).pvalue)


def build_report(records: list[dict[str, Any]], experiment: str,
                 feedback: dict[str, float] | None = None, large_tier: str | None = None,
                 control: str | None = None, seed: int = 0,
                 weights: dict[str, float] | None = None) -> ABReport:
    if not records:
        raise ReportError(f"no traced requests for experiment {experiment!r}")
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_arm.setdefault(r["arm"], []).append(r)
    arms = sorted(by_arm)
    if control is None:
        control = "control" if "control" in by_arm else arms[0]
    elif control not in by_arm:
        raise ReportError(f"control arm {control!r} has no requests; arms: {arms}")
    large = large_tier or infer_large_tier(records)
    data = {a: _arm_data(a, by_arm[a], large, feedback or {}) for a in arms}
    report = ABReport(experiment, control, large, [_arm_stats(data[a], len(records)) for a in arms])
    for a in arms:
        if a != control:
            report.comparisons += _compare(data[a], data[control], seed)
    if weights:
        unknown = sorted(set(by_arm) - set(weights))
        if unknown:
            raise ReportError(f"traces have arms {unknown} that the config does not list")
        report.srm_p = sample_ratio_p({a: len(by_arm[a]) for a in arms}, weights)
    return report


def report_from_files(traces: Sequence[str | Path], experiment: str,
                      feedback_path: str | Path | None = None, **kw: Any) -> ABReport:
    records = load_experiment(traces, experiment)
    fb_path = Path(feedback_path) if feedback_path else default_feedback_path(traces)
    if feedback_path and not fb_path.exists():
        raise ReportError(f"feedback file not found: {fb_path}")
    return build_report(records, experiment, load_feedback(fb_path), **kw)


# ---------------------------------------------------------------- output


def _fmt(e: Estimate, digits: int = 3, pct: bool = False) -> str:
    if e.n == 0 or math.isnan(e.value):
        return "n/a"
    k = 100.0 if pct else 1.0
    unit = "%" if pct else ""
    if math.isnan(e.low) and math.isnan(e.high):
        return f"{e.value * k:.{digits}f}{unit}"
    # A bound can be undefined (an upper p95 bound needs enough samples): shown as n/a.
    lo, hi = (("n/a" if math.isnan(b) else f"{b * k:.{digits}f}") for b in (e.low, e.high))
    return f"{e.value * k:.{digits}f}{unit} [{lo}, {hi}]"


def _fmt_p(p: float) -> str:
    if math.isnan(p):
        return "n/a"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


ROWS = [
    ("requests", lambda a: f"{a.requests} ({_fmt(a.traffic, 1, pct=True)})"),
    ("share to large", lambda a: _fmt(a.large_share, 1, pct=True)),
    ("cost / 1k req (USD)", lambda a: _fmt(a.cost_per_1k, 4)),
    ("latency p50 (ms)", lambda a: _fmt(a.latency_p50, 1)),
    ("latency p95 (ms)", lambda a: _fmt(a.latency_p95, 1)),
    ("mean feedback", lambda a: _fmt(a.feedback, 3) + (f" n={a.feedback.n}" * bool(a.feedback.n))),
]

DIFF_FORMAT = {"large_share": (1, True), "cost_per_1k": (4, False),
               "latency_p50_ms": (1, False), "latency_p95_ms": (1, False), "feedback": (3, False)}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def format_table(report: ABReport) -> str:
    lines = [f"experiment {report.experiment}: {report.total} requests, control arm "
             f"{report.control!r}, large tier {report.large_tier!r}; values with 95% CI", ""]
    lines += _table(["metric", *[a.arm for a in report.arms]],
                    [[name, *[fn(a) for a in report.arms]] for name, fn in ROWS])
    if report.srm_p is not None:
        verdict = "MISMATCH: check assignment/logging" if report.srm_p < 0.001 else "ok"
        lines += ["", f"traffic split vs configured weights: chi-square p={_fmt_p(report.srm_p)}"
                      f" ({verdict})"]
    if report.comparisons:
        lines += ["", "difference vs control (arm - control), 95% CI, test, p-value", ""]
        rows = []
        for c in report.comparisons:
            digits, pct = DIFF_FORMAT[c.metric]
            sig = "*" if not math.isnan(c.p_value) and c.p_value < 0.05 else ""
            rows.append([c.metric, f"{c.arm} - {c.control}", _fmt(c.diff, digits, pct),
                         c.test, _fmt_p(c.p_value) + sig])
        lines += _table(["metric", "arms", "difference", "test", "p"], rows)
        lines += ["", "* p < 0.05"]
    return "\n".join(lines)


def _json_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # An Estimate keeps the JSON keys this report has always written: value, lo, hi, n.
    d = dict(pairs)
    if d.keys() == {"value", "low", "high", "n"}:
        return {"value": d["value"], "lo": d["low"], "hi": d["high"], "n": d["n"]}
    return d


def to_dict(report: ABReport) -> dict[str, Any]:
    return asdict(report, dict_factory=_json_fields)
