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

The table above treats requests as independent, which they are only when each request is
assigned on its own. When the experiment assigns teams, keys, users, a header or sessions
(`experiments[].unit`, the default is `team`), one unit's requests share an arm and tend to
resemble each other, so the per-request intervals are too narrow. Then every interval and p-value
comes from a **cluster bootstrap**: whole units are resampled with replacement within each arm
(999 resamples), the difference's interval is the percentile interval of the resampled
differences and its p-value the two-sided bootstrap p; the traffic split is checked on units per
arm.

The unit is, in order: `unit="request"` when asked for (`ab report --unit request`); what the
traces record (`ab_unit` and `ab_unit_id`: the unit that assigned each request's arm, which for
`user` is the request body's `user`, not the API key's user in the `user` field); for traces from
before those fields, the config's unit (`--config` or `--unit`) read from the trace's own field
(`team`, `key_id`, `user`, `session`), else one inferred from the traces: the coarsest of those
fields whose every value stays in one arm. The report says which unit it resampled and why.

It refuses, rather than print, an interval it cannot compute: a unit found in two arms (the field
is not what assigned them), fewer than 2 units in an arm, or a metric with no variance (its
interval and p-value are shown as not computed, with the reason).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
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


class Unanswerable(ReportError):
    """The traces are readable but hold no interval to give (too few units, a unit in two arms,
    a unit they do not record): the message says why, and nothing is printed in its place."""


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
    units: int = 0  # assignment units (teams, keys, users) in the arm; = requests per request


@dataclass(frozen=True)
class Comparison:
    metric: str
    arm: str
    control: str
    diff: Estimate
    p_value: float
    test: str
    note: str = ""  # why no interval or p-value was computed (they are NaN then)


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
    # What was resampled: "request" (independent requests) or the assignment unit ("team", "key",
    # "user": cluster bootstrap), and why that unit (config or inferred).
    unit: str = "request"
    unit_source: str = ""
    unit_note: str = ""  # what was assumed of older traces (resolve_unit), or ""

    @property
    def total(self) -> int:
        return sum(a.requests for a in self.arms)


NAN_EST = Estimate(math.nan, math.nan, math.nan, 0)
RESAMPLES = 999
# Trace fields of traces from before `ab_unit_id`: where each unit's value may be found
# (policies/experiments.py UnitContext). The `user` field is the API key's user, which is the
# assignment's only when the request body carried none.
UNIT_FIELDS = {"team": "team", "key": "key_id", "user": "user", "session": "session"}
# Units whose values traces before `ab_unit_id` do not record at all.
UNRECORDED = ("header",)
KNOWN_UNITS = ("request", *UNIT_FIELDS, *UNRECORDED)
NO_VARIANCE = "not computed: no variance"


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
    if _flat(x):  # every value the same: no interval to claim (not a zero-width one)
        return Estimate(m, math.nan, math.nan, n)
    lo, hi = stats.t.interval(0.95, n - 1, loc=m, scale=sem)
    return Estimate(m, float(lo), float(hi), n)


def quantile_ci(x: np.ndarray, q: float) -> Estimate:
    n = len(x)
    if n == 0:
        return NAN_EST
    value = float(np.quantile(x, q))
    if _flat(x):
        return Estimate(value, math.nan, math.nan, n)
    ci = stats.quantile_test(x, q=value, p=q).confidence_interval(0.95)
    return Estimate(value, float(ci.low), float(ci.high), n)


# ---------------------------------------------------------------- differences


def _flat(x: np.ndarray) -> bool:
    """No spread: every value the same, to rounding (resampled means of equal values differ in
    the last bits)."""
    return x.size == 0 or float(np.ptp(x)) <= 1e-9 * max(1.0, float(np.max(np.abs(x))))


