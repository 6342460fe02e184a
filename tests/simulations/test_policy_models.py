"""A policy with its own classifier model (`policies.NAME.model_path`: a promoted canary, an A/B
arm with a candidate model) is replayed with that model, as the proxy routes it, not with the
global one. The canary here is the shipped graph with its card's class values swapped, so it
scores 1 - the shipped score (tests/router/commands/test_promote.py uses the same pair)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from classifiers.config import DEFAULT_MODEL
from simulations.replay import replay, trace_scores
from simulations.trace_loader import load_trace, with_scores
from simulations.tune_report import run_tune
from tests.support.sim import balanced, sim_config, write_jsonl_trace


def inverted_model(folder: Path) -> Path:
    out = folder / "inverted.onnx"
    shutil.copyfile(DEFAULT_MODEL, out)
    card = json.loads(DEFAULT_MODEL.with_suffix(".json").read_text())
    card["class_values"] = card["class_values"][::-1]
    out.with_suffix(".json").write_text(json.dumps(card))
    return out


def test_a_policy_with_its_own_model_is_scored_by_it(tmp_path: Path) -> None:
    write_jsonl_trace(tmp_path / "t.jsonl", 60)
    trace = load_trace([tmp_path / "t.jsonl"])
    canary = {**balanced(0.5), "model_path": str(inverted_model(tmp_path))}
    sim = sim_config(0.5, policies={"canary": canary})
    scores = trace_scores(trace, sim.model_path)  # the global (shipped) model's
    main = replay(sim, trace, scores)
    own = replay(sim, trace, scores, "canary")
    np.testing.assert_allclose(main.scores, scores)
    np.testing.assert_allclose(own.scores, 1 - scores, atol=1e-6)
    tiers = np.asarray(own.tiers)[own.tier_idx]
    assert (tiers == np.where(1 - scores >= 0.5, "large", "small")).all()
    assert (own.tier_idx != main.tier_idx).any()

    # Scores the user gave (a scores file, or recorded ones) are what every policy replays.
    given = tmp_path / "given.jsonl"
    given.write_text(
        "".join(json.dumps({"request_id": rid, "score": 0.9}) + "\n" for rid in trace.units())
    )
    scored = with_scores(trace, given)
    kept = replay(sim, scored, trace_scores(scored, sim.model_path, use_recorded=True), "canary")
    assert (kept.scores == 0.9).all()


def test_tune_sweeps_a_policy_with_its_own_model_on_that_models_scores(tmp_path: Path) -> None:
    write_jsonl_trace(tmp_path / "t.jsonl", 60)
    trace = load_trace([tmp_path / "t.jsonl"])
    canary = {**balanced(0.5), "model_path": str(inverted_model(tmp_path))}
    sim = sim_config(0.5, policies={"canary": canary})
    scores = trace_scores(trace, sim.model_path)
    runs = {
        name: run_tune(sim, trace, ("quality", 0.9), name, 21, 20, 0, False, None, None)[1]
        for name in ("balanced", "canary")
    }
    for name, routed_by in (("balanced", scores), ("canary", 1 - scores)):
        sweep = runs[name].sweep
        expected = [(routed_by >= t - 1e-6).mean() for t in sweep.thresholds]
        np.testing.assert_allclose(sweep.large_share, expected, atol=1.5 / len(scores))
    assert not np.allclose(runs["balanced"].sweep.large_share, runs["canary"].sweep.large_share)
