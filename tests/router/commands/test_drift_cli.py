"""`cost-router drift reference|report`: files written, exit 0 when quiet, 1 on an alert (cron and
CI), 2 with one `error:` line on bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from classifiers.score_reference import ScoreReference
from router.cli import app

DAY0 = 1_780_000_000.0 - 1_780_000_000.0 % 86_400
runner = CliRunner()


def write_traces(folder: Path, hours: int, shift_at: int | None, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for h in range(hours):
        a = 3.5 if shift_at is not None and h >= shift_at else 2.0
        for j, s in enumerate(rng.beta(a, 3.0, 400)):
            large = s >= 0.6
            lines.append(
                orjson.dumps(
                    {
                        "schema_version": 1,
                        "id": f"r{h}-{j}",
                        "time": DAY0 + h * 3600 + j * 9,
                        "policy": "balanced",
                        "score": float(s),
                        "tier": "large" if large else "small",
                        "cost_usd": 0.01 if large else 0.001,
                        "status": 200,
                    }
                )
            )
    path = folder / "requests.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drift")
    write_traces(root / "ref", 6, None, 1)
    write_traces(root / "steady", 6, None, 2)
    write_traces(root / "shifted", 6, 3, 3)
    return {
        "root": root,
        "ref": root / "ref",
        "steady": root / "steady",
        "shifted": root / "shifted",
    }


def test_reference_then_quiet_report_exits_0_and_writes_charts(folders: dict[str, Path]) -> None:
    ref = folders["root"] / "m.scores.json"
    res = runner.invoke(app, ["drift", "reference", "-t", str(folders["ref"]), "-o", str(ref)])
    assert res.exit_code == 0, res.output
    assert ScoreReference.load(ref).n == 2400
    out = folders["root"] / "out"
    res = runner.invoke(
        app,
        [
            "drift",
            "report",
            "-t",
            str(folders["steady"]),
            "-r",
            str(ref),
            "--window",
            "1h",
            "--threshold",
            "0.6",
            "-o",
            str(out),
        ],
        terminal_width=200,
    )
    assert res.exit_code == 0, res.output
    assert "retraining not advised" in res.output and "restores the" in res.output
    assert (out / "drift.png").read_bytes()[:4] == b"\x89PNG"
    assert "<table>" in (out / "drift.html").read_text()
    data = orjson.loads((out / "drift.json").read_bytes())
    assert len(data["windows"]) == 6 and data["alert"] is False


def test_shifted_traffic_exits_1_naming_the_reason(folders: dict[str, Path]) -> None:
    ref = folders["root"] / "m.scores.json"
    if not ref.exists():
        runner.invoke(app, ["drift", "reference", "-t", str(folders["ref"]), "-o", str(ref)])
    res = runner.invoke(
        app,
        ["drift", "report", "-t", str(folders["shifted"]), "-r", str(ref), "--threshold", "0.6"],
        terminal_width=200,
    )
    assert res.exit_code == 1, res.output
    assert "score drift: PSI" in res.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--window", "2h"], "--window"),
        (["-r", "absent.scores.json"], "cannot read reference"),
        (["--psi-limit", "-1"], "--psi-limit: Input should be greater than 0"),
    ],
)
def test_bad_input_exits_2_with_one_error_line(
    folders: dict[str, Path], args: list[str], needle: str
) -> None:
    res = runner.invoke(app, ["drift", "report", "-t", str(folders["steady"]), *args])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], res.output


def test_missing_traces_and_parquet_without_threshold_exit_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["drift", "report", "-t", str(tmp_path / "none")])
    assert res.exit_code == 2 and "error:" in res.output
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"time": [DAY0], "score": [0.5]}), tmp_path / "t.parquet")
    res = runner.invoke(app, ["drift", "report", "-t", str(tmp_path / "t.parquet")])
    assert res.exit_code == 2 and "no 'tier' column" in res.output


def test_config_gives_threshold_reference_and_limits(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    ref = folders["root"] / "m.scores.json"
    if not ref.exists():
        runner.invoke(app, ["drift", "reference", "-t", str(folders["ref"]), "-o", str(ref)])
    config_file = tmp_path / "router.yaml"
    config_file.write_text(
        "tiers:\n"
        "  - {name: small, base_url: 'http://127.0.0.1:9/v1', model: s,"
        " price: {input_per_mtok: 0.6, output_per_mtok: 0.6}}\n"
        "  - {name: large, base_url: 'http://127.0.0.1:9/v1', model: l,"
        " price: {input_per_mtok: 10, output_per_mtok: 30}}\n"
        "default_policy: balanced\n"
        "policies:\n  balanced: {type: threshold, threshold: 0.6}\n"
        f"monitoring:\n  reference: '{ref}'\n  drift: {{psi_limit: 5.0}}\n"
    )
    res = runner.invoke(
        app,
        ["drift", "report", "-t", str(folders["shifted"]), "-c", str(config_file)],
        terminal_width=200,
    )
    # PSI can't reach 5: the score-drift detector is off; the share CUSUM still fires.
    assert res.exit_code == 1, res.output
    assert "score drift: PSI" not in res.output and "large share" in res.output
    assert "(now 0.6000)" in res.output
    res = runner.invoke(
        app, ["drift", "report", "-t", str(folders["steady"]), "-c", str(config_file), "-p", "nope"]
    )
    assert res.exit_code == 2 and "no policy 'nope'" in res.output


def test_reference_from_a_data_sets_prompts_scored_by_the_model(tmp_path: Path) -> None:
    from trace_format.routellm_csv import DEFAULT_LARGE, DEFAULT_SMALL

    csv = tmp_path / "data.csv"
    csv.write_text(
        f'prompt,{DEFAULT_SMALL},{DEFAULT_LARGE}\n"What is 2+2?",True,True\n'
        '"Prove that there are infinitely many primes.",False,True\nhello,True,True\n'
    )
    out = tmp_path / "data.scores.json"
    res = runner.invoke(app, ["drift", "reference", "--data", str(csv), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert ScoreReference.load(out).n == 3
    res = runner.invoke(app, ["drift", "reference", "--data", str(csv), "--oof", str(csv)])
    assert res.exit_code == 2 and "exactly one of" in res.output