def _diff_shares(k1: int, n1: int, k0: int, n0: int) -> tuple[Estimate, float]:
    if min(n1, n0) == 0:
        return NAN_EST, math.nan
    p1, p0 = k1 / n1, k0 / n0
    se = math.sqrt(p1 * (1 - p1) / n1 + p0 * (1 - p0) / n0)
    d = p1 - p0
    if se == 0:  # every request of each arm on one tier: Wald has nothing to stand on
        return Estimate(d, math.nan, math.nan, n1 + n0), math.nan
    table = np.array([[k1, n1 - k1], [k0, n0 - k0]])
    # Nobody (or everybody) large in both arms: no difference to test.
    degenerate = bool((table.sum(axis=0) == 0).any())
    p = 1.0 if degenerate else float(stats.chi2_contingency(table).pvalue)
    return Estimate(d, d - Z95 * se, d + Z95 * se, n1 + n0), p


def _diff_means(x1: np.ndarray, x0: np.ndarray, scale: float = 1.0) -> tuple[Estimate, float]:
    if min(len(x1), len(x0)) < 2:
        return NAN_EST, math.nan
    d = (float(np.mean(x1)) - float(np.mean(x0))) * scale
    if _flat(x1) and _flat(x0):  # constant samples: t is undefined
        return Estimate(d, math.nan, math.nan, len(x1) + len(x0)), math.nan
    res = stats.ttest_ind(x1, x0, equal_var=False)
    ci = res.confidence_interval(0.95)
    return Estimate(d, float(ci.low) * scale, float(ci.high) * scale, len(x1) + len(x0)), float(
        res.pvalue
    )


