"""The shipped Prometheus rules and Grafana dashboard (router/observability/monitoring/): `promtool
check rules`, Prometheus's own rule unit tests (`promtool test rules`), every dashboard query valid
PromQL, and every metric they name exposed by the real proxy's /metrics. promtool comes from
Debian's `prometheus` package (`make promtool`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from tests.support.proxy import ProxyThread, make_config, tier

MONITORING = Path(str(files("router.observability") / "monitoring"))
RULES = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "dashboard.json"
RULE_TESTS = Path(__file__).parent / "monitoring" / "alerts_test.yml"
METRIC = re.compile(r"\bcost_router_[a-z0-9_]+")
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$policy": ".*"}

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed: `make promtool` (apt-get install prometheus)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for panel in doc["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append(expr)
    return out


@needs_promtool
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    check = promtool("check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    unit = promtool("test", "rules", str(RULE_TESTS))
    assert unit.returncode == 0, unit.stdout + unit.stderr


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses the queries when they are recording rules.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:q{i}", "expr": e}
                    for i, e in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    check = promtool("check", "rules", str(path))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Every sample name the proxy's /metrics can expose (with monitoring on, the default)."""
    with running_echo_upstream() as echo:
        cfg = make_config(
            [tier("small", echo, price=(0.6, 0.6)), tier("large", echo)],
            tmp_path_factory.mktemp("traces"),
            monitoring={"enabled": True},
        )
        with ProxyThread(cfg) as proxy:
            text = httpx.get(proxy.url + "/metrics", timeout=10).text
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        # A labelled family with no series yet still has its TYPE line: count the names its
        # series will have (counters _total, histograms _bucket/_sum/_count).
        names.add(family.name)
        names |= {s.name for s in family.samples}
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    yield names


def test_every_metric_the_rules_and_dashboard_name_is_exposed(exposed: set[str]) -> None:
    named = {m for e in rule_exprs() + dashboard_exprs() for m in METRIC.findall(e)}
    assert "cost_router_score_bucket" in named and "cost_router_score_psi" in named
    missing = sorted(named - exposed)
    assert not missing, (
        f"named by router/observability/monitoring/ but absent from /metrics: {missing}"
    )


def test_without_team_labels_every_metric_is_still_exposed(tmp_path: Path) -> None:
    """monitoring.team_labels: false (docs/monitoring.md, "Who can read /metrics"): after traffic
    of two teams, no series names a team, and every metric the rules and the dashboard name is
    still there (summed over the teams), so they keep working."""
    with running_echo_upstream() as echo:
        cfg = make_config(
            [tier("small", echo, price=(0.6, 0.6)), tier("large", echo)],
            tmp_path,
            monitoring={"enabled": True, "team_labels": False},
            teams={t: {"budget": {"limit_usd": 5, "period": "daily"}} for t in ("ops", "web")},
            keys=[{"key_sha256": hash_key(f"sk-test-{t}"), "team": t} for t in ("ops", "web")],
        )
        with ProxyThread(cfg) as proxy:
            for team in ("ops", "web"):
                r = httpx.post(
                    proxy.url + "/v1/chat/completions",
                    json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"authorization": f"Bearer sk-test-{team}"},
                    timeout=30,
                )
                assert r.status_code == 200, r.text
            text = httpx.get(proxy.url + "/metrics", timeout=10).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert not [s for s in samples if "team" in s.labels]
    names = {s.name for s in samples}
    assert {"cost_router_budget_limit_usd", "cost_router_cost_usd_total"} <= names
    named = {m for e in rule_exprs() + dashboard_exprs() for m in METRIC.findall(e)}
    team_metrics = {m for m in named if m.startswith(("cost_router_budget_", "cost_router_cost_"))}
    assert team_metrics and team_metrics <= names


def test_dashboard_is_grafana_json() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in doc["panels"])
