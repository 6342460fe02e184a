"""Tune on prompts the classifier never saw: the honest version of `cost-router tune`.

The shipped model was trained on all the shared RouteLLM prompts, so tuning on them is in-sample.
Here the data is split in two halves (per benchmark, seeded); a model is trained on one half with
the classifier's own training code (classifiers.train.fit + classifiers.export.export, default
settings) and the simulator tunes the threshold for 95% of all-large quality on the other half.
The shipped model's in-sample figures on the same half are printed beside it.

    .venv/bin/python benchmarks/sim_heldout.py [--seed 0]
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.evaluate import apgr
from classifiers.export import export
from classifiers.train import TrainConfig, fit
from simulations.replay import sweep_inputs, trace_scores, two_tier_policy
from simulations.sim_config import SimConfig, default_sim_config
from simulations.sweep import default_thresholds
from simulations.trace import ReplayTrace, from_dataset
from simulations.tune import Target, tune

DATA = routellm_data_dir()


def _row(name: str, config: SimConfig, trace: ReplayTrace, seed: int) -> str:
    scores = trace_scores(trace, config.model_path)
    inputs = sweep_inputs(config.prices, trace, scores, two_tier_policy(config, None))
    r = tune(inputs, Target("quality", 0.95), default_thresholds(1001), 1000, seed)
    iv = r.intervals
    a = apgr(scores, inputs.quality_small, inputs.quality_large)
    return (
        f"{name:<34} APGR {a:.3f}  threshold {r.threshold:.3f} "
        f"[{iv['threshold'].low:.3f}, {iv['threshold'].high:.3f}]  quality {r.quality_ratio:.1%} "
        f"[{iv['quality_ratio'].low:.1%}, {iv['quality_ratio'].high:.1%}]  large share "
        f"{r.large_share:.1%}  ${r.cost_per_1k:.3f}/1k [{iv['cost_per_1k'].low:.3f}, "
        f"{iv['cost_per_1k'].high:.3f}]  (all-large ${r.sweep.cost_large_per_1k:.3f}/1k)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ds = load_dataset([DATA])
    rng = np.random.default_rng(args.seed)
    train = np.zeros(len(ds), dtype=bool)
    for bench in ds.benchmarks:
        idx = np.flatnonzero(ds.benchmark == bench)
        train[rng.permutation(idx)[: len(idx) // 2]] = True
    held = from_dataset(ds.subset(~train), default_completion_tokens=1)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "half.onnx"
        cfg = TrainConfig(seed=args.seed)
        export(fit(ds.subset(train), cfg), model, {"train_config": cfg.as_dict()})
        shipped = default_sim_config()
        half = replace(shipped, env=replace(shipped.env, model_path=str(model)))
        print(f"held-out half: {len(held)} prompts (trained on the other {int(train.sum())})")
        print(_row("model trained on the other half", half, held, args.seed))
    print(_row("shipped model (in-sample here)", shipped, held, args.seed))


if __name__ == "__main__":
    main()
