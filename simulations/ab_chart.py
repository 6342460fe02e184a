"""Charts of an A/B report: a PNG (matplotlib) or a self-contained HTML page (table + PNG)."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

from classifiers.evaluate import Estimate
from simulations.ab_report import ABReport, format_table

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
        ax.bar(names, values, yerr=list(zip(*errs, strict=True)), capsize=4,
               color=["#4c72b0" if n == report.control else "#dd8452" for n in names])
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    fig.suptitle(f"experiment {report.experiment}: 95% CIs, control arm {report.control!r}",
                 fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render_html(report: ABReport) -> str:
    png = base64.b64encode(render_png(report)).decode()
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>A/B report: {html.escape(report.experiment)}</title></head><body>"
        f"<h1>A/B report: {html.escape(report.experiment)}</h1>"
        f"<img alt='per-arm metrics with 95% CI' src='data:image/png;base64,{png}'>"
        f"<pre>{html.escape(format_table(report))}</pre></body></html>"
    )


def write_chart(report: ABReport, out: Path) -> None:
    suffix = out.suffix.lower()
    if suffix == ".png":
        out.write_bytes(render_png(report))
    elif suffix in (".html", ".htm"):
        out.write_text(render_html(report), encoding="utf-8")
    else:
        raise ValueError(f"--out must end in .png or .html, not {out.name!r}")
