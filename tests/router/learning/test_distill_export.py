"""`cost-router distill export` on trace folders as the proxy writes them: real GSM8K rows
(benchmarks/distill_gsm8k.py) and hand-made folders with one request per filter, so each drop
reason and each refusal is seen once. No training stack needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from benchmarks.distill_gsm8k import GSM8K, write_traces
from router.cli import app
from router.learning.distill.export import ExportError, ExportOptions, Selector, export
from tests.support.topics import COOKING, MATH
from trace_format.feedback import FEEDBACK_FILE
from trace_format.labels import LABELS_FILE, LabelRecord
from trace_format.shadow import SHADOW_FILE

pytestmark = pytest.mark.skipif(not GSM8K.is_file(), reason="shared GSM8K data not present")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Folder:
    """A trace folder: requests, shadow pairs, labels and feedback, written as the proxy does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def add(
        self,
        prompt: str,
        answer: str | None = "The answer is 4.",
        *,
        team: str = "t",
        session: str | None = None,
        trace: dict[str, Any] | None = None,
        outcomes: dict[str, float] | None = None,
        feedback: float | None = None,
        teacher_side: str = "shadow",
    ) -> str:
        self.n += 1
        rid = f"r{self.n}"
        rec = {
            "schema_version": 1,
            "id": rid,
            "time": 1000.0 + self.n,
            "team": team,
            "policy": "p",
            "status": 200,
            "prompt": prompt,
            "messages": [{"role": "user", "content": prompt}],
            "session": session,
            **(trace or {}),
        }
        teacher = {"tier": "large", "model": "big"}
        other = {"tier": "small", "model": "tiny"}
        if answer is not None:
            teacher["text"], other["text"] = answer, "small says 5"
        primary, shadow = (other, teacher) if teacher_side == "shadow" else (teacher, other)
        pair = {"schema_version": 1, "request_id": rid, "time": rec["time"], "team": team}
        pair |= {"policy": "p", "primary": primary, "shadow": shadow}
        if answer is not None:
            pair["prompt"] = prompt
        with (self.path / "requests.jsonl").open("ab") as fh:
            fh.write(orjson.dumps(rec) + b"\n")
        with (self.path / SHADOW_FILE).open("ab") as fh:
            fh.write(orjson.dumps(pair) + b"\n")
        if outcomes is not None:
            label = LabelRecord(request_id=rid, judge="llm", outcomes=outcomes)
            with (self.path / LABELS_FILE).open("ab") as fh:
                fh.write(label.line())
        if feedback is not None:
            with (self.path / FEEDBACK_FILE).open("ab") as fh:
                fh.write(orjson.dumps({"request_id": rid, "score": feedback}) + b"\n")
        return rid


def test_gsm8k_traces_export_split_by_conversation_with_a_card(tmp_path: Path) -> None:
    write_traces(GSM8K, tmp_path / "traces", 40)
    res = CliRunner().invoke(
        app,
        ["distill", "export", "-t", str(tmp_path / "traces"), "--teacher", "large"]
        + ["--tag", "workflow=gsm8k", "--out", str(tmp_path / "set")],
    )
    assert res.exit_code == 0, res.output
    card = json.loads((tmp_path / "set" / "card.json").read_text())
    c = card["counts"]
    # GPT-4's wrong answers (RouteLLM's grades as reference labels) are judged worse.
    assert c["teacher_answers_read"] == 40 and c["dropped"]["judged worse"] > 0
    assert c["kept"] == 40 - sum(c["dropped"].values())
    assert c["train_rows"] + c["heldout_rows"] == c["kept"] and c["heldout_rows"] >= 1
    assert len(card["traces_sha256"]) == 64 and len(card["sources"]) == 3
    train = _lines(tmp_path / "set" / "train.jsonl")
    held = _lines(tmp_path / "set" / "heldout.jsonl")
    assert len(train) == c["train_rows"] and len(held) == c["heldout_rows"]
    for line in train + held:  # OpenAI chat fine-tuning lines
        roles = [m["role"] for m in line["messages"]]
        assert roles == ["user", "assistant"] and line["messages"][1]["content"]
    traces = _lines(tmp_path / "set" / "heldout-traces" / "requests.jsonl")
    assert [t["prompt"] for t in traces] == [h["messages"][0]["content"] for h in held]
    assert all("reference_answer" in t["metadata"] for t in traces)
    # The trial reads the gold answer where the reference judge reads it live.
    from simulations.levers.prompts import load_prompts

    prompts = load_prompts([tmp_path / "set" / "heldout-traces"])
    assert {p.reference for p in prompts} == {t["metadata"]["reference_answer"] for t in traces}
    table = pq.read_table(tmp_path / "set" / "distill.parquet").to_pylist()
    assert len(table) == c["kept"] and {r["split"] for r in table} == {"train", "heldout"}
    # Another trace folder, another hash.
    write_traces(GSM8K, tmp_path / "traces", 41)
    again = export([tmp_path / "traces"], tmp_path / "set2", ExportOptions(teacher="large"))
    assert again.card["traces_sha256"] != card["traces_sha256"]


