"""Simulator output: aligned text tables, JSON, and charts: a PNG, or an HTML report page (the
report's tables as HTML tables, its notes, and the chart inline below them)."""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulations.sweep import SweepResult, pareto_front


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table; floats get 4 significant digits."""

    def cell(v: Any) -> str:
        if isinstance(v, float | np.floating):
            return f"{v:.4g}"
        return str(v)

    cells = [[cell(v) for v in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    return "\n".join(out)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        return None if not np.isfinite(obj) else float(obj)
    return obj


def write_json(path: str | Path, obj: Any) -> None:
    Path(path).write_text(json.dumps(_jsonable(obj), indent=2) + "\n", encoding="utf-8")


def sweep_json(result: SweepResult) -> dict[str, Any]:
    front = pareto_front(result.cost_per_1k, result.quality)
    return {"points": result.rows(), "pareto": [float(result.thresholds[i]) for i in front]}


@dataclass(frozen=True)
class HtmlTable:
    """A table of an HTML report: the same rows the text report prints."""

    caption: str
    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}"
    "caption{text-align:left;font-weight:600;padding:0.3em 0}"
    "th,td{border:1px solid #ccc;padding:0.25em 0.6em}th{background:#f3f3f3}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "tr:nth-child(even) td{background:#fafafa}p.note{color:#444;max-width:60em}"
    "img{max-width:100%;height:auto}"
)


def _cell_text(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float | np.floating) else str(v)


def _is_number(text: str) -> bool:
    head = text.strip().lstrip("$").split(" ")[0].rstrip("%")
    try:
        float(head)
    except ValueError:
        return False
    return True


def html_table(t: HtmlTable) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    body = []
    for r in t.rows:
        cells = []
        for v in r:
            text = _cell_text(v)
            cls = " class='num'" if _is_number(text) else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<table><caption>{html.escape(t.caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def html_page(
    title: str,
    png: bytes | None,
    tables: Sequence[HtmlTable] = (),
    notes: Sequence[str] = (),
    alt: str = "",
) -> str:
    """A self-contained report page: notes, the report's tables, then the chart (inline PNG)."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
    ]
    parts += [f"<p class='note'>{html.escape(n)}</p>" for n in notes if n]
    parts += [html_table(t) for t in tables]
    if png is not None:
        b64 = base64.b64encode(png).decode("ascii")
        parts.append(
            f"<figure><img alt='{html.escape(alt or title)}' "
            f"src='data:image/png;base64,{b64}'></figure>"
        )
    parts.append("</body></html>\n")
    return "".join(parts)


def _figure_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return buf.getvalue()


def check_chart_path(path: str | Path) -> Path:
    """A chart path must end in .png or .html (checked before any work is done)."""
    p = Path(path)
    if p.suffix.lower() not in (".png", ".html", ".htm"):
        raise ValueError(f"{p}: chart files must end in .png or .html")
    return p


def _save(
    fig: Any,
    path: str | Path,
    title: str,
    tables: Sequence[HtmlTable] = (),
    notes: Sequence[str] = (),
) -> None:
    """A .png: the chart; a .html: the report's tables and notes with the chart below them."""
    import matplotlib.pyplot as plt

    p = check_chart_path(path)
    png = _figure_bytes(fig)
    plt.close(fig)
    if p.suffix.lower() == ".png":
        p.write_bytes(png)
    else:
        p.write_text(html_page(title, png, tables, notes), encoding="utf-8")


