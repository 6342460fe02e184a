"""Budgets under upstream faults on POST /v1/messages (the chat fault test,
tests/router/proxy/test_usage_safety.py, for the Messages endpoint): the real proxy in front of
the fault-injecting upstream, budgets on a real Redis, the audit invariant at the end
(tests/support/audit.py: spend within the limit, equal to the ledger and to what the clients were
told, no reservation left).

Both ways a Messages request reaches a tier: passed through to one that speaks Messages
(`apis: [chat, messages]`: the upstream's usage in Anthropic's shape, huge, negative, not a
number, a cache count below zero or a string) and translated to chat (the upstream's usage in
OpenAI's shape); both streamed or not, streams cut, ended early, with a broken usage event.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from benchmarks.fault_upstream import HUGE_TOKENS, running_fault_upstream
from policies.config import BudgetLimit, BudgetsConfig
from policies.keys import hash_key
from tests.support.audit import Told, check_budget_invariant
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.waiting import wait_for

LIMIT_USD = 5.0
MAX_TOKENS = 50
TEAMS = ("native", "translated", "streamed")
USAGE_FAULTS = (
    "huge_usage",
    "negative_usage",
    "nonnumeric_usage",
    "negative_cached",
    "details_string",
    "cached_over_prompt",
)
STREAM_FAULTS = ("stream_cut", "stream_no_done", "stream_bad_usage", "stream_huge_no_usage")


def key_of(team: str) -> str:
    return f"sk-messages-faults-{team}"


@dataclass
class Rig:
    proxy: ProxyThread
    budgets: BudgetsConfig
    traces: Path
    told: Told


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    prefix = random_prefix()
    budgets = BudgetsConfig(
        store="redis", redis_url=REDIS_URL, key_prefix=prefix, redis_timeout_s=5
    )
    traces = tmp_path_factory.mktemp("traces")
    with running_fault_upstream() as upstream:
        config = make_config(
            [
                tier("chat", upstream, price=(1.0, 2.0)),
                tier("native", upstream, price=(1.0, 2.0), apis=["chat", "messages"]),
            ],
            traces,
            teams={t: {"budget": {"limit_usd": LIMIT_USD, "period": "total"}} for t in TEAMS},
            keys=[{"key_sha256": hash_key(key_of(t)), "team": t} for t in TEAMS],
            budgets=budgets.model_dump(exclude_unset=True),
        )
        try:
            with ProxyThread(config) as p:
                yield Rig(p, budgets, traces, Told())
        finally:
            delete_prefix(prefix)


def ask(tier_name: str, fault: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": tier_name,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": f"tell me about {fault}"}],
        "metadata": {"fault": fault, **extra},  # the fault upstream's choice, passed on
    }


def headers(team: str) -> dict[str, str]:
    return {"x-api-key": key_of(team), "anthropic-version": "2023-06-01"}


def sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for event in raw.split(b"\n\n"):
        lines = dict(ln.split(b": ", 1) for ln in event.splitlines() if b": " in ln)
        if b"event" in lines:
            out.append((lines[b"event"].decode(), orjson.loads(lines[b"data"])))
    return out


@pytest.mark.parametrize("fault", USAGE_FAULTS)
@pytest.mark.parametrize("team", ["native", "translated"])
def test_usage_faults_are_never_money(rig: Rig, team: str, fault: str) -> None:
    """Whatever the upstream claims, the client is told non-negative counts within max_tokens
    and a cost within the reservation; the trace names the fault."""
    tier_name = "native" if team == "native" else "chat"
    r = httpx.post(
        rig.proxy.url + "/v1/messages",
        json=ask(tier_name, fault),
        headers=headers(team),
        timeout=30,
    )
    rig.told.response(team, r)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert all(usage[k] >= 0 for k in ("input_tokens", "output_tokens", "cache_read_input_tokens"))
    assert usage["output_tokens"] <= MAX_TOKENS < HUGE_TOKENS
    assert 0 <= float(r.headers["x-router-cost-usd"]) < 0.001
    record = _trace(rig, r.headers["x-router-request-id"])
    assert record["upstream_endpoint"] == ("messages" if team == "native" else "chat/completions")
    assert record["usage_fault"] is not None


@pytest.mark.parametrize("fault", [*USAGE_FAULTS, *STREAM_FAULTS])
@pytest.mark.parametrize("tier_name", ["chat", "native"], ids=["translated", "passed_through"])
def test_streams_end_whole_or_with_an_error_event(rig: Rig, tier_name: str, fault: str) -> None:
    """Translated from the chat stream, or the upstream's own Messages events relayed."""
    body = {**ask(tier_name, fault, fault_mb="1"), "stream": True}
    with httpx.stream(
        "POST",
        rig.proxy.url + "/v1/messages",
        json=body,
        headers=headers("streamed"),
        timeout=60,
    ) as r:
        raw = r.read()
    rig.told.stream("streamed", r, [ln for ln in raw.decode().splitlines()])
    events = sse(raw)
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start"
    rid = r.headers["x-router-request-id"]
    if fault in ("stream_cut", "stream_no_done"):
        assert kinds[-1] == "error" and "message_stop" not in kinds
        error = events[-1][1]["error"]
        assert error["type"] == "api_error" and rid in error["message"]
        assert f"{tier_name}:" not in error["message"] and "Error" not in error["message"]
        assert _trace(rig, rid)["status"] == 502
    else:
        assert kinds[-2:] == ["message_delta", "message_stop"]
        usage = events[-2][1]["usage"]
        assert 0 <= usage["output_tokens"] <= MAX_TOKENS and usage["input_tokens"] >= 0
        assert usage["cache_read_input_tokens"] >= 0
        assert 0 <= usage["cost_usd"] < 0.001
        record = _trace(rig, rid)
        assert record["upstream_endpoint"] == (
            "messages" if tier_name == "native" else "chat/completions"
        )
        if fault in USAGE_FAULTS or fault == "stream_bad_usage":
            assert record["usage_fault"] is not None


