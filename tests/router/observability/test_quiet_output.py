"""Output a first day should not wade through (issue 16): /metrics has no `_created` series, and
a `kind: litellm` tier logs no INFO lines per request (litellm's loggers printed each twice)."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import openai
import pytest

from backends.litellm_backend import LITELLM_LOGGERS
from benchmarks.echo_upstream import running_echo_upstream
from tests.support.proxy import ProxyThread, make_config, tier

KEY_ENV = "COST_ROUTER_QUIET_TEST_KEY"  # litellm's OpenAI client refuses to run without a key


def test_metrics_have_no_created_series(tmp_path: Path) -> None:
    with running_echo_upstream() as upstream:
        cfg = make_config(
            [tier("small", upstream)], tmp_path, teams={"default": {"budget": {"limit_usd": 10.0}}}
        )
        with ProxyThread(cfg) as proxy:
            r = httpx.post(
                f"{proxy.url}/v1/chat/completions",
                timeout=10,
                json={
                    "model": "auto",
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
            assert r.status_code == 200
            text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert "cost_router_requests_total{" in text  # the counters are there
    assert "cost_router_upstream_seconds_bucket{" in text  # and the histograms
    assert "_created" not in text


def test_a_litellm_tier_logs_no_info_lines_per_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-unused")
    monkeypatch.delenv("LITELLM_LOG", raising=False)
    with running_echo_upstream() as upstream:
        cfg = make_config(
            [tier("hosted", upstream, kind="litellm", model="openai/echo", api_key_env=KEY_ENV)],
            tmp_path,
        )
        with ProxyThread(cfg) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
            caplog.set_level(logging.INFO)
            for stream in (False, True):
                answer = client.chat.completions.create(
                    model="auto",
                    max_tokens=5,
                    stream=stream,
                    messages=[{"role": "user", "content": "hi"}],
                )
                if stream:
                    assert list(answer)  # type: ignore[arg-type]
    noisy = [r for r in caplog.records if r.name in LITELLM_LOGGERS and r.levelno < logging.WARNING]
    assert noisy == []
    for name in LITELLM_LOGGERS:  # nothing printed twice: no handler of litellm's own
        assert logging.getLogger(name).handlers == []