def pareto_chart(
    result: SweepResult,
    chosen: int | None,
    path: str | Path,
    title: str,
    tables: Sequence[HtmlTable] = (),
    notes: Sequence[str] = (),
) -> None:
    """Cost per 1k requests vs quality over the sweep, Pareto frontier, chosen threshold marked.
    The HTML page also lists `tables` (the report's) and the Pareto front's points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(result.cost_per_1k, result.quality, ".", color="0.6", label="thresholds")
    front = pareto_front(result.cost_per_1k, result.quality)
    ax.plot(result.cost_per_1k[front], result.quality[front], "-", color="C0", label="Pareto front")
    ax.plot([result.cost_small_per_1k], [result.quality_small], "s", color="C2", label="all small")
    ax.plot([result.cost_large_per_1k], [result.quality_large], "s", color="C3", label="all large")
    if chosen is not None:
        ax.plot(
            [result.cost_per_1k[chosen]],
            [result.quality[chosen]],
            "*",
            ms=14,
            color="C1",
            label=f"chosen t={result.thresholds[chosen]:.3f}",
        )
    ax.set_xlabel("cost, USD per 1,000 requests")
    ax.set_ylabel("quality (mean outcome)")
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    rows = [
        (
            f"{result.thresholds[i]:.3f}",
            float(result.large_share[i]),
            float(result.quality[i]),
            float(result.cost_per_1k[i]),
        )
        for i in front
    ]
    front_table = HtmlTable(
        "Pareto front: the thresholds no other beats on both cost and quality",
        ["threshold", "large share", "quality", "$/1k"],
        rows,
    )
    _save(fig, path, title, [*tables, front_table], notes)


ROUTED_COLOR, OWN_COLOR, CONTEXT_COLOR = "C1", "C0", "0.82"


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(np.asarray(values, dtype=np.float64))
    return v, np.arange(1, v.size + 1) / v.size


def latency_chart(
    latencies: Mapping[str, np.ndarray],
    path: str | Path,
    title: str,
    reference: str | None = None,
    tables: Sequence[HtmlTable] = (),
    notes: Sequence[str] = (),
) -> None:
    """Small multiples of the end-to-end latency CDF: one panel per scenario (its p50 and p95
    marked and in its title) over the other scenarios in light grey, with the `reference`
    scenario (what-if: "routed") dashed in every panel; one shared log-x axis, no legend over
    the lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    names = [n for n, v in latencies.items() if len(v)]
    if not names:
        raise ValueError("no latencies to chart")
    cols = min(4, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(
        nrows,
        cols,
        figsize=(3.4 * cols, 2.7 * nrows + 0.9),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    curves = {n: _cdf(latencies[n]) for n in names}
    for ax, name in zip(axes.flat, names, strict=False):
        for other in names:
            if other not in (name, reference):
                ax.plot(*curves[other], color=CONTEXT_COLOR, lw=0.9)
        if reference in curves and name != reference:
            ax.plot(*curves[reference], color=ROUTED_COLOR, lw=1.2, ls="--")
        own = ROUTED_COLOR if name == reference else OWN_COLOR
        ax.plot(*curves[name], color=own, lw=2.4)
        p50, p95 = np.percentile(latencies[name], [50, 95])
        ax.plot([p50, p95], [0.5, 0.95], "o", color="black", ms=4, zorder=5)
        ax.set_title(
            f"{name}\np50 {p50:.3g} s, p95 {p95:.3g} s",
            fontsize=9,
            fontweight="bold" if name == reference else "normal",
        )
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.supxlabel("end-to-end latency, s (log scale)", fontsize=9)
    fig.supylabel("fraction of requests", fontsize=9)
    fig.suptitle(title, fontsize=11, y=0.995)
    handles = [
        Line2D([], [], color=OWN_COLOR, lw=2.4, label="the panel's scenario"),
        Line2D([], [], color=CONTEXT_COLOR, lw=0.9, label="the other scenarios"),
        Line2D([], [], ls="none", marker="o", color="black", ms=4, label="p50, p95"),
    ]
    if reference in curves:
        handles.insert(
            1,
            Line2D(
                [], [], color=ROUTED_COLOR, lw=1.2, ls="--", label=f"{reference} (for comparison)"
            ),
        )
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=len(handles),
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 0.96),
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    if not tables:
        rows = [
            (n, float(np.percentile(latencies[n], 50)), float(np.percentile(latencies[n], 95)))
            for n in names
        ]
        tables = [HtmlTable("latency per scenario", ["scenario", "p50 s", "p95 s"], rows)]
    _save(fig, path, title, tables, notes)
