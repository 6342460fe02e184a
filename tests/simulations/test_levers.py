"""The lever trial's pieces on real files and real data, without servers: the gold answers of
GSM8K, the result store a rerun resumes from, the intervals, combinations, the gate, levers.json
and what what-if does with it, and the quantize helper's input checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from backends.config import Price
from backends.quantize import QuantizeError, quantized
from router.learning.config import ReferenceJudgeConfig
from router.learning.judges.reference import ReferenceJudge
from simulations.latency import TierLatency
from simulations.levers.gate import Tolerance, verdict
from simulations.levers.levers_file import LeversFileError, apply_levers, write_levers
from simulations.levers.plan import PlanError, load_plan
from simulations.levers.prompts import NoPromptsError, TrialPrompt, load_prompts
from simulations.levers.records import Measurement, TrialTier
from simulations.levers.store import JudgeRow, TrialStore, TrialStoreError
from simulations.levers.summary import Combination, quality, summarize
from simulations.levers.trial import TrialSpec
from simulations.trace import LARGE, SMALL, ReplayTrace
from simulations.whatif import Levers, Scenario, run_scenario
from tests.support.sim import GSM8K

SETTINGS = {"max_tokens": 8, "temperature": 0.0}


def _tier(name: str, price: float, lever: str | None = None) -> TrialTier:
    return TrialTier(
        name,
        "http://127.0.0.1:9/v1",
        name,
        Price(input_per_mtok=price, output_per_mtok=price),
        lever=lever,
    )


def _m(
    pid: str,
    tier: str,
    itl: float,
    e2e: float,
    text: str = "x",
    price: float = 1.0,
    error: str | None = None,
) -> Measurement:
    return Measurement(
        pid,
        tier,
        text,
        e2e / 4,
        itl,
        e2e,
        10,
        8,
        True,
        Price(input_per_mtok=price, output_per_mtok=price).cost(10, 8),
        error,
    )


def _row(
    pid: str, cand: str, ref_o: float | None, cand_o: float | None, status: str = "label"
) -> JudgeRow:
    return JudgeRow(pid, cand, "ref", "reference", "v1", status, ref_o, cand_o)  # type: ignore[arg-type]


def test_gsm8k_gold_answers_are_read_by_the_reference_judge() -> None:
    prompts = load_prompts([GSM8K], n=None)
    sprints = next(p for p in prompts if p.text.startswith("James decides to run 3 sprints"))
    assert sprints.reference is not None and sprints.reference.rstrip().endswith("#### 540")
    judge = ReferenceJudge(ReferenceJudgeConfig(match="numeric"))
    assert judge.matches("So he runs 540 meters.", sprints.reference)
    assert not judge.matches("He runs 180 meters.", sprints.reference)
    # Neither model right: no gold answer (the llm judge's case), never a guessed one.
    without = [p for p in prompts if p.reference is None]
    assert 0 < len(without) < len(prompts) / 2
    # A seeded sample: the same prompts every time, so a rerun resumes on them.
    assert [p.id for p in load_prompts([GSM8K], n=5)] == [p.id for p in load_prompts([GSM8K], 5)]
    assert (
        len(
            {p.id for p in load_prompts([GSM8K], n=5, seed=1)}
            & {p.id for p in load_prompts([GSM8K], n=5)}
        )
        < 5
    )


def test_a_trace_without_prompt_text_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "requests.jsonl"
    trace.write_text(json.dumps({"schema_version": 1, "id": "a", "time": 1.0}) + "\n")
    with pytest.raises(NoPromptsError, match="no prompt text in 1 records"):
        load_prompts([trace])


def test_store_resumes_keeps_failures_for_retry_and_survives_a_cut_line(tmp_path: Path) -> None:
    store = TrialStore(tmp_path, SETTINGS)
    store.add_measurement(_m("p1", "ref", 0.01, 0.1))
    store.add_measurement(_m("p2", "ref", 0.01, 0.1, error="answered 500"))
    store.add_judgement(_row("p1", "cand", 1.0, 0.0))
    store.add_judgement(_row("p2", "cand", None, None, status="failed"))
    store.close()
    with (tmp_path / "requests.jsonl").open("ab") as fh:
        fh.write(b'{"prompt_id": "p3", "tier": "re')  # the run was killed mid-write
    again = TrialStore(tmp_path, SETTINGS)
    assert again.measured("p1", "ref") is not None
    assert again.measured("p2", "ref") is None  # failed: retried
    assert again.measured("p3", "ref") is None  # cut: redone
    assert again.judged("p1", "cand") and not again.judged("p2", "cand")
    with pytest.raises(TrialStoreError, match="other settings.*max_tokens 8 -> 16"):
        TrialStore(tmp_path, {**SETTINGS, "max_tokens": 16})


def test_win_tie_loss_shares_and_the_paired_difference_have_intervals() -> None:
    rows = (
        [_row(f"w{i}", "c", 0.0, 1.0) for i in range(2)]
        + [_row(f"t{i}", "c", 1.0, 1.0) for i in range(6)]
        + [_row(f"l{i}", "c", 1.0, 0.0) for i in range(2)]
        + [
            _row("u", "c", None, None, "unparsed"),
            _row("f", "c", None, None, "failed"),
            _row("n", "c", None, None, "no-label"),
        ]
    )
    q = quality(rows, 0.95)
    assert (q.labelled, q.unparsed, q.failed, q.unlabelled) == (10, 1, 1, 1)
    assert (q.win.value, q.tie.value, q.loss.value) == (0.2, 0.6, 0.2)
    assert q.win.low < 0.2 < q.win.high and q.tie.low < 0.6 < q.tie.high  # Wilson
    assert q.delta.value == 0.0 and q.delta.low < 0 < q.delta.high
    narrow = quality(rows, 0.5)
    assert narrow.delta.high - narrow.delta.low < q.delta.high - q.delta.low


def _filled(tmp_path: Path, n: int, losses: int) -> tuple[TrialSpec, list[TrialPrompt], TrialStore]:
    spec = TrialSpec(
        _tier("ref", 10.0), (_tier("cand", 1.0, "quantization"), _tier("spec", 10.0, "speculative"))
    )
    prompts = [TrialPrompt(f"p{i}", f"q{i}", "1", "gsm8k") for i in range(n)]
    store = TrialStore(tmp_path, SETTINGS)
    for i, p in enumerate(prompts):
        store.add_measurement(_m(p.id, "ref", 0.020, 1.0, text=f"a{i}", price=10.0))
        store.add_measurement(_m(p.id, "cand", 0.010, 0.5, text=f"b{i}", price=1.0))
        store.add_measurement(_m(p.id, "spec", 0.025, 1.2, text=f"a{i}", price=10.0))
        store.add_judgement(_row(p.id, "cand", 1.0, 0.0 if i < losses else 1.0))
        store.add_judgement(_row(p.id, "spec", 1.0, 1.0))
    return spec, prompts, store


def test_rows_alone_then_combined_from_the_same_measurements(tmp_path: Path) -> None:
    spec, prompts, store = _filled(tmp_path, 10, losses=2)
    scores = np.array([0.1] * 4 + [0.9] * 6)
    combos = [
        Combination("routed + quantized small", "cand", "ref", 0.5),
        Combination("all together", "cand", "spec", 0.5),
    ]
    rows = summarize(spec, prompts, store, combos, scores)
    assert [(r.name, r.kind) for r in rows] == [
        ("ref", "reference"),
        ("cand", "alone"),
        ("spec", "alone"),
        ("routed + quantized small", "combined"),
        ("all together", "combined"),
    ]
    cand, specrow, routed, together = rows[1:]
    assert cand.decode_speed == pytest.approx(2.0) and cand.e2e_speed == pytest.approx(2.0)
    assert cand.price_ratio == pytest.approx(0.1)
    assert cand.quality is not None and cand.quality.delta.value == pytest.approx(-0.2)
    assert specrow.identical is not None and specrow.identical.value == 1.0
    assert specrow.decode_speed == pytest.approx(0.8)  # slower: a finding, kept as measured
    # Routed: the 4 easy prompts (p0-p3) go to cand, which lost p0 and p1; the rest are the
    # reference itself (ties at its own outcome).
    assert routed.large_share == pytest.approx(0.6) and routed.tiers == {"cand": 4, "ref": 6}
    assert routed.quality is not None and routed.quality.delta.value == pytest.approx(-0.2)
    assert routed.quality.labelled == 10
    assert together.tiers == {"cand": 4, "spec": 6} and together.lever == "quantization+speculative"


def test_the_gate_reads_the_lower_end_of_the_interval(tmp_path: Path) -> None:
    tol = Tolerance(max_quality_loss=0.02, confidence=0.95)
    # 10 ties (no loss) are no evidence: the interval reaches far below -0.02 (issue 25).
    spec, prompts, store = _filled(tmp_path / "a", 10, losses=0)
    v = verdict(summarize(spec, prompts, store)[1], tol)
    assert not v.passed and "too little evidence" in v.reasons[1]
    spec, prompts, store = _filled(tmp_path / "b", 10, losses=1)  # -0.1 on 10 prompts
    v = verdict(summarize(spec, prompts, store)[1], tol)
    assert not v.passed and "lower bound" in v.reasons[0]
    # One loss in 100: the point (-0.01) is within 2 points, the interval's lower end is not.
    spec, prompts, store = _filled(tmp_path / "c", 100, losses=1)
    v = verdict(summarize(spec, prompts, store)[1], tol)
    assert not v.passed and v.reasons[0].startswith("quality delta -0.010, lower bound -0.0")
    v = verdict(summarize(spec, prompts, store)[1], Tolerance(max_p95_latency_s=0.1))
    assert not v.passed and "p95 latency 0.500 s > 0.1 s" in v.reasons[0]


def test_levers_json_feeds_what_if_and_names_what_is_assumed(tmp_path: Path) -> None:
    spec, prompts, store = _filled(tmp_path, 10, losses=2)
    path = tmp_path / "levers.json"
    write_levers(path, summarize(spec, prompts, store), len(prompts))
    base = Levers(small=TierLatency(0.1, 0.01, 4), large=TierLatency(0.4, 0.025, 4))
    levers, notes = apply_levers(base, path)
    assert levers.quant_speed == pytest.approx(2.0)
    # The measured change is applied in points (-0.2 here), not as the ratio of the two means.
    assert levers.quant_quality_delta == pytest.approx(-0.2)
    assert levers.quant_quality == base.quant_quality
    assert any("quantized small quality -20.0 points [measured: cand vs ref" in n for n in notes)
    assert levers.quant_cost == pytest.approx(0.1)
    assert levers.spec_speedup == pytest.approx(0.8)
    assert levers.spec_acceptance == base.spec_acceptance  # llama.cpp exposes none
    assert any(n.startswith("spec acceptance 0.7 [assumed") for n in notes)
    assert any("quantized small speed x 2 [measured: cand vs ref" in n for n in notes)
    # What-if applies the measured speed-up as is, also when it is a slow-down.
    n = 3
    trace = ReplayTrace(
        texts=["a"] * n,
        quality=np.ones((n, 2)),
        prompt_tokens=np.full(n, 10),
        completion_tokens=np.full((n, 2), 100),
    )
    arrivals, cost, large = np.arange(n) * 100.0, np.ones((n, 2)), np.full(n, LARGE)
    slow = run_scenario(
        Scenario("spec", "alone", large, False, True), trace, arrivals, levers, cost
    )
    plain = run_scenario(
        Scenario("plain", "alone", large, False, False), trace, arrivals, levers, cost
    )
    assert slow.latency.percentiles()["p50_s"] == pytest.approx(
        plain.latency.percentiles()["p50_s"] + 100 * 0.025 * (1 / 0.8 - 1)
    )
    # ... added to each small-tier outcome, clipped to [0, 1].
    small = np.full(n, SMALL)
    quant = run_scenario(Scenario("q", "alone", small, True, False), trace, arrivals, levers, cost)
    assert quant.quality == pytest.approx(0.8)
    path.write_text(json.dumps({"schema": 2}))
    with pytest.raises(LeversFileError, match="not a levers.json of schema 1"):
        apply_levers(base, path)


def test_plan_errors_name_the_file_and_key(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("reference: a\ncandidates: [{tier: b, lever: pruning}]\n")
    with pytest.raises(PlanError, match=r"plan.yaml: candidates.0.lever: Input should be"):
        load_plan(plan)
    plan.write_text("reference: a\ncandidates: [{tier: a}]\n")
    with pytest.raises(PlanError, match="not the reference"):
        load_plan(plan)


def test_quantize_checks_its_input(tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match="expected one of Q2_K"):
        quantized(tmp_path / "m.gguf", "Q1")
    with pytest.raises(QuantizeError, match="no such model file"):
        quantized(tmp_path / "m.gguf", "Q2_K", cache=tmp_path)
