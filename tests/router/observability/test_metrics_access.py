"""Who may read /metrics, where, and whether it names teams (router/endpoints/ops.py,
router/server/listeners.py, router/observability/metrics.py; docs/monitoring.md, "Who can read
/metrics"), over real HTTP: the proxy on uvicorn in a thread, and `cost-router serve` itself for
the second listener, with the echo upstream as the tier and the official openai client."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai import OpenAI

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from tests.support.budgets import Proxy
from tests.support.ports import free_port
from tests.support.proxy import ProxyThread, make_config, tier

TOKEN_ENV = "COST_ROUTER_TEST_METRICS_TOKEN"
TOKEN = "metrics-token-for-tests"
KEYS = {"red-team": "sk-test-metrics-red", "blue-team": "sk-test-metrics-blue"}
TEAMS = {
    "red-team": {"budget": {"limit_usd": 5.0, "period": "daily"}},
    "blue-team": {"budget": {"limit_usd": 7.0, "period": "daily"}},
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


def _config(upstream: str, tmp: Path, **extra: Any) -> dict[str, Any]:
    return {
        "tiers": [tier("small", upstream)],
        "traces": {"path": str(tmp / "requests.jsonl")},
        "signals": {"enabled": False},
        "default_policy": "fixed",
        "policies": {"fixed": {"type": "fixed", "tier": "small"}},
        "teams": TEAMS,
        "keys": [{"key_sha256": hash_key(k), "team": t} for t, k in KEYS.items()],
        **extra,
    }


def _proxy(upstream: str, tmp: Path, **extra: Any) -> ProxyThread:
    data = _config(upstream, tmp, **extra)
    return ProxyThread(make_config(data.pop("tiers"), tmp, **data))


def _spend(url: str) -> None:
    """One answered request per team: cost, requests and budget series for each."""
    for key in KEYS.values():
        client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )


def _refused(r: httpx.Response, status: int, code: str) -> None:
    """The API's own error JSON, with no metric in it."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert (
        err["code"] == code and err["message"] and set(err) == {"message", "type", "param", "code"}
    )
    assert "cost_router_" not in r.text


