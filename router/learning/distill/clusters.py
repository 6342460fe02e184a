"""`cost-router distill clusters`: prompt clusters of a distillation set's rows, for a workflow
that is "prompts like these" (classifiers/prompt_clusters.py, policies/workflow.py).

The rows are the export's (`collect`: the same filters and selector), so a cluster model is fitted
on exactly the prompts the export would keep; its ids then select rows (`distill export
--clusters F --cluster N`) and requests (a policy's `workflows:` entry) alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from classifiers.cluster_fit import ClusterFitError, fit_clusters, write_clusters
from classifiers.prompt_clusters import cluster_text
from router.learning.distill.export import ExportError, ExportOptions, collect


def fit_row_clusters(
    paths: Sequence[Path], options: ExportOptions, k: int, out: Path, *, seed: int = 0
) -> dict[str, Any]:
    """Fit and write the cluster model; its summary (sizes, top terms, rows). Raises
    ExportError for too few rows or words."""
    rows, _dropped, reader = collect(paths, options)
    texts = [cluster_text({"messages": r.messages}) for r in rows]
    try:
        summary = write_clusters(fit_clusters(texts, k, seed=seed), out)
    except ClusterFitError as exc:
        raise ExportError(str(exc)) from None
    return {**summary, "rows": len(rows), "traces_sha256": reader.digest()}