def test_the_sdk_raises_on_a_cut_stream(rig: Rig) -> None:
    client = anthropic.Anthropic(
        base_url=rig.proxy.url, api_key=key_of("streamed"), max_retries=0, timeout=30
    )
    with client.messages.stream(**ask("chat", "stream_cut")) as s:
        rig.told.add("streamed", s.response.headers["x-router-request-id"], None)  # told nothing
        with pytest.raises(anthropic.APIError):  # an answer cut short is never taken as whole
            s.get_final_message()


def test_a_client_that_hangs_up_mid_stream_is_charged_what_was_relayed(rig: Rig) -> None:
    """The translation wraps the relay: hanging up still settles (the audit below checks it;
    the trace says so)."""
    body = {**ask("chat", "none"), "stream": True, "echo": {"chunks": 200, "chunk_delay_ms": 20}}
    with httpx.stream(
        "POST", rig.proxy.url + "/v1/messages", json=body, headers=headers("streamed"), timeout=30
    ) as r:
        rid = r.headers["x-router-request-id"]
        for line in r.iter_lines():
            if line.startswith("data:") and "text_delta" in line:
                break  # one piece of text, then hang up
    rig.told.add("streamed", rid, None)  # told nothing: the trace's cost counts
    record = _trace(rig, rid)
    assert (record["status"], record["error"]) == (499, "client_disconnected")
    assert record["completion_tokens"] < 200 and record["cost_usd"] > 0


def test_zz_the_budget_audit_invariant_holds(rig: Rig) -> None:
    """Last in the module (the name): every request above has ended."""
    limits = {t: BudgetLimit(limit_usd=LIMIT_USD, period="total") for t in TEAMS}
    audit = check_budget_invariant(rig.budgets, limits, rig.told, [rig.traces / "requests.jsonl"])
    assert len(rig.told.requests) >= 4 * len(USAGE_FAULTS) + 2 * len(STREAM_FAULTS)
    assert all(a.spent_nanos > 0 for a in audit.teams)


def _trace(rig: Rig, request_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [r for r in rig.proxy.traces(0) if r["id"] == request_id]
        return bool(found)

    wait_for(seen, 10, f"the trace of {request_id}")
    return found[0]
