"""`kind: replay` (backends/recorded.py): the trace's usage, filled as the simulator fills it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from backends.base import UpstreamClientError, UpstreamResponse
from backends.config import TierConfig
from backends.recorded import RecordedBackend
from backends.tokens import count_tokens
from classifiers.dataset import routellm_data_dir
from simulations.trace import LARGE, SMALL
from simulations.trace_loader import load_trace
from trace_format.reader import TraceFormatError
from trace_format.routellm_csv import DEFAULT_LARGE, DEFAULT_SMALL, CsvFormatError

PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 1.0}
RECORDS: list[dict[str, Any]] = [
    {
        "id": "full",
        "prompt": "Add 2 and 3.",
        "prompt_tokens": 11,
        "completion_tokens": 7,
        "outcomes": {"small": 1.0, "large": 1.0},
    },
    {
        "id": "no-counts",
        "prompt": "Explain the second law of thermodynamics in a sentence.",
        "outcomes": {"small": 0.0, "large": 1.0},
    },
    {
        "id": "chat-only",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name three rivers."},
        ],
        "completion_tokens": 4,
        "outcomes": {"small": 0.5, "large": 1.0},
    },
]


def write_trace(path: Path, records: list[dict[str, Any]] = RECORDS) -> Path:
    lines = [
        json.dumps({"schema_version": 1, "time": float(i), **r}) for i, r in enumerate(records)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tier(trace: Path | str, name: str = "large", model: str = "large") -> TierConfig:
    return TierConfig.model_validate(
        {"name": name, "kind": "replay", "model": model, "replay_trace": str(trace), "price": PRICE}
    )


def ask(backend: RecordedBackend, body: dict[str, Any]) -> UpstreamResponse:
    return asyncio.run(backend.complete("chat/completions", body))


def test_usage_equals_the_simulators_with_one_completion_token_by_default(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    sim = load_trace([trace], default_completion_tokens=1)
    for role, name in ((SMALL, "small"), (LARGE, "large")):
        backend = RecordedBackend(tier(trace, name=name, model=name))
        for i, text in enumerate(sim.texts):
            usage = ask(backend, {"messages": [{"role": "user", "content": text}]}).usage
            expected = (int(sim.prompt_tokens[i]), int(sim.completion_tokens[i, role]))
            assert (usage.prompt_tokens, usage.completion_tokens) == expected, RECORDS[i]["id"]
    # The filled counts are the ones documented: tokens of the prompt text, one completion token.
    backend = RecordedBackend(tier(trace))
    usage = ask(backend, {"prompt": RECORDS[1]["prompt"]}).usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (count_tokens(RECORDS[1]["prompt"]), 1)


def test_a_record_with_messages_only_matches_the_same_conversation(tmp_path: Path) -> None:
    backend = RecordedBackend(tier(write_trace(tmp_path / "t.jsonl")))
    resp = ask(backend, {"messages": RECORDS[2]["messages"]})
    assert resp.usage.completion_tokens == 4
    assert "outcome 1" in resp.body["choices"][0]["message"]["content"]


def test_a_request_not_in_the_trace_is_a_400(tmp_path: Path) -> None:
    backend = RecordedBackend(tier(write_trace(tmp_path / "t.jsonl")))
    with pytest.raises(UpstreamClientError) as info:
        ask(backend, {"messages": [{"role": "user", "content": "never recorded"}]})
    assert info.value.status == 400 and info.value.body["error"]["code"] == "replay_miss"


def test_a_folder_of_traces_is_read_rotated_files_included(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    write_trace(folder / "requests.jsonl", RECORDS[:1])
    write_trace(folder / "requests.jsonl.1", RECORDS[1:2])
    backend = RecordedBackend(tier(folder))
    assert asyncio.run(backend.ready()) == (True, "replaying 2 records")
    assert ask(backend, {"prompt": RECORDS[1]["prompt"]}).usage.completion_tokens == 1


def test_the_tier_must_be_one_of_the_traces_outcome_names(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    with pytest.raises(ValueError, match="outcome names 'small' / 'large'"):
        RecordedBackend(tier(trace, name="mid", model="mid"))
    assert RecordedBackend(tier(trace, name="small", model="m")).tier == "small"  # by name


def test_unreadable_traces_are_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="not found"):
        RecordedBackend(tier(tmp_path / "gsm8k.csv"))
    with pytest.raises(TraceFormatError, match="not found"):
        RecordedBackend(tier(tmp_path / "missing.jsonl"))
    newer = tmp_path / "v9.jsonl"
    newer.write_text(json.dumps({"schema_version": 9, "id": "x", "time": 0.0}) + "\n")
    with pytest.raises(TraceFormatError, match="schema_version 9"):
        RecordedBackend(tier(newer))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no trace records"):
        RecordedBackend(tier(empty))


CSV_ROWS = [  # prompt, small outcome, large outcome, large's recorded answer
    ("What is 7 * 6?", "False", "True", "7 * 6 = 42, so the answer is 42."),
    ("Name the capital of France.", "True", "True", ""),
    ("Leaked benchmark question", "True", "False", "x"),
]


def write_csv(folder: Path) -> Path:
    """A RouteLLM-style CSV (answers for the large model only) with one contaminated prompt."""
    lines = [f"prompt,{DEFAULT_SMALL},{DEFAULT_LARGE},{DEFAULT_LARGE}_response"]
    lines += [",".join(f'"{v}"' for v in row) for row in CSV_ROWS]
    (folder / "contaminated_prompts.jsonl").write_text(
        json.dumps({"eval_prompt": CSV_ROWS[2][0]}) + "\n", encoding="utf-8"
    )
    path = folder / "gsm8k.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_routellm_csv_replays_with_the_simulators_usage(tmp_path: Path) -> None:
    trace = write_csv(tmp_path)
    sim = load_trace([trace], default_completion_tokens=1)
    assert sim.texts == [CSV_ROWS[0][0], CSV_ROWS[1][0]]  # the contaminated row is dropped
    for role, name, model in ((SMALL, "small", DEFAULT_SMALL), (LARGE, "large", DEFAULT_LARGE)):
        backend = RecordedBackend(tier(trace, name=name, model=model))
        assert asyncio.run(backend.ready()) == (True, "replaying 2 records")
        for i, text in enumerate(sim.texts):
            resp = ask(backend, {"messages": [{"role": "user", "content": text}]})
            expected = (int(sim.prompt_tokens[i]), int(sim.completion_tokens[i, role]))
            assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == expected, (name, i)
            content = resp.body["choices"][0]["message"]["content"]
            assert f"outcome {sim.quality[i, role]:g}" in content and "gsm8k.csv: line" in content
    # The recorded answer's tokens for the large model; one token where there is no answer.
    large = RecordedBackend(tier(trace, name="large", model=DEFAULT_LARGE))
    usage = ask(large, {"prompt": CSV_ROWS[0][0]}).usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        count_tokens(CSV_ROWS[0][0]),
        count_tokens(CSV_ROWS[0][3]),
    )
    assert ask(large, {"prompt": CSV_ROWS[1][0]}).usage.completion_tokens == 1
    with pytest.raises(UpstreamClientError):  # contaminated: not replayed, as not simulated
        ask(large, {"prompt": CSV_ROWS[2][0]})


def test_a_csv_tier_is_named_by_role_or_outcome_column(tmp_path: Path) -> None:
    trace = write_csv(tmp_path)
    assert RecordedBackend(tier(trace, name="cheap", model="small")).tier == "cheap"
    assert RecordedBackend(tier(trace, name=DEFAULT_LARGE, model="m")).tier == DEFAULT_LARGE
    with pytest.raises(ValueError, match=f"outcome names '{DEFAULT_SMALL}' / '{DEFAULT_LARGE}'"):
        RecordedBackend(tier(trace, name="mid", model="mid"))
    bad = tmp_path / "bad.csv"
    bad.write_text(f"prompt,{DEFAULT_SMALL}\nq,1\n", encoding="utf-8")
    with pytest.raises(CsvFormatError, match=f"bad.csv: line 1: missing column '{DEFAULT_LARGE}'"):
        RecordedBackend(tier(bad))


def test_a_folder_holding_a_csv_and_its_contamination_file_replays(tmp_path: Path) -> None:
    # `replay_trace: .../routellm/gsm8k`: the folder is walked as the simulator walks it, so the
    # contamination file is not read as a trace and its prompts are refused, not replayed.
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    write_csv(folder)
    large = RecordedBackend(tier(folder, name="large", model=DEFAULT_LARGE))
    assert asyncio.run(large.ready()) == (True, "replaying 2 records")
    content = ask(large, {"prompt": CSV_ROWS[0][0]}).body["choices"][0]["message"]["content"]
    assert "gsm8k.csv: line 2, outcome 1" in content
    with pytest.raises(UpstreamClientError) as info:
        ask(large, {"prompt": CSV_ROWS[2][0]})
    assert info.value.body["error"]["code"] == "replay_miss"
    sim = load_trace([folder], default_completion_tokens=1)
    assert sim.texts == [CSV_ROWS[0][0], CSV_ROWS[1][0]]  # what the simulator replays


def test_the_shared_gsm8k_folder_replays_as_the_simulator_reads_it() -> None:
    folder = routellm_data_dir() / "gsm8k"
    small = RecordedBackend(tier(folder, name="small", model="small"))
    sim = load_trace([folder])
    assert asyncio.run(small.ready()) == (True, f"replaying {len(sim.texts)} records")


def test_a_parquet_trace_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"big\.parquet: Parquet traces are for the sim"):
        RecordedBackend(tier(tmp_path / "big.parquet"))
