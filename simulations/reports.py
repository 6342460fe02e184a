"""Simulator output: aligned text tables, JSON, and charts (PNG, or HTML with the PNG inline)."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Mapping, Sequence
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


def _figure_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return buf.getvalue()


def _save(fig: Any, path: str | Path, title: str, extra_html: str = "") -> None:
    import matplotlib.pyplot as plt

    p = Path(path)
    png = _figure_bytes(fig)
    plt.close(fig)
    if p.suffix.lower() in (".html", ".htm"):
        b64 = base64.b64encode(png).decode("ascii")
        p.write_text(
            f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<h1>{html.escape(title)}</h1><img alt='{html.escape(title)}' "
            f"src='data:image/png;base64,{b64}'>{extra_html}\n",
            encoding="utf-8",
        )
    elif p.suffix.lower() == ".png":
        p.write_bytes(png)
    else:
        raise ValueError(f"{p}: chart files must end in .png or .html")


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(f'{v:.4g}' if isinstance(v, float) else str(v))}</td>" for v in r
        )
        + "</tr>"
        for r in rows
    )
    return f"<table border='1'><tr>{head}</tr>{body}</table>"


def pareto_chart(result: SweepResult, chosen: int | None, path: str | Path, title: str) -> None:
    """Cost per 1k requests vs quality over the sweep, Pareto frontier, chosen threshold marked."""
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
    _save(fig, path, title, _html_table(["threshold", "large share", "quality", "$/1k"], rows))


def latency_chart(latencies: Mapping[str, np.ndarray], path: str | Path, title: str) -> None:
    """Empirical CDF of end-to-end latency per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, values in latencies.items():
        v = np.sort(np.asarray(values))
        if v.size:
            ax.plot(v, np.arange(1, v.size + 1) / v.size, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency, s (log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    rows = [
        (name, float(np.percentile(v, 50)), float(np.percentile(v, 95)))
        for name, v in latencies.items()
        if len(v)
    ]
    _save(fig, path, title, _html_table(["scenario", "p50 s", "p95 s"], rows))