def test_the_token_is_required_when_configured(
    upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with _proxy(upstream, tmp_path, monitoring={"metrics_token_env": TOKEN_ENV}) as proxy:
        _spend(proxy.url)
        url = f"{proxy.url}/metrics"
        _refused(httpx.get(url), 401, "invalid_metrics_token")
        wrong = {"authorization": "Bearer not-the-token"}
        _refused(httpx.get(url, headers=wrong), 401, "invalid_metrics_token")
        # An API key is not the metrics token.
        api_key = {"authorization": f"Bearer {KEYS['red-team']}"}
        _refused(httpx.get(url, headers=api_key), 401, "invalid_metrics_token")
        r = httpx.get(url, headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert 'cost_router_budget_limit_usd{scope="team",team="red-team"} 5.0' in r.text


def test_a_token_missing_from_the_environment_opens_nothing(
    upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with _proxy(upstream, tmp_path, monitoring={"metrics_token_env": TOKEN_ENV}) as proxy:
        for headers in ({}, {"authorization": "Bearer"}, {"authorization": "Bearer x"}):
            _refused(httpx.get(f"{proxy.url}/metrics", headers=headers), 401, "metrics_token_unset")


def test_serve_refuses_to_start_without_the_token(
    upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(_config(upstream, tmp_path, monitoring={"metrics_token_env": TOKEN_ENV}))
    )
    done = subprocess.run(
        [sys.executable, "-m", "router.cli", "serve", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"cannot start: monitoring.metrics_token_env names {TOKEN_ENV}" in done.stderr
    assert "Traceback" not in done.stderr and "listening on" not in done.stdout


def test_auth_required_closes_metrics_unless_configured(upstream: str, tmp_path: Path) -> None:
    """With API keys required, API callers must not read each other's teams: /metrics on the API
    port needs a token or its own listener; without auth it stays open, as before."""
    with _proxy(upstream, tmp_path, auth={"required": True}) as proxy:
        _spend(proxy.url)
        url = f"{proxy.url}/metrics"
        _refused(httpx.get(url), 401, "metrics_token_required")
        api_key = {"authorization": f"Bearer {KEYS['blue-team']}"}
        _refused(httpx.get(url, headers=api_key), 401, "metrics_token_required")
    with _proxy(upstream, tmp_path) as proxy:
        assert httpx.get(f"{proxy.url}/metrics").status_code == 200


def test_the_metrics_listener_serves_metrics_and_nothing_else(
    upstream: str, tmp_path: Path
) -> None:
    """`cost-router serve` with monitoring.metrics_listen: /metrics there (no token needed: the
    listener's network is the protection), not on the API port; the API not on the listener."""
    port = free_port()
    data = _config(
        upstream,
        tmp_path,
        auth={"required": True},
        monitoring={"metrics_listen": f"127.0.0.1:{port}"},
    )
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(data))
    proxy = Proxy(path, tmp_path, "proxy").start()
    try:
        assert f"cost-router metrics on http://127.0.0.1:{port}/metrics" in proxy.log()
        _spend(proxy.url)
        metrics = f"http://127.0.0.1:{port}"
        r = httpx.get(f"{metrics}/metrics")
        assert r.status_code == 200, r.text
        assert 'cost_router_budget_spent_usd{scope="team",team="blue-team"}' in r.text
        assert "cost_router_requests_total" in r.text
        _refused(httpx.get(f"{proxy.url}/metrics"), 404, "not_found")
        for path_ in ("/v1/models", "/healthz", "/openapi.json", "/admin/v1/keys"):
            _refused(httpx.get(f"{metrics}{path_}"), 404, "not_found")
        key = {"authorization": f"Bearer {KEYS['red-team']}"}
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        _refused(
            httpx.post(f"{metrics}/v1/chat/completions", json=body, headers=key), 404, "not_found"
        )
        # The API port still serves the API.
        assert httpx.get(f"{proxy.url}/healthz").status_code == 200
        assert (
            httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers=key).status_code
            == 200
        )
    finally:
        proxy.stop()


def test_serve_refuses_a_metrics_listener_it_cannot_bind(upstream: str, tmp_path: Path) -> None:
    with running_echo_upstream() as taken:
        port = int(taken.rsplit(":", 1)[1].split("/")[0])  # the echo server listens there
        data = _config(upstream, tmp_path, monitoring={"metrics_listen": f"127.0.0.1:{port}"})
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump(data))
        done = subprocess.run(
            [sys.executable, "-m", "router.cli", "serve", "--config", str(path), "--port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"cannot start: monitoring.metrics_listen 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("listen", ["9464", "host", "127.0.0.1:99999", ":9464"])
def test_a_bad_listen_address_is_a_config_error(listen: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="monitoring.metrics_listen"):
        make_config(
            [tier("small", "http://127.0.0.1:9/v1")],
            tmp_path,
            monitoring={"metrics_listen": listen},
        )


def test_team_labels_off_names_no_team(upstream: str, tmp_path: Path) -> None:
    with _proxy(upstream, tmp_path) as proxy:
        _spend(proxy.url)
        named = httpx.get(f"{proxy.url}/metrics").text
    assert 'team="red-team"' in named and 'team="blue-team"' in named  # the default names them
    with _proxy(upstream, tmp_path, monitoring={"team_labels": False}) as proxy:
        _spend(proxy.url)
        text = httpx.get(f"{proxy.url}/metrics").text
        assert "red-team" not in text and "blue-team" not in text and "team=" not in text
        # The series remain, summed over the teams: the fleet's totals.
        assert 'cost_router_budget_limit_usd{scope="team"} 12.0' in text
        assert 'cost_router_team_requests_total{tier="small"} 2.0' in text
        assert _sample(text, "cost_router_cost_usd_total", 'tier="small"') > 0
        assert _sample(text, "cost_router_budget_remaining_usd", 'scope="team"') < 12.0
        # Series without a team label are untouched.
        assert 'cost_router_requests_total{policy="fixed",status="200",tier="small"} 2.0' in text


def _sample(text: str, name: str, labels: str) -> float:
    prefix = f"{name}{{{labels}}} "
    values = [float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
    assert len(values) == 1, (prefix, values)
    return values[0]