def test_each_filter_drops_and_counts(tmp_path: Path) -> None:
    f = Folder(tmp_path / "traces")
    f.add("keep one")
    f.add("keep two", teacher_side="primary")
    f.add("failed", trace={"status": 502, "error": "upstream_status"})
    f.add("cut", trace={"error": "upstream_truncated", "stream": True})
    f.add("declined", "I'm sorry, but I can't help with that.")
    f.add("blank", "   ")
    f.add("worse", outcomes={"large": 0.0, "small": 1.0})
    f.add("tie is kept", outcomes={"large": 0.5, "small": 0.5})
    f.add("disliked", feedback=0.0)
    f.add("KEEP  one")  # the same messages, case and spaces folded
    f.add("secret", team="private")
    f.add("no text", None)
    res = export(
        [f.path],
        tmp_path / "set",
        ExportOptions(teacher="large", content_teams=["t"], heldout_share=0.3),
    )
    d = res.card["counts"]["dropped"]
    assert d == {
        "no stored content": 2,
        "error": 1,
        "truncated": 1,
        "empty": 1,
        "refusal": 1,
        "judged worse": 1,
        "negative feedback": 1,
        "not selected": 0,
        "duplicate": 1,
    }
    kept = _lines(tmp_path / "set" / "train.jsonl") + _lines(tmp_path / "set" / "heldout.jsonl")
    assert sorted(k["messages"][0]["content"] for k in kept) == [
        "keep one",
        "keep two",
        "tie is kept",
    ]


def test_conversations_are_never_split_and_the_selector_applies(tmp_path: Path) -> None:
    f = Folder(tmp_path / "traces")
    for conv in range(6):
        for turn in range(3):
            f.add(f"c{conv} turn {turn}", session=f"s{conv}", trace={"metadata": {"wf": "a"}})
    f.add("other workflow", session="s9", trace={"metadata": {"wf": "b"}})
    res = export(
        [f.path],
        tmp_path / "set",
        ExportOptions(teacher="large", selector=Selector(tags={"wf": "a"}), heldout_share=0.34),
    )
    assert res.card["counts"]["dropped"]["not selected"] == 1
    assert res.card["counts"]["heldout_conversations"] == 3
    rows = pq.read_table(tmp_path / "set" / "distill.parquet").to_pylist()
    by_conv: dict[str, set[str]] = {}
    for r in rows:
        by_conv.setdefault(r["conversation"], set()).add(r["split"])
    assert len(by_conv) == 6 and all(len(s) == 1 for s in by_conv.values())


def _fails(tmp_path: Path, traces: Path, *extra: str) -> str:
    res = CliRunner().invoke(
        app,
        ["distill", "export", "-t", str(traces), "--teacher", "large"]
        + ["--out", str(tmp_path / "set"), *extra],
    )
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


def test_refusals_are_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no shadow records" in _fails(tmp_path, empty)
    assert "not found" in _fails(tmp_path, tmp_path / "missing")
    no_text = Folder(tmp_path / "no-text")
    for i in range(3):
        no_text.add(f"q{i}", None)
    assert "no stored content" in _fails(tmp_path, no_text.path)
    one = Folder(tmp_path / "one")
    one.add("a", session="s")
    one.add("b", session="s")
    assert "too little data: 2 rows in 1 conversation" in _fails(tmp_path, one.path)
    assert "teacher tier 'large'" not in _fails(tmp_path, one.path, "--team", "nobody")
    other = Folder(tmp_path / "other")
    other.add("a")
    res = CliRunner().invoke(
        app, ["distill", "export", "-t", str(other.path), "--teacher", "xl", "-o", str(tmp_path)]
    )
    assert res.exit_code == 2 and "no shadow record has the teacher tier 'xl'" in res.output
    assert "--tag" in _fails(tmp_path, other.path, "--tag", "novalue")
    with pytest.raises(ExportError, match="--heldout"):
        export([other.path], tmp_path / "x", ExportOptions(teacher="large", heldout_share=1.0))


