"""`cost-router ab report|assign` through the real CLI app: the report as text, PNG and HTML from
trace files, the arm a unit is assigned, and the cluster bootstrap on the config's unit. The
statistics themselves (simulations/ab_report.py) are tested in tests/simulations/test_ab_report.py,
whose synthetic traces these tests use."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import orjson
import yaml
from openai import OpenAI
from typer.testing import CliRunner

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from router.cli import app
from router.config import load_config
from simulations.ab_report import load_experiment
from tests.simulations.test_ab_report import _clustered_records, _records, _write
from tests.support.proxy import ProxyThread, tier


def test_cli_report_png_html(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    traces = tmp_path / "traces"
    traces.mkdir()
    recs = _records("control", 300, 0.2, rng, 0.6) + _records("treat", 300, 0.5, rng, 0.6)
    other = [{**r, "experiment": "other"} for r in _records("x", 50, 0.5, rng, 0.5, 9000)]
    _write(traces / "requests.jsonl.1", recs[:250])
    _write(traces / "requests.jsonl", recs[250:] + other)
    _write(traces / "feedback.jsonl", [{"request_id": "control-0", "score": 0.0}])
    assert len(load_experiment([traces], "exp")) == 600
    runner = CliRunner()
    png, html = tmp_path / "c.png", tmp_path / "c.html"
    r = runner.invoke(
        app, ["ab", "report", "--traces", str(traces), "--experiment", "exp", "--out", str(png)]
    )
    assert r.exit_code == 0, r.output
    assert "600 requests" in r.output and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = runner.invoke(
        app,
        [
            "ab",
            "report",
            "--traces",
            str(traces / "requests.jsonl"),
            "--traces",
            str(traces / "requests.jsonl.1"),
            "--experiment",
            "exp",
            "--out",
            str(html),
        ],
    )
    assert r.exit_code == 0, r.output
    page = html.read_text()
    assert "data:image/png;base64," in page and "<pre>" not in page
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", page)  # real tables, not a text dump
    assert "share to large" in cells and "treat - control" in cells and "Welch t" in cells
    assert page.index("<table>") < page.index("data:image/png;base64,")
    r = runner.invoke(app, ["ab", "report", "-t", str(traces), "--experiment", "nope"])
    assert r.exit_code == 2 and "no traced requests for experiment 'nope'" in r.output


def test_cli_assign_matches_experiment(tmp_path: Path) -> None:
    from policies.experiments import Experiment

    config_file = tmp_path / "r.yaml"
    config_file.write_text(
        "tiers:\n"
        "  - {name: s, base_url: 'http://s', model: m, price: {input_per_mtok: 1, "
        "output_per_mtok: 1}}\n"
        "policies: {a: {type: fixed}, b: {type: fixed}}\n"
        "default_policy: a\n"
        "experiments:\n"
        "  - {name: e, unit: team, arms: {x: {policy: a, weight: 1}, y: {policy: b, weight: 2}}}\n"
    )
    r = CliRunner().invoke(
        app, ["ab", "assign", "-c", str(config_file), "--experiment", "e", "t1", "t2", "t3"]
    )
    assert r.exit_code == 0, r.output
    exp = Experiment(load_config(config_file, environ={}).experiments[0])
    want = [f"{u}\t{exp.arm_for(u)}\t{exp.policy_of(exp.arm_for(u))}" for u in ("t1", "t2", "t3")]
    assert r.output.splitlines() == want
    r = CliRunner().invoke(
        app, ["ab", "assign", "--config", str(config_file), "--experiment", "zz", "t1"]
    )
    assert r.exit_code == 2 and "no experiment 'zz'" in r.output  # bad input
    r = CliRunner().invoke(
        app, ["ab", "report", "-t", str(tmp_path), "-c", str(config_file), "--experiment", "zz"]
    )
    assert r.exit_code == 2 and "no experiment 'zz'" in r.output


def test_cli_report_resamples_the_configs_unit(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    recs = _clustered_records("control", 15, 8, rng) + _clustered_records("treat", 15, 8, rng)
    _write(tmp_path / "requests.jsonl", recs)
    config_file = tmp_path / "r.yaml"
    config_file.write_text(
        "tiers:\n"
        "  - {name: small, base_url: 'http://s', model: m, price: {input_per_mtok: 1, "
        "output_per_mtok: 1}}\n"
        "  - {name: large, base_url: 'http://l', model: m, price: {input_per_mtok: 9, "
        "output_per_mtok: 9}}\n"
        "policies: {a: {type: fixed}, b: {type: fixed, tier: large}}\n"
        "default_policy: a\n"
        "experiments:\n"
        "  - {name: exp, unit: user, arms: {control: {policy: a, weight: 1}, "
        "treat: {policy: b, weight: 1}}}\n"
    )
    r = CliRunner().invoke(
        app,
        [
            "ab",
            "report",
            "--traces",
            str(tmp_path),
            "--experiment",
            "exp",
            "--config",
            str(config_file),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "assignment unit user (the experiment's unit in the config)" in r.output
    assert "traffic split (users per arm)" in r.output and "cluster bootstrap" in r.output


def test_cli_report_resamples_the_body_user_the_proxy_assigned_by(tmp_path: Path) -> None:
    """Issue 25, item 1: arms assigned by the request body's `user` while one API key (user
    'ann') sent everything. The proxy's own traces record the assignment unit, so the report
    resamples the 40 body users, not `users 1 | 1` with zero-width intervals; traces without
    that record are refused with the reason."""
    traces = tmp_path / "traces"
    config_file = tmp_path / "router.yaml"
    with running_echo_upstream() as small, running_echo_upstream() as large:
        doc = {
            "tiers": [tier("small", small, price=(0.6, 0.6)), tier("large", large, price=(10, 30))],
            "traces": {"path": str(traces / "requests.jsonl")},
            "signals": {"enabled": False},
            "keys": [{"key_sha256": hash_key("sk-ann"), "team": "alpha", "user": "ann"}],
            "default_policy": "a",
            "policies": {
                "a": {"type": "fixed", "tier": "small"},
                "b": {"type": "fixed", "tier": "large"},
            },
            "experiments": [
                {
                    "name": "routing-ab",
                    "unit": "user",
                    "arms": {
                        "control": {"policy": "a", "weight": 1},
                        "treat": {"policy": "b", "weight": 1},
                    },
                }
            ],
        }
        config_file.write_text(yaml.safe_dump(doc))
        with ProxyThread(load_config(config_file, environ={})) as proxy:
            client = OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-ann", max_retries=0)
            for i in range(120):
                client.chat.completions.create(
                    model="auto",
                    user=f"u{i % 40}",
                    messages=[{"role": "user", "content": f"question {i} " * (1 + i % 7)}],
                )
            records = proxy.traces(120)
    assert {r["user"] for r in records} == {"ann"}  # the key's user, as before
    assert {r["ab_unit"] for r in records} == {"user"}
    ids = {r["ab_unit_id"] for r in records}
    assert len(ids) == 40 and all(i.startswith("h:") for i in ids)  # hashed, never `u7`
    runner = CliRunner()
    args = ["ab", "report", "--traces", str(traces), "--experiment", "routing-ab"]
    r = runner.invoke(app, [*args, "--config", str(config_file)])
    assert r.exit_code == 0, r.output
    assert "assignment unit user (recorded in the traces (ab_unit))" in r.output
    users = next(line for line in r.output.splitlines() if line.startswith("users")).split()
    assert (
        users[0] == "users"
        and int(users[1]) + int(users[2]) == 40
        and min(map(int, users[1:])) >= 2
    )
    assert "40 users, cluster bootstrap" in r.output
    assert "[0.0, 100.0]" not in r.output
    # Every control request is small and every treat request large: that share has no variance
    # in either arm, so its difference gets no interval and no p-value, not `p <0.0001*`.
    share = next(line for line in r.output.splitlines() if line.startswith("large_share "))
    assert "not computed: no variance" in share and "<0.0001" not in share

    # The same traces as written before the unit was recorded: refused, saying why.
    path = traces / "requests.jsonl"
    legacy = [{k: v for k, v in rec.items() if not k.startswith("ab_")} for rec in records]
    path.write_bytes(b"".join(orjson.dumps(rec) + b"\n" for rec in legacy))
    r = runner.invoke(app, [*args, "--config", str(config_file)])
    assert r.exit_code == 1, r.output
    assert "user 'ann' has requests in 2 arms (control, treat)" in r.stderr
    assert "the API key's user" in r.stderr
    assert "users" not in r.stdout  # no table printed in place of the refusal
