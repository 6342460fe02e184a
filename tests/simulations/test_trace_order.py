"""The offline commands read the proxy's own trace folders as written (issue 25, item 5): under
concurrent traffic the proxy writes each record when its request finishes, stamped with the
time it arrived, through its trace sink's size rotation (`requests.jsonl.N` ... `requests.jsonl`),
so the files are in completion order, not arrival order. The folder here is written by the
proxy's own `TraceSink` exactly so: real GSM8K prompts and outcomes, arrivals at 5/s, each
finishing after a latency of up to 4 s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from router.cli import app
from router.observability.trace_sink import TraceSink
from simulations.trace_loader import load_labelled_trace
from tests.support.sim import router_config_dict, write_jsonl_trace
from trace_format.reader import TraceFormatError, data_files, iter_lines_by_time

runner = CliRunner()
N = 120


def _completion_order(records: list[dict[str, Any]], seed: int = 1) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    done = [r["time"] + float(rng.uniform(0.05, 4.0)) for r in records]
    return [records[i] for i in np.argsort(done, kind="stable").tolist()]


def _write_like_the_proxy(folder: Path, records: list[dict[str, Any]]) -> None:
    sink = TraceSink(folder / "requests.jsonl", max_bytes=8_000, backups=50, flush_interval_s=0.01)
    for r in records:
        sink.write(dict(r))
    sink.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    records = write_jsonl_trace(tmp_path / "source.jsonl", N, rate_per_s=5.0)
    (tmp_path / "source.jsonl").unlink()
    out = tmp_path / "traces"
    _write_like_the_proxy(out, _completion_order(records))
    return out


def test_the_folder_is_rotated_and_out_of_time_order(folder: Path) -> None:
    files = data_files(folder)
    assert len(files) > 3 and files[-1].name == "requests.jsonl"
    times = [json.loads(line)["time"] for f in files for line in f.read_text().splitlines()]
    assert len(times) == N and times != sorted(times)


def test_the_loader_puts_the_records_in_arrival_order(folder: Path) -> None:
    trace, _ = load_labelled_trace([folder])
    assert trace.times is not None and len(trace) == N
    assert (np.diff(trace.times) >= 0).all()
    assert sorted(trace.units()) == sorted(f"req-{j}" for j in range(N))
    # The error names still point at each record's file row.
    assert trace.names is not None and all("row" in str(n) for n in trace.names)


def _cli(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def test_what_if_and_budgets_replay_the_folder_as_written(folder: Path, tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    teams = {"alpha": {"budget": {"limit_usd": 0.002, "period": "daily"}}}
    config.write_text(yaml.safe_dump(router_config_dict(threshold=0.3, teams=teams)))
    for extra in ((), ("--arrival-rate", "5")):
        code, out = _cli("what-if", "-t", str(folder), "-c", str(config), *extra)
        assert code == 0, out
        assert f"{N} requests, the trace's arrival times" in out
    out_json = tmp_path / "s.json"
    code, out = _cli(
        "simulate", "-t", str(folder), "-c", str(config), "--budgets", "--json", str(out_json)
    )
    assert code == 0, out
    result = json.loads(out_json.read_text())
    assert result["summary"]["requests"] == N
    assert sum(int(b["requests"]) for b in result["budgets"]) == N


def test_the_bounded_reorder_restores_arrival_order_across_writers(tmp_path: Path) -> None:
    records = write_jsonl_trace(tmp_path / "source.jsonl", N, rate_per_s=5.0)
    (tmp_path / "source.jsonl").unlink()
    # Two replicas, each with its own rotated trace in one folder.
    _write_like_the_proxy(tmp_path / "a", _completion_order(records[::2], seed=2))
    _write_like_the_proxy(tmp_path / "b", _completion_order(records[1::2], seed=3))
    files = data_files(tmp_path)
    rows = list(iter_lines_by_time(files, window_s=5.0))
    times = [d["time"] for _, d in rows]
    assert len(rows) == N and times == sorted(times)
    assert sorted(d["id"] for _, d in rows) == sorted(r["id"] for r in records)
    # Later than the window: refused, naming the line, not silently misordered.
    with pytest.raises(TraceFormatError, match=r"line \d+: time .* reorder window \(1 s"):
        list(iter_lines_by_time(files, window_s=1.0))
    # More records held than the memory bound allows: refused too.
    with pytest.raises(TraceFormatError, match="more than 3 records within 5 s"):
        list(iter_lines_by_time(files, window_s=5.0, max_held=3))