def _diff_quantile(x1: np.ndarray, x0: np.ndarray, q: float, seed: int) -> tuple[Estimate, Any]:
    d = float(np.quantile(x1, q) - np.quantile(x0, q))

    def stat(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.quantile(a, q, axis=axis) - np.quantile(b, q, axis=axis)

    res = stats.bootstrap(
        (x1, x0),
        stat,
        n_resamples=999,
        method="percentile",
        batch=100,
        random_state=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Estimate(d, float(ci.low), float(ci.high), len(x1) + len(x0)), res


def _diff_latency(x1: np.ndarray, x0: np.ndarray, q: float, seed: int) -> tuple[Estimate, float]:
    if min(len(x1), len(x0)) < 2:
        return NAN_EST, math.nan
    if _flat(x1) and _flat(x0):
        d = float(x1[0] - x0[0])
        return Estimate(d, math.nan, math.nan, len(x1) + len(x0)), math.nan
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
    # Cluster bootstrap only: each value's assignment unit (0..units-1) and the large flags.
    units: int = 0
    cost_unit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tiered_unit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    is_large: np.ndarray = field(default_factory=lambda: np.zeros(0))
    latency_unit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    feedback_unit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def _ok_latency(r: dict[str, Any]) -> bool:
    return r.get("latency_ms") is not None and (r.get("status") or 200) < 400


def _arm_data(
    arm: str,
    records: list[dict[str, Any]],
    large: str,
    feedback: dict[str, float],
    unit_of: Callable[[dict[str, Any]], Any] | None = None,
) -> _ArmData:
    tiered = [r for r in records if r.get("tier")]
    lat = [r["latency_ms"] for r in records if _ok_latency(r)]
    fb = [feedback[r["id"]] if r.get("id") in feedback else r.get("feedback") for r in records]
    d = _ArmData(
        arm=arm,
        n=len(records),
        k_large=sum(r["tier"] == large for r in tiered),
        n_tiered=len(tiered),
        cost=np.asarray([r.get("cost_usd") or 0.0 for r in records], dtype=np.float64),
        latency=np.asarray(lat, dtype=np.float64),
        feedback=np.asarray([f for f in fb if f is not None], dtype=np.float64),
        units=len(records),
    )
    if unit_of is None:
        return d
    # A record without the unit's value is its own unit (the proxy assigns none such: defensive).
    index: dict[Any, int] = {}
    unit = np.asarray(
        [index.setdefault(unit_of(r) or ("", i), len(index)) for i, r in enumerate(records)],
        dtype=np.int64,
    )
    d.units = len(index)
    d.cost_unit = unit
    d.tiered_unit = unit[[i for i, r in enumerate(records) if r.get("tier")]]
    d.is_large = np.asarray([r["tier"] == large for r in tiered], dtype=np.float64)
    d.latency_unit = unit[[i for i, r in enumerate(records) if _ok_latency(r)]]
    d.feedback_unit = unit[[i for i, f in enumerate(fb) if f is not None]]
    return d


def _arm_stats(d: _ArmData, total: int) -> ArmStats:
    return ArmStats(
        arm=d.arm,
        requests=d.n,
        traffic=wilson(d.n, total),
        large_share=wilson(d.k_large, d.n_tiered),
        cost_per_1k=mean_ci(d.cost, 1000.0),
        latency_p50=quantile_ci(d.latency, 0.5),
        latency_p95=quantile_ci(d.latency, 0.95),
        feedback=mean_ci(d.feedback),
        units=d.units,
    )


def _compare(d: _ArmData, c: _ArmData, seed: int) -> list[Comparison]:
    out = []

    def add(metric: str, result: tuple[Estimate, float], test: str) -> None:
        est, p = result
        note = NO_VARIANCE if est.n and math.isnan(est.low) and not math.isnan(est.value) else ""
        out.append(Comparison(metric, d.arm, c.arm, est, p, test, note))

    add("large_share", _diff_shares(d.k_large, d.n_tiered, c.k_large, c.n_tiered), "chi-square")
    add("cost_per_1k", _diff_means(d.cost, c.cost, 1000.0), "Welch t")
    add("latency_p50_ms", _diff_latency(d.latency, c.latency, 0.5, seed), "Mood median")
    add("latency_p95_ms", _diff_latency(d.latency, c.latency, 0.95, seed), "bootstrap")
    add("feedback", _diff_means(d.feedback, c.feedback), "Welch t")
    return out


# ---------------------------------------------------------------- cluster bootstrap


def _unit_weights(units: int, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """(resamples, units): how often each unit is drawn when `units` are drawn with replacement."""
    return rng.multinomial(units, np.full(units, 1.0 / units), size=resamples).astype(np.float64)


def _ratio(w: np.ndarray, values: np.ndarray, unit: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Per resample: the mean of `values` over the drawn units' requests (NaN if none drawn)."""
    g = w.shape[1]
    num = w @ np.bincount(unit, weights=values, minlength=g)
    den = w @ np.bincount(unit, minlength=g).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan) * scale


def _weighted_quantile(w: np.ndarray, values: np.ndarray, unit: np.ndarray, q: float) -> np.ndarray:
    """Per resample: the q-quantile of the drawn units' values (each drawn as often as its unit).
    Resamples are taken in chunks so memory stays bounded on large traces."""
    out = np.full(w.shape[0], np.nan)
    if values.size == 0:
        return out
    order = np.argsort(values, kind="stable")
    v, u = values[order], unit[order]
    chunk = max(1, 4_000_000 // v.size)
    for lo in range(0, w.shape[0], chunk):
        cum = np.cumsum(w[lo : lo + chunk][:, u], axis=1)  # (chunk, requests), sorted by value
        total = cum[:, -1]
        idx = (cum < (q * total)[:, None]).sum(axis=1)
        ok = total > 0
        out[lo : lo + chunk][ok] = v[np.minimum(idx[ok], v.size - 1)]
    return out


def _replicates(d: _ArmData, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each metric's bootstrap distribution, resampling the arm's units."""
    w = _unit_weights(d.units, rng, RESAMPLES)
    return {
        "large_share": _ratio(w, d.is_large, d.tiered_unit),
        "cost_per_1k": _ratio(w, d.cost, d.cost_unit, 1000.0),
        "latency_p50": _weighted_quantile(w, d.latency, d.latency_unit, 0.5),
        "latency_p95": _weighted_quantile(w, d.latency, d.latency_unit, 0.95),
        "feedback": _ratio(w, d.feedback, d.feedback_unit),
    }


def _percentile_ci(value: float, dist: np.ndarray, n: int) -> Estimate:
    finite = dist[np.isfinite(dist)]
    if n == 0 or math.isnan(value):
        return NAN_EST
    if finite.size < 2 or _flat(finite):  # no spread between resamples: no interval
        return Estimate(value, math.nan, math.nan, n)
    lo, hi = np.percentile(finite, [2.5, 97.5])
    return Estimate(value, float(lo), float(hi), n)


def _bootstrap_p(dist: np.ndarray) -> float:
    finite = dist[np.isfinite(dist)]
    if finite.size == 0 or _flat(finite):  # every resample alike: p would be 0 or 1
        return math.nan
    return min(1.0, 2 * min(float(np.mean(finite <= 0)), float(np.mean(finite >= 0))))


# Each metric: the ArmStats attribute, the Comparison metric name, the point estimate.
_METRICS: list[tuple[str, str, Any]] = [
    ("large_share", "large_share", lambda d: d.k_large / d.n_tiered if d.n_tiered else math.nan),
    ("cost_per_1k", "cost_per_1k", lambda d: float(np.mean(d.cost)) * 1000 if d.n else math.nan),
    (
        "latency_p50",
        "latency_p50_ms",
        lambda d: float(np.quantile(d.latency, 0.5)) if d.latency.size else math.nan,
    ),
    (
        "latency_p95",
        "latency_p95_ms",
        lambda d: float(np.quantile(d.latency, 0.95)) if d.latency.size else math.nan,
    ),
    ("feedback", "feedback", lambda d: float(np.mean(d.feedback)) if d.feedback.size else math.nan),
]


def _metric_n(d: _ArmData, attr: str) -> int:
    if attr.startswith("latency"):
        return int(d.latency.size)
    if attr == "feedback":
        return int(d.feedback.size)
    return int(d.n_tiered if attr == "large_share" else d.n)


def _traffic(
    data: dict[str, _ArmData], rng: np.random.Generator, total: int
) -> dict[str, Estimate]:
    """Each arm's share of the requests, resampling all units of the experiment together."""
    arms = list(data)
    sizes = np.concatenate([np.bincount(data[a].cost_unit, minlength=data[a].units) for a in arms])
    owner = np.concatenate([np.full(data[a].units, i) for i, a in enumerate(arms)])
    w = _unit_weights(sizes.size, rng, RESAMPLES)
    drawn = w @ sizes
    out = {}
    for i, a in enumerate(arms):
        dist = (w @ np.where(owner == i, sizes, 0)) / drawn
        out[a] = _percentile_ci(data[a].n / total, dist, data[a].n)
    return out


def _metric_units(d: _ArmData, attr: str) -> int:
    """The arm's units with at least one value of the metric (a feedback score, a successful
    request's latency): the units its cluster bootstrap actually resamples."""
    of = {"large_share": d.tiered_unit, "cost_per_1k": d.cost_unit, "feedback": d.feedback_unit}
    return int(np.unique(of.get(attr, d.latency_unit)).size)


def few_units_note(unit: str, arm: str, count: int) -> str:
    s = "" if count == 1 else "s"
    return f"not computed: {count} {unit}{s} with a value in arm {arm!r}, fewer than 2"


def _clustered(
    data: dict[str, _ArmData], control: str, total: int, seed: int, unit: str = "unit"
) -> tuple[list[ArmStats], list[Comparison]]:
    """Per-arm estimates and differences from a cluster bootstrap over assignment units. A
    metric that fewer than 2 of an arm's units have a value of (feedback from one user) has no
    spread between units to resample: its difference is not computed, rather than given the
    other arm's spread alone."""
    reps = {
        a: _replicates(d, np.random.default_rng([seed, i])) for i, (a, d) in enumerate(data.items())
    }
    traffic = _traffic(data, np.random.default_rng([seed, len(data)]), total)
    arms = []
    for a, d in data.items():
        est = {
            attr: _percentile_ci(point(d), reps[a][attr], _metric_n(d, attr))
            for attr, _, point in _METRICS
        }
        arms.append(ArmStats(arm=a, requests=d.n, traffic=traffic[a], units=d.units, **est))
    comparisons = []
    c = data[control]
    for a, d in data.items():
        if a == control:
            continue
        for attr, metric, point in _METRICS:
            n1, n0 = _metric_n(d, attr), _metric_n(c, attr)
            if min(n1, n0) == 0:
                comparisons.append(
                    Comparison(metric, a, control, NAN_EST, math.nan, "cluster bootstrap")
                )
                continue
            few = [(arm, k) for arm in (control, a) if (k := _metric_units(data[arm], attr)) < 2]
            if few:
                value = Estimate(point(d) - point(c), math.nan, math.nan, n1 + n0)
                note = few_units_note(unit, *few[0])
                comparisons.append(
                    Comparison(metric, a, control, value, math.nan, "cluster bootstrap", note)
                )
                continue
            dist = reps[a][attr] - reps[control][attr]
            diff = _percentile_ci(point(d) - point(c), dist, n1 + n0)
            note = NO_VARIANCE if math.isnan(diff.low) and not math.isnan(diff.value) else ""
            comparisons.append(
                Comparison(metric, a, control, diff, _bootstrap_p(dist), "cluster bootstrap", note)
            )
    return arms, comparisons


@dataclass(frozen=True)
class Unit:
    """What the report resamples: `kind` ("request" or an experiment unit), why, and each
    record's unit id (None: requests are their own units)."""

    kind: str
    why: str
    of: Callable[[dict[str, Any]], Any] | None = None
    note: str = ""  # what the report had to assume of the traces (older ones), or ""


def resolve_unit(records: list[dict[str, Any]], configured: str | None) -> Unit:
    """The unit to resample (the module docstring's order). `configured`: the experiment's unit
    from the config (or --unit), "request", or None."""
    if configured is not None and configured not in KNOWN_UNITS:
        raise ReportError(
            f"unknown assignment unit {configured!r} (known: {', '.join(KNOWN_UNITS)})"
        )
    if configured == "request":
        return Unit("request", "asked for: each request treated as assigned on its own")
    traced = sorted({str(r["ab_unit"]) for r in records if r.get("ab_unit")})
    if len(traced) > 1:
        raise Unanswerable(
            f"the experiment's traces record requests assigned by {' and by '.join(traced)} "
            "(its unit changed while it ran): report each period on its own"
        )
    if traced:
        return _traced_unit(records, traced[0], configured)
    legacy = "traces from before the assignment unit was recorded (ab_unit)"
    note = f"{legacy}: the unit is read from the trace's own fields"
    if configured in UNRECORDED:
        raise Unanswerable(
            f"the experiment assigns by {configured}, whose values {legacy} do not hold: no "
            "interval can be computed for it (--unit request treats requests as independent, "
            "with intervals too narrow)"
        )
    if configured is not None:
        key = UNIT_FIELDS[configured]
        return Unit(
            configured,
            "the experiment's unit in the config",
            _field(key),
            f"{legacy}: each {configured} is read from the trace field {key!r}",
        )
    best: tuple[int, str] | None = None
    for unit, key in UNIT_FIELDS.items():
        arms: dict[Any, set[str]] = {}
        for r in records:
            value = r.get(key)
            if value is None:
                break
            arms.setdefault(value, set()).add(r["arm"])
        else:
            pure = all(len(a) == 1 for a in arms.values())
            if pure and len(arms) < len(records) and (best is None or len(arms) < best[0]):
                best = (len(arms), unit)
    if best is None:
        return Unit(
            "request",
            "no team, key, user or session stays in one arm in the traces: requests treated "
            "as independent",
            note=note,
        )
    return Unit(
        best[1],
        f"inferred from the traces: every {best[1]}'s requests are in one arm (pass --config "
        "for the experiment's own unit)",
        _field(UNIT_FIELDS[best[1]]),
        note,
    )


def _field(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda r: r.get(key)


def _traced_unit(records: list[dict[str, Any]], kind: str, configured: str | None) -> Unit:
    """The unit the traces record; records written before it was recorded read the same unit
    from their own field where the trace has one (team, key id, session)."""
    why = "recorded in the traces (ab_unit)"
    if configured is not None and configured != kind:
        why += f"; the config says {configured} now"
    old = sum(1 for r in records if not r.get("ab_unit"))
    if not old:
        return Unit(kind, why, lambda r: r.get("ab_unit_id"))
    if kind not in ("team", "key", "session"):
        raise Unanswerable(
            f"{old} of the experiment's {len(records)} traced requests are from before the "
            f"assignment unit was recorded (ab_unit), and the {kind} that assigned them is not "
            "in them: report on the traces written since"
        )
    key = UNIT_FIELDS[kind]
    return Unit(
        kind,
        why,
        lambda r: r.get("ab_unit_id") if r.get("ab_unit") else r.get(key),
        f"{old} records from before ab_unit was recorded: their {kind} is read from the trace "
        f"field {key!r}",
    )


def check_units(unit: Unit, by_arm: dict[str, list[dict[str, Any]]]) -> None:
    """Refuse what no interval can be computed from: a unit in two arms (so not what assigned
    them), or an arm with fewer than 2 units."""
    if unit.of is not None:
        arms: dict[Any, set[str]] = {}
        for arm, records in by_arm.items():
            for r in records:
                if (value := unit.of(r)) is not None:
                    arms.setdefault(value, set()).add(arm)
        mixed = next(((v, a) for v, a in arms.items() if len(a) > 1), None)
        if mixed is not None:
            value, in_arms = mixed
            raise Unanswerable(_mixed_message(unit, value, sorted(in_arms)))
    for arm, records in by_arm.items():
        n = (
            len(records)
            if unit.of is None
            else len({unit.of(r) or i for i, r in enumerate(records)})
        )
        if n < 2:
            raise Unanswerable(
                f"arm {arm!r} has {n} {unit.kind}{'s' * (n != 1)} (the assignment unit, "
                f"{unit.why}): no interval can be computed from fewer than 2 per arm, since one "
                f"{unit.kind}'s requests are not independent"
            )


def _mixed_message(unit: Unit, value: Any, arms: list[str]) -> str:
    text = (
        f"{unit.kind} {value!r} has requests in {len(arms)} arms ({', '.join(arms)}): assignment "
        f"is sticky per {unit.kind}, so this is not the unit that assigned them"
    )
    if unit.kind == "user" and unit.note and "ab_unit" not in unit.why:
        text += (
            " (in traces from before ab_unit, `user` is the API key's user, while the proxy "
            "assigned by the request body's `user`: traces written since record the unit)"
        )
    elif "ab_unit" in unit.why:
        text += " (the experiment's weights or salt changed while it ran: report each period)"
    return text + "; --unit request treats requests as independent"


def sample_ratio_p(counts: dict[str, int], weights: dict[str, float]) -> float:
    arms = sorted(weights)
    observed = np.asarray([counts.get(a, 0) for a in arms], dtype=np.float64)
    total_w = sum(weights.values())
    expected = np.asarray([observed.sum() * weights[a] / total_w for a in arms])
    if len(arms) < 2 or observed.sum() == 0:
        return 1.0
    return float(stats.chisquare(observed, expected).pvalue)


def build_report(
    records: list[dict[str, Any]],
    experiment: str,
    feedback: dict[str, float] | None = None,
    large_tier: str | None = None,
    control: str | None = None,
    seed: int = 0,
    weights: dict[str, float] | None = None,
    unit: str | None = None,
) -> ABReport:
    """`unit`: the experiment's assignment unit (team, key, user, header, session), "request",
    or None (see the module docstring for which unit is resampled)."""
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
    resolved = resolve_unit(records, unit)
    check_units(resolved, by_arm)
    data = {a: _arm_data(a, by_arm[a], large, feedback or {}, resolved.of) for a in arms}
    report = ABReport(
        experiment,
        control,
        large,
        [],
        unit=resolved.kind,
        unit_source=resolved.why,
        unit_note=resolved.note,
    )
    if resolved.of is None:
        report.arms = [_arm_stats(data[a], len(records)) for a in arms]
        for a in arms:
            if a != control:
                report.comparisons += _compare(data[a], data[control], seed)
    else:
        report.arms, report.comparisons = _clustered(
            data, control, len(records), seed, resolved.kind
        )
    if weights:
        unknown = sorted(set(by_arm) - set(weights))
        if unknown:
            raise ReportError(f"traces have arms {unknown} that the config does not list")
        # Assignment hashes units, so the split to check is of units, not of their requests.
        report.srm_p = sample_ratio_p({a: data[a].units for a in arms}, weights)
    return report


def report_from_files(
    traces: Sequence[str | Path],
    experiment: str,
    feedback_path: str | Path | None = None,
    **kw: Any,
) -> ABReport:
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

DIFF_FORMAT = {
    "large_share": (1, True),
    "cost_per_1k": (4, False),
    "latency_p50_ms": (1, False),
    "latency_p95_ms": (1, False),
    "feedback": (3, False),
}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def resampling_note(report: ABReport) -> str:
    """One line: what the intervals resample, and why."""
    if report.unit == "request":
        return f"intervals treat requests as independent ({report.unit_source})"
    units = sum(a.units for a in report.arms)
    return (
        f"assignment unit {report.unit} ({report.unit_source}): intervals and p-values "
        f"resample whole {report.unit}s ({units} {report.unit}s, cluster bootstrap, "
        f"{RESAMPLES} resamples), not requests, since one {report.unit}'s requests are not "
        "independent"
    )


def heading(report: ABReport) -> list[str]:
    return [
        f"experiment {report.experiment}: {report.total} requests, control arm "
        f"{report.control!r}, large tier {report.large_tier!r}; values with 95% CI",
        resampling_note(report),
        *([f"note: {report.unit_note}"] if report.unit_note else []),
    ]


def arm_table(report: ABReport) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the per-arm table, as the text and the HTML report show it."""
    rows = [[name, *[fn(a) for a in report.arms]] for name, fn in ROWS]
    if report.unit != "request":
        rows.insert(1, [f"{report.unit}s", *[str(a.units) for a in report.arms]])
    return ["metric", *[a.arm for a in report.arms]], rows


def srm_line(report: ABReport) -> str | None:
    if report.srm_p is None:
        return None
    verdict = "MISMATCH: check assignment/logging" if report.srm_p < 0.001 else "ok"
    counted = "requests" if report.unit == "request" else f"{report.unit}s"
    return (
        f"traffic split ({counted} per arm) vs configured weights: chi-square "
        f"p={_fmt_p(report.srm_p)} ({verdict})"
    )


DIFF_CAPTION = "difference vs control (arm - control), 95% CI, test, p-value"


def diff_table(report: ABReport) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the differences from the control; a `*` marks p < 0.05."""
    rows = []
    for c in report.comparisons:
        digits, pct = DIFF_FORMAT[c.metric]
        sig = "*" if not math.isnan(c.p_value) and c.p_value < 0.05 else ""
        note = f" ({c.note})" if c.note else ""
        rows.append(
            [
                c.metric,
                f"{c.arm} - {c.control}",
                _fmt(c.diff, digits, pct) + note,
                c.test,
                _fmt_p(c.p_value) + sig,
            ]
        )
    return ["metric", "arms", "difference", "test", "p"], rows


def format_table(report: ABReport) -> str:
    lines = [*heading(report), ""]
    lines += _table(*arm_table(report))
    if (srm := srm_line(report)) is not None:
        lines += ["", srm]
    if report.comparisons:
        lines += ["", DIFF_CAPTION, ""]
        lines += _table(*diff_table(report))
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