def test_what_if_applies_a_measured_distillation_row(tmp_path: Path) -> None:
    from simulations.latency import TierLatency
    from simulations.levers.levers_file import apply_levers
    from simulations.whatif import Levers

    doc = {"schema": 1, "reference": "base", "prompts": 60, "tiers": {}}
    doc["quantization"] = {"tier": "student", "lever": "distillation", "speed": 1.3}
    doc["quantization"] |= {"quality_delta": 0.05, "cost": 0.5}
    path = tmp_path / "levers.json"
    path.write_text(json.dumps(doc))
    tier = TierLatency(0.1, 0.01)
    levers, notes = apply_levers(Levers(tier, tier), path)
    assert levers.quant_speed == 1.3 and levers.quant_quality_delta == 0.05
    assert levers.quant_cost == 0.5
    assert "distilled small quality +5.0 points [measured: student vs base" in "\n".join(notes)


def test_a_cluster_of_prompts_is_a_workflow_for_the_export(tmp_path: Path) -> None:
    """`distill clusters` fits k-means on the rows the export keeps, as ONNX (checked against
    scikit-learn before it is written); `export --clusters F --cluster N` keeps that cluster."""
    from classifiers.prompt_clusters import NO_CLUSTER, PromptClusters, cluster_text

    f = Folder(tmp_path / "traces")
    for i, prompt in enumerate(MATH + COOKING):
        f.add(prompt, session=f"s{i}")
    model_file = tmp_path / "clusters.onnx"
    res = CliRunner().invoke(
        app,
        ["distill", "clusters", "-t", str(f.path), "--teacher", "large", "--k", "2"]
        + ["--out", str(model_file)],
    )
    assert res.exit_code == 0, res.output
    assert "40 prompts in 2 clusters" in res.output and "cluster 1:" in res.output
    model = PromptClusters.load(model_file)
    math_ids = set(
        model.assign([cluster_text({"messages": [{"role": "user", "content": p}]}) for p in MATH])
    )
    cook_ids = set(
        model.assign(
            [cluster_text({"messages": [{"role": "user", "content": p}]}) for p in COOKING]
        )
    )
    assert len(math_ids) == 1 and len(cook_ids) == 1 and math_ids != cook_ids
    assert model.assign(["zzqx"]) == [NO_CLUSTER]  # no word the model knows: no cluster
    (math_id,) = math_ids
    res = CliRunner().invoke(
        app,
        ["distill", "export", "-t", str(f.path), "--teacher", "large", "--heldout", "0.25"]
        + ["--out", str(tmp_path / "set"), "--clusters", str(model_file)]
        + ["--cluster", str(math_id)],
    )
    assert res.exit_code == 0, res.output
    card = json.loads((tmp_path / "set" / "card.json").read_text())
    assert card["counts"]["dropped"]["not selected"] == len(COOKING)
    assert card["counts"]["kept"] == len(MATH)
    assert card["selector"]["clusters"]["ids"] == [math_id]
    assert card["selector"]["clusters"]["sha256"] == model.sha256
    for extra, says in (
        (["--clusters", str(model_file)], "go together"),
        (["--cluster", "0"], "go together"),
        (["--clusters", str(tmp_path / "nope.onnx"), "--cluster", "0"], "cannot read"),
        (["--clusters", str(model_file), "--cluster", "7"], "has clusters 0..1, not [7]"),
        (["--clusters", str(f.path / "requests.jsonl"), "--cluster", "0"], "not an ONNX model"),
    ):
        assert says in _fails(tmp_path, f.path, *extra)
    few = Folder(tmp_path / "few")
    few.add(MATH[0])
    res = CliRunner().invoke(
        app, ["distill", "clusters", "-t", str(few.path), "--teacher", "large", "--k", "2"]
    )
    assert res.exit_code == 2 and "1 prompts cannot make 2 clusters" in res.output
