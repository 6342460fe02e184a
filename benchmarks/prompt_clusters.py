"""Prompt clusters (`cost-router distill clusters`) on the shared RouteLLM prompts: do clusters
fitted on one part find the same workflows in held-out prompts, and what does one assignment cost
on the request path?

    .venv/bin/python benchmarks/prompt_clusters.py [--k 8] [--mmlu 3000] [--seed 0]

Prompts: every GSM8K row and --mmlu MMLU rows drawn at random (seeded), split 70/30 (seeded).
k-means is fitted on the 70% as `distill clusters` fits it (classifiers/cluster_fit.py: the
written graph is checked against scikit-learn on every fitted prompt) and the 30% are assigned
by the ONNX graph, one request at a time as the proxy does. Printed: each cluster's size, share
of GSM8K and top words; how many held-out GSM8K prompts land in the cluster(s) that are GSM8K in
training (a "math word problems" workflow picked by cluster); and the latency of one assignment
(`cluster_text` + one onnxruntime run), p50 and p99.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ from a checkout

from classifiers.cluster_fit import fit_clusters, write_clusters  # noqa: E402
from classifiers.dataset import load_dataset, routellm_data_dir  # noqa: E402
from classifiers.prompt_clusters import PromptClusters, cluster_text  # noqa: E402


def _text(prompt: str) -> str:
    return cluster_text({"messages": [{"role": "user", "content": prompt}]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--mmlu", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data = load_dataset(routellm_data_dir())
    rng = np.random.default_rng(args.seed)
    gsm = np.flatnonzero(data.benchmark == "gsm8k")
    mmlu = np.flatnonzero(data.benchmark == "mmlu")
    rows = np.concatenate([gsm, rng.choice(mmlu, min(args.mmlu, len(mmlu)), replace=False)])
    rng.shuffle(rows)
    cut = int(0.7 * len(rows))
    train, held = rows[:cut], rows[cut:]
    is_gsm = data.benchmark == "gsm8k"
    texts = {int(i): _text(data.prompts[i]) for i in rows}
    train = np.array([i for i in train if texts[int(i)].strip()])
    fitted = fit_clusters([texts[int(i)] for i in train], args.k, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        write_clusters(fitted, Path(tmp) / "clusters.onnx")
        model = PromptClusters.load(Path(tmp) / "clusters.onnx")
    labels = np.array(fitted.labels)
    train_gsm = is_gsm[train]
    print(f"{len(train)} prompts fitted ({int(train_gsm.sum())} GSM8K), {len(held)} held out")
    gsm_clusters = []
    for c in range(args.k):
        members = labels == c
        share = float(train_gsm[members].mean()) if members.any() else 0.0
        if share >= 0.5:
            gsm_clusters.append(c)
        words = " ".join(fitted.terms[c][:6])
        print(f"  cluster {c}: {int(members.sum()):5d} prompts, {share:6.1%} GSM8K  {words}")
    held_texts = [texts[int(i)] for i in held]
    times, got = [], []
    for t in held_texts:
        start = time.perf_counter()
        got.append(model.assign([t])[0])
        times.append(time.perf_counter() - start)
    got_a = np.array(got)
    picked = np.isin(got_a, gsm_clusters)
    held_gsm = is_gsm[held]
    recall = float(picked[held_gsm].mean())
    precision = float(held_gsm[picked].mean()) if picked.any() else float("nan")
    print(
        f"held out: the GSM8K cluster(s) {gsm_clusters} take {recall:.1%} of the "
        f"{int(held_gsm.sum())} GSM8K prompts; {precision:.1%} of what they take is GSM8K"
    )
    ms = np.array(times) * 1e3
    print(
        f"one assignment (cluster_text + onnxruntime), {len(ms)} prompts: p50 "
        f"{np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms; model "
        f"{len(fitted.onnx):,} bytes"
    )


if __name__ == "__main__":
    main()
