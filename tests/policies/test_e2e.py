"""End to end: an A/B experiment through the real proxy with the official `openai` client,
feedback through /v1/feedback, hot reload of the experiment, and the report from the proxy's own
traces."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai import OpenAI
from typer.testing import CliRunner

from benchmarks.echo_upstream import running_echo_upstream
from policies.experiments import Experiment
from router.cli import app as cli
from router.config import load_config
from simulations.ab_report import report_from_files
from tests.support.proxy import ProxyThread, tier
from tests.support.waiting import wait_for

PROMPTS = [
    "hi",
    "What is 2+2?",
    "Name a colour.",
    "Prove that there are infinitely many primes and derive the prime number theorem in detail.",
    "Write a Python function implementing a red-black tree with deletion; analyse complexity.",
    "Explain the CAP theorem with a worked example of a partition in a replicated database.",
]


def _routed_threshold() -> float:
    # The routed arm must send only the hardest prompt large whatever the shipped model's score
    # scale is (a clear cost gap between arms), so its threshold sits just below the top score.
    from classifiers.inference import DifficultyScorer

    scores = sorted(DifficultyScorer.load(None).score_texts(PROMPTS).tolist())
    return float((scores[-2] + scores[-1]) / 2)


def _config(small: str, large: str, traces: Path, with_experiment: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "tiers": [tier("small", small, price=(0.6, 0.6)), tier("large", large, price=(10, 30))],
        "traces": {"path": str(traces / "requests.jsonl")},
        "signals": {"enabled": False},
        "default_policy": "current",
        "policies": {
            "current": {"type": "fixed", "tier": "large"},
            "routed": {"type": "threshold", "threshold": _routed_threshold()},
        },
    }
    if with_experiment:
        doc["experiments"] = [
            {
                "name": "route-vs-large",
                "unit": "user",
                "salt": "e2e",
                "arms": {
                    "control": {"policy": "current", "weight": 1},
                    "treatment": {"policy": "routed", "weight": 1},
                },
            }
        ]
    return doc


@pytest.fixture()
def upstreams():
    with (
        running_echo_upstream("--delay-ms", "2") as small,
        running_echo_upstream("--delay-ms", "25") as large,
    ):
        yield small, large


def test_experiment_through_proxy_to_report(tmp_path: Path, upstreams) -> None:
    small, large = upstreams
    traces = tmp_path / "traces"
    cfg_path = tmp_path / "router.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(small, large, traces, True)))
    exp = Experiment(load_config(cfg_path, environ={}).experiments[0])

    with ProxyThread(load_config(cfg_path, environ={}), config_path=cfg_path) as proxy:
        client = OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        seen: dict[str, str] = {}
        ids: dict[str, str] = {}
        counts = Counter()
        for i in range(60):
            user = f"user-{i % 24}"
            raw = client.chat.completions.with_raw_response.create(
                model="auto",
                user=user,
                messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            )
            completion = raw.parse()
            assert completion.choices[0].message.content
            arm = raw.headers["x-router-arm"]
            assert raw.headers["x-router-experiment"] == "route-vs-large"
            assert arm == exp.arm_for(user)  # the same arm any replica would give
            assert seen.setdefault(user, arm) == arm  # sticky
            if arm == "control":
                assert raw.headers["x-router-tier"] == "large"
            ids[raw.headers["x-router-request-id"]] = arm
            counts[arm] += 1
        assert set(seen.values()) == {"control", "treatment"}

        # An explicit policy bypasses the experiment.
        raw = client.chat.completions.with_raw_response.create(
            model="router:routed", user="user-0", messages=[{"role": "user", "content": "hi"}]
        )
        assert "x-router-arm" not in raw.headers and raw.headers["x-router-policy"] == "routed"

        # Feedback: the treatment answers rated lower; bad ids and scores rejected.
        with httpx.Client(base_url=proxy.url, timeout=10) as http:
            for rid, arm in ids.items():
                score = 0.9 if arm == "control" else 0.6
                r = http.post("/v1/feedback", json={"request_id": rid, "score": score})
                assert r.status_code == 200, r.text
            assert (
                http.post("/v1/feedback", json={"request_id": "nope", "score": 1}).status_code
                == 404
            )
            r = http.post("/v1/feedback", json={"request_id": next(iter(ids)), "score": 7})
            assert r.status_code == 400 and r.json()["error"]["param"] == "score"
            metrics = http.get("/metrics").text
        assert 'cost_router_experiment_requests_total{arm="treatment"' in metrics

        # Hot reload: stop the experiment by editing the file; a broken edit changes nothing.
        reloader = proxy.app.state.reloader
        rejected = reloader.failures
        cfg_path.write_text("policies: [broken")
        wait_for(lambda: reloader.failures > rejected, timeout_s=15, what="rejecting the edit")
        raw = client.chat.completions.with_raw_response.create(
            model="auto", user="user-1", messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.headers.get("x-router-arm") == seen["user-1"]
        counts[seen["user-1"]] += 1
        applied = reloader.reloads
        cfg_path.write_text(yaml.safe_dump(_config(small, large, traces, False)))
        wait_for(lambda: reloader.reloads > applied, timeout_s=15, what="the edit's reload")
        raw = client.chat.completions.with_raw_response.create(
            model="auto", user="user-1", messages=[{"role": "user", "content": "hi"}]
        )
        assert "x-router-arm" not in raw.headers and raw.headers["x-router-policy"] == "current"
        proxy.traces(expect=sum(counts.values()) + 2)

    rep = report_from_files([traces], "route-vs-large")
    arms = {a.arm: a for a in rep.arms}
    assert {a: s.requests for a, s in arms.items()} == dict(counts)
    assert arms["control"].large_share.value == 1.0
    assert arms["treatment"].large_share.value < 1.0
    assert arms["treatment"].cost_per_1k.value < arms["control"].cost_per_1k.value
    assert arms["control"].feedback.value == pytest.approx(0.9)
    assert arms["treatment"].feedback.value == pytest.approx(0.6)
    diffs = {c.metric: c for c in rep.comparisons}
    assert diffs["cost_per_1k"].p_value < 0.001
    # Every rating within an arm is the same: no interval or p-value is claimed (issue 25).
    assert diffs["feedback"].note == "not computed: no variance"
    assert math.isnan(diffs["feedback"].p_value)
    # The traces name the unit that assigned the arms: the body's `user`, resampled whole.
    assert rep.unit == "user" and sum(a.units for a in rep.arms) == len(seen)

    out = tmp_path / "ab.html"
    res = CliRunner().invoke(
        cli,
        [
            "ab",
            "report",
            "--traces",
            str(traces),
            "--experiment",
            "route-vs-large",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "treatment - control" in res.output and out.exists()
    (tmp_path / "report.txt").write_text(res.output)
