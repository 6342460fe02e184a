"""Charts of an A/B report: a PNG (matplotlib) or a self-contained HTML page (the report's tables
as HTML tables, then the PNG)."""

from __future__ import annotations

import io
import math
from pathlib import Path

from classifiers.evaluate import Estimate
from simulations.ab_report import DIFF_CAPTION, ABReport, arm_table, diff_table, heading, srm_line
from simulations.reports import HtmlTable, html_page

PANELS: list[tuple[str, str, float]] = [
    # (attribute, title, display scale)
    ("large_share", "share to large (%)", 100.0),
    ("cost_per_1k", "cost per 1k requests (USD)", 1.0),
    ("latency_p50", "latency p50 (ms)", 1.0),
    ("latency_p95", "latency p95 (ms)", 1.0),
    ("feedback", "mean feedback", 1.0),
]


def _errors(est: Estimate, k: float) -> tuple[float, float]:
    if math.isnan(est.low) or math.isnan(est.high):
        return 0.0, 0.0
    return max(0.0, (est.value - est.low) * k), max(0.0, (est.high - est.value) * k)


def render_png(report: ABReport) -> bytes:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(3.2 * len(PANELS), 3.4))
    names = [a.arm for a in report.arms]
    for ax, (attr, title, k) in zip(axes, PANELS, strict=True):
        ests: list[Estimate] = [getattr(a, attr) for a in report.arms]
        values = [0.0 if math.isnan(e.value) else e.value * k for e in ests]
        errs = [_errors(e, k) for e in ests]
        ax.bar(
            names,
            values,
            yerr=list(zip(*errs, strict=True)),
            capsize=4,
            color=["#4c72b0" if n == report.control else "#dd8452" for n in names],
        )
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    how = (
        "requests as independent"
        if report.unit == "request"
        else f"cluster bootstrap by {report.unit}"
    )
    fig.suptitle(
        f"experiment {report.experiment}: 95% CIs ({how}), control arm {report.control!r}",
        fontsize=10,
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render_html(report: ABReport) -> str:
    """The report page: the per-arm and difference tables as HTML tables, then the chart."""
    arms_head, arms_rows = arm_table(report)
    tables = [HtmlTable("per arm, with 95% intervals", arms_head, arms_rows)]
    if report.comparisons:
        diff_head, diff_rows = diff_table(report)
        tables.append(HtmlTable(DIFF_CAPTION + " (* p < 0.05)", diff_head, diff_rows))
    notes = [*heading(report), srm_line(report) or ""]
    return html_page(
        f"A/B report: {report.experiment}",
        render_png(report),
        tables,
        notes,
        alt="per-arm metrics with 95% CI",
    )


def write_chart(report: ABReport, out: Path) -> None:
    suffix = out.suffix.lower()
    if suffix == ".png":
        out.write_bytes(render_png(report))
    elif suffix in (".html", ".htm"):
        out.write_text(render_html(report), encoding="utf-8")
    else:
        raise ValueError(f"--out must end in .png or .html, not {out.name!r}")
