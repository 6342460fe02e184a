"""`tune --sessions` and `what-if --sessions` (issue 23, item 6): each session mode side by side
on the same conversations, cost with caching and switches per session, through the one session
replay (simulations/sessions.py) that `simulate --sessions` runs; grades imported with
`cost-router grades import` give the quality."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from policies.sessions.config import MODES
from router.cli import app
from router.config import load_config, sim_config_from
from simulations.replay import pick_policy
from simulations.sessions import (
    CacheModel,
    SessionTrace,
    compare_modes,
    load_session_trace,
    replay_sessions,
)
from simulations.sim_config import SimConfig
from tests.support.sim import router_config_dict

runner = CliRunner()
SESSIONS, TURNS = 30, 4
HIT_ALL = CacheModel(default_hit_rate=1.0, default_ttl_s=300)


def _cli(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    """Conversations whose turns' scores vary (so modes differ), served by the policy at 0.5,
    with grades (small right on easy turns only, large always) imported beside them; and a
    config whose policy holds `sticky` sessions, with cache prices."""
    rng = np.random.default_rng(7)
    folder = tmp_path / "traces"
    folder.mkdir()
    records, grades = [], []
    for s in range(SESSIONS):
        for k in range(TURNS):
            score = float(rng.uniform())
            rid = f"s{s}-t{k}"
            records.append(
                {
                    "schema_version": 1,
                    "id": rid,
                    "time": 1_800_000_000.0 + s * 3.0 + k * 20.0,
                    "session": f"s{s}",
                    "turn": k + 1,
                    "score": score,
                    "tier": "large" if score >= 0.5 else "small",
                    "prompt_tokens": 400 * (k + 1),
                    "completion_tokens": 50,
                    "cached_tokens": 0,
                    "status": 200,
                }
            )
            grades.append(
                {"request_id": rid, "outcomes": {"small": float(score < 0.6), "large": 1}}
            )
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    grades_file = tmp_path / "grades.jsonl"
    grades_file.write_text("".join(json.dumps(g) + "\n" for g in grades))
    code, out = _cli("grades", "import", str(grades_file), "--traces", str(folder))
    assert code == 0, out
    data = router_config_dict(threshold=0.5)
    data["policies"]["balanced"]["session"] = {"mode": "sticky"}
    for t, cached in zip(data["tiers"], (0.06, 1.0), strict=True):
        t["price"]["cached_input_per_mtok"] = cached
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump(data))
    return folder, config


def _sim(config: Path) -> SimConfig:
    return sim_config_from(load_config(config))


def _share(sim: SimConfig, trace: SessionTrace, mode: str, t: float) -> float:
    policy = pick_policy(sim, None).with_threshold(t)  # type: ignore[attr-defined]
    run = replay_sessions(sim, trace, mode, HIT_ALL, policy=policy)  # type: ignore[arg-type]
    return run.tiers.count("large") / len(run.tiers)


def test_tune_sessions_picks_a_threshold_per_mode(setup: tuple[Path, Path], tmp_path: Path) -> None:
    folder, config = setup
    out_json = tmp_path / "tune.json"
    write = tmp_path / "written.yaml"
    write.write_text(config.read_text())
    code, out = _cli(
        "tune", "--sessions", "-t", str(folder), "-c", str(config), "--hit-rate", "1",
        "--max-large-share", "0.3", "--json", str(out_json), "--write", str(write),
    )  # fmt: skip
    assert code == 0, out
    assert "* sticky" in out and "switches/session" in out
    result = json.loads(out_json.read_text())
    assert result["requests"] == SESSIONS * TURNS and result["graded"] == SESSIONS * TURNS
    modes = {m["mode"]: m for m in result["modes"]}
    assert list(modes) == list(MODES)
    sim, trace = _sim(config), load_session_trace([folder])
    for mode, m in modes.items():
        t = m["threshold"]
        assert m["large_share"] <= 0.3
        # The boundary: the share at the threshold is what the session replay gives, and a
        # threshold just below it sends more than 30% large.
        assert _share(sim, trace, mode, t) == pytest.approx(m["large_share"])
        assert _share(sim, trace, mode, t - 2**-18) > 0.3
    # Holding a tier changes the threshold the same share needs, and switches per session.
    assert modes["sticky"]["threshold"] != modes["per_request"]["threshold"]
    assert modes["sticky"]["switches_per_session"] == 0
    assert modes["per_request"]["switches_per_session"] > 0
    written = load_config(write).policies["balanced"].model_extra["threshold"]
    assert written == pytest.approx(modes["sticky"]["threshold"])


def test_tune_sessions_meets_a_quality_target_on_the_imported_grades(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, config = setup
    out_json = tmp_path / "tune.json"
    code, out = _cli(
        "tune", "--sessions", "-t", str(folder), "-c", str(config),
        "--target-quality", "0.9", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, out
    for m in json.loads(out_json.read_text())["modes"]:
        assert m["threshold"] is not None and m["quality_ratio"] >= 0.9, m


def test_what_if_sessions_reports_every_mode_as_simulate_sessions_prices_it(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, config = setup
    out_json = tmp_path / "w.json"
    code, out = _cli(
        "what-if", "--sessions", "-t", str(folder), "-c", str(config), "--hit-rate", "1",
        "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, out
    assert "switches/session" in out and "of all-large" in out
    rows = {r["mode"]: r for r in json.loads(out_json.read_text())["modes"]}
    assert list(rows) == [*MODES, "all-large", "all-small", "trace"]
    sim, trace = _sim(config), load_session_trace([folder])
    same = {r["mode"]: r for r in compare_modes(sim, trace, HIT_ALL)}
    for mode in (*MODES, "all-large", "trace"):
        for key in ("cost_usd", "switches_per_session", "large_share", "share_of_all_large"):
            assert rows[mode][key] == pytest.approx(same[mode][key]), (mode, key)
    assert rows["all-large"]["quality"] == 1.0
    assert rows["all-small"]["quality"] < rows["per_request"]["quality"] <= 1.0
    assert rows["all-large"]["p50_s"] > rows["all-small"]["p50_s"] > 0
    assert rows["sticky"]["switches_per_session"] == 0


def test_session_options_that_do_not_apply_are_refused(setup: tuple[Path, Path]) -> None:
    folder, config = setup
    code, out = _cli(
        "what-if", "--sessions", "-t", str(folder), "-c", str(config), "--signals", "x.json"
    )
    assert code == 2 and "--sessions takes the tiers' latency options" in out


def test_a_quality_target_without_grades_names_the_remedy(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [
        {"schema_version": 1, "id": f"r{i}", "time": 1.8e9 + i, "session": "s", "turn": i + 1,
         "score": 0.9, "tier": "large", "prompt_tokens": 10, "completion_tokens": 5,
         "status": 200}
        for i in range(3)
    ]  # fmt: skip
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out = _cli("tune", "--sessions", "-t", str(trace), "--target-quality", "0.9")
    assert code == 2 and "cost-router grades import" in out
