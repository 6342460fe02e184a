"""Tables and charts of a drift report: the per-window rows (text, rich and HTML share them), a PNG
(matplotlib: PSI, large share vs target, quality retained with its interval, cost per 1k; flagged
windows shaded) and a self-contained HTML page (notes, the table, the chart)."""

from __future__ import annotations

import io
import math
from datetime import UTC, datetime
from pathlib import Path

from simulations.drift_report import WINDOWS, DriftReport, WindowRow, report_json
from simulations.reports import HtmlTable, html_page, write_json

HEADERS = [
    "window (UTC)",
    "n",
    "PSI",
    "KS p",
    "large share",
    "target",
    "quality retained",
    "labels",
    "cost/1k",
    "flags",
]


def _when(report: DriftReport, start: float) -> str:
    fmt = "%Y-%m-%d %H:00" if report.window == "1h" else "%Y-%m-%d"
    return datetime.fromtimestamp(start, UTC).strftime(fmt)


def _num(value: float, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


def row_cells(report: DriftReport, w: WindowRow) -> list[str]:
    retained = (
        "-"
        if w.retained is None
        else (f"{w.retained.value:.3f} [{w.retained.low:.3f}, {w.retained.high:.3f}]")
    )
    return [
        _when(report, w.start),
        str(w.n),
        _num(w.psi, ".3f"),
        _num(w.ks_p, ".2g"),
        _num(w.large_share, ".1%"),
        "-" if w.target is None else f"{w.target:.1%}",
        retained,
        str(w.labels),
        _num(w.cost_per_1k, ".4f"),
        str(len(w.flags)) if w.flags else "",
    ]


def notes(report: DriftReport) -> list[str]:
    lim = report.limits
    out = [
        f"{report.requests} requests in {len(report.windows)} windows of {report.window}; "
        f"reference: {report.reference_source or 'none'} ({report.reference_n} scores)",
        f"false-alarm budget {lim.false_alarms_per_30_days:g} per 30 days, a third per detector: "
        f"KS at alpha {report.alpha:.2g} per window"
        + (
            ""
            if report.cusum_h is None
            else f"; large-share CUSUM h {report.cusum_h:.2f} for a {lim.share_delta:.0%} shift at "
            f"{lim.requests_per_hour:g} requests/hour"
        )
        + f"; quality CUSUM h {report.quality_h:.2f} over windows with >= {lim.min_labels} "
        "labels",
    ]
    for w in report.flagged:
        out += [f"{_when(report, w.start)}: {reason}" for reason in w.flags]
    out += report.advice
    return out


def render_png(report: DriftReport) -> bytes:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    rows = report.windows
    width = WINDOWS[report.window]
    # Each window's point at its middle, its shading over the whole window.
    x = [datetime.fromtimestamp(w.start + width / 2, UTC) for w in rows]
    fig, axes = plt.subplots(4, 1, figsize=(10, 9), sharex=True)
    psi_ax, share_ax, q_ax, cost_ax = axes
    psi_ax.plot(x, [w.psi for w in rows], marker=".", color="#4c72b0")
    psi_ax.axhline(report.limits.psi_limit, color="#c44e52", ls="--", lw=1)
    psi_ax.set_ylabel("score PSI")
    share_ax.plot(x, [w.large_share * 100 for w in rows], marker=".", color="#dd8452")
    if report.target is not None:
        share_ax.axhline(report.target * 100, color="#555", ls="--", lw=1)
    share_ax.set_ylabel("large share (%)")
    labelled = [(t, w.retained) for t, w in zip(x, rows, strict=True) if w.retained is not None]
    if labelled:
        ts, ests = zip(*labelled, strict=True)
        q_ax.errorbar(
            ts,
            [e.value for e in ests],
            yerr=[[e.value - e.low for e in ests], [e.high - e.value for e in ests]],
            fmt=".",
            color="#55a868",
            capsize=2,
        )
    q_ax.axhline(report.limits.quality_limit, color="#c44e52", ls="--", lw=1)
    q_ax.set_ylabel("quality retained")
    cost_ax.plot(x, [w.cost_per_1k for w in rows], marker=".", color="#8172b2")
    cost_ax.set_ylabel("USD / 1k requests")
    for w in rows:
        if w.flags:
            begin = datetime.fromtimestamp(w.start, UTC)
            end = datetime.fromtimestamp(w.start + width, UTC)
            for ax in axes:
                ax.axvspan(begin, end, color="#c44e52", alpha=0.12, lw=0)
    fig.suptitle(f"drift per {report.window} window (flagged windows shaded)", fontsize=10)
    fig.autofmt_xdate()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render_html(report: DriftReport, png: bytes | None = None) -> str:
    """The page; `png` is the chart when already rendered (rendering is the slow part)."""
    table = HtmlTable(
        "per window (quality retained with its 95% interval)",
        HEADERS,
        [row_cells(report, w) for w in report.windows],
    )
    return html_page(
        "drift report", png or render_png(report), [table], notes(report), alt="drift per window"
    )


def write_outputs(report: DriftReport, out: Path) -> list[Path]:
    """drift.png, drift.html and drift.json in `out` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    png, page, data = out / "drift.png", out / "drift.html", out / "drift.json"
    chart = render_png(report)
    png.write_bytes(chart)
    page.write_text(render_html(report, chart), encoding="utf-8")
    write_json(data, report_json(report))
    return [png, page, data]
