"""Proxy behaviour in front of our echo upstream: fallback, limits, errors, streaming usage,
disconnects, traces and metrics. Real processes and sockets throughout."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from benchmarks.echo_upstream import PrefixCache, running_echo_upstream
from tests.support.ports import free_port
from tests.support.proxy import ProxyThread, make_config, tier
from trace_format.schema import TraceRecord

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


@pytest.fixture(scope="module")
def echo_no_usage() -> Iterator[str]:
    with running_echo_upstream("--no-usage", "--chunks", "5") as url:
        yield url


@pytest.fixture(scope="module")
def proxy(echo: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens here
    config = make_config(
        [
            tier("small", echo, price=(0.6, 0.6), fallback=["large"]),
            tier("large", echo, price=(10, 30)),
            tier("dead", down, price=(0.1, 0.1), fallback=["small"]),
            tier("deadend", down, price=(0.1, 0.1)),
        ],
        tmp_path_factory.mktemp("traces"),
        server={"max_body_bytes": 4096},
    )
    with ProxyThread(config) as p:
        yield p


def post(proxy: ProxyThread, body: Any, path: str = "/v1/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(
        proxy.url + path, content=content, timeout=30, headers={"content-type": "application/json"}
    )


def trace_of(proxy: ProxyThread, request_id: str) -> dict[str, Any]:
    for _ in range(100):
        for record in proxy.traces(0):
            if record["id"] == request_id:
                return record
        asyncio.run(asyncio.sleep(0.02))
    raise AssertionError(f"no trace for {request_id}")


def test_routed_answer_has_decision_headers_cost_and_trace(proxy: ProxyThread) -> None:
    r = post(proxy, CHAT)
    assert r.status_code == 200
    assert r.headers["x-router-policy"] == "balanced"
    assert r.headers["x-router-tier"] in ("small", "large")
    assert 0 <= float(r.headers["x-router-score"]) <= 1
    usage = r.json()["usage"]
    price = proxy.config.tier(r.headers["x-router-tier"]).price
    expected = price.cost(usage["prompt_tokens"], usage["completion_tokens"])
    assert float(r.headers["x-router-cost-usd"]) == pytest.approx(expected, abs=1e-9)
    record = TraceRecord.model_validate(trace_of(proxy, r.headers["x-router-request-id"]))
    assert record.tier == r.headers["x-router-tier"] and record.status == 200
    assert record.prompt_tokens == usage["prompt_tokens"] and record.requested_model == "auto"
    assert record.cost_usd == pytest.approx(expected)


def test_explicit_tier_passes_through_unscored(proxy: ProxyThread) -> None:
    r = post(proxy, {**CHAT, "model": "large"})
    assert r.status_code == 200
    assert r.headers["x-router-tier"] == "large"
    assert r.headers["x-router-policy"] == "passthrough"
    assert "x-router-score" not in r.headers


def test_down_tier_falls_back_and_trace_records_it(proxy: ProxyThread) -> None:
    r = post(proxy, {**CHAT, "model": "dead"})
    assert r.status_code == 200
    assert r.headers["x-router-tier"] == "small"
    assert r.headers["x-router-fallback-from"] == "dead"
    record = trace_of(proxy, r.headers["x-router-request-id"])
    assert record["fallback_from"] == "dead" and record["tiers_tried"] == ["dead", "small"]


def test_all_tiers_down_is_503_openai_error(proxy: ProxyThread) -> None:
    r = post(proxy, {**CHAT, "model": "deadend"})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "upstream_unavailable"


def test_upstream_5xx_falls_back_and_4xx_is_returned_untouched(
    proxy: ProxyThread, echo: str
) -> None:
    r = post(proxy, {**CHAT, "model": "small", "echo": {"fail_status": 500}})
    # small fails 500 -> large (same echo server, also 500 for this body) -> 502
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
    before = httpx.get(echo.removesuffix("/v1") + "/stats").json()["served"]
    r = post(proxy, {**CHAT, "model": "small", "echo": {"fail_status": 400}})
    assert r.status_code == 400  # the status passes; the upstream's body stays in the log
    assert r.json()["error"]["code"] == "upstream_client_error"
    assert "echo failure" not in r.text
    after = httpx.get(echo.removesuffix("/v1") + "/stats").json()["served"]
    assert after - before == 1  # a 4xx is neither retried nor sent to the fallback tier


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"", 400, "invalid_json"),
        (
            b'{"model": "auto", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
            400,
            "invalid_json",
        ),
        (b"[1, 2]", 400, "invalid_request"),
        ({"model": "auto"}, 400, "invalid_request"),
        ({"model": "auto", "messages": "hi"}, 400, "invalid_request"),
        ({"model": 5, "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request"),
        ({**CHAT, "stream": "yes"}, 400, "invalid_request"),
        ({**CHAT, "max_tokens": -1}, 400, "invalid_request"),
        (
            {"model": "auto", "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "invalid_request",
        ),
        ({**CHAT, "model": "router:nope"}, 404, "model_not_found"),
        ({**CHAT, "pad": "x" * 5000}, 413, "request_too_large"),
    ],
)
def test_bad_input_gets_openai_error_never_500(
    proxy: ProxyThread, body: Any, status: int, code: str
) -> None:
    r = post(proxy, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and "Traceback" not in r.text


def test_oversized_chunked_body_is_413(proxy: ProxyThread) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "auto", "messages": [], "pad": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    r = httpx.post(
        proxy.url + "/v1/chat/completions",
        content=chunks(),
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413


def test_unknown_route_and_method_are_openai_errors(proxy: ProxyThread) -> None:
    r = httpx.get(proxy.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(proxy.url + "/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def _sse_payloads(text: str) -> list[Any]:
    out = []
    for event in text.split("\n\n"):
        if event.startswith("data: "):
            data = event[6:]
            out.append(data if data == "[DONE]" else orjson.loads(data))
    return out


def test_stream_passes_upstream_usage_with_cost_when_asked(proxy: ProxyThread) -> None:
    body = {**CHAT, "model": "small", "stream": True, "stream_options": {"include_usage": True}}
    r = post(proxy, body)
    events = _sse_payloads(r.text)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert events[-2]["choices"] == []
    assert usage["completion_tokens"] == 8  # the echo server's own report
    assert usage["cost_usd"] == pytest.approx(0.6 * (usage["prompt_tokens"] + 8) / 1e6)
    assert "".join(e["choices"][0]["delta"]["content"] for e in events[:-2]) == " ".join(
        ["echo"] * 8
    )


def test_stream_without_include_usage_hides_usage_chunk(proxy: ProxyThread) -> None:
    r = post(proxy, {**CHAT, "model": "small", "stream": True})
    events = _sse_payloads(r.text)
    assert events[-1] == "[DONE]"
    assert all(e["choices"] for e in events[:-1])
    # ...but the trace still has the upstream-reported usage (we always ask the upstream).
    record = trace_of(proxy, r.headers["x-router-request-id"])
    assert record["completion_tokens"] == 8 and record["stream"] is True


def test_stream_usage_is_synthesised_when_upstream_sends_none(
    echo_no_usage: str, tmp_path: Path
) -> None:
    config = make_config([tier("small", echo_no_usage, price=(1, 2))], tmp_path)
    with ProxyThread(config) as proxy:
        body = {**CHAT, "model": "small", "stream": True, "stream_options": {"include_usage": True}}
        events = _sse_payloads(post(proxy, body).text)
        usage = events[-2]["usage"]
        # five chunks "echo echo echo echo echo" -> counted by us with tiktoken
        assert usage["completion_tokens"] == 5
        assert usage["prompt_tokens"] > 0
        cost = (usage["prompt_tokens"] * 1 + 5 * 2) / 1e6
        assert usage["cost_usd"] == pytest.approx(cost)
        assert proxy.traces(1)[-1]["cost_usd"] == pytest.approx(cost)


def test_completions_endpoint_and_models(proxy: ProxyThread) -> None:
    r = post(proxy, {"model": "auto", "prompt": "Once upon a time"}, "/v1/completions")
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    ids = [m["id"] for m in httpx.get(proxy.url + "/v1/models").json()["data"]]
    assert {"auto", "router:balanced", "small", "large"} <= set(ids)


def test_readyz_reports_down_tier_and_healthz_is_live(proxy: ProxyThread) -> None:
    assert httpx.get(proxy.url + "/healthz").json() == {"status": "ok"}
    r = httpx.get(proxy.url + "/readyz")
    # The default policy's tiers fall back to a live one: ready, each tier's state in the body
    # (tests/router/endpoints/test_readyz.py has the rule).
    assert r.status_code == 200, r.text
    checks = r.json()["checks"]
    assert checks["tier:small"]["ok"] and not checks["tier:dead"]["ok"]
    assert all(p["ok"] for p in r.json()["paths"].values())


def test_metrics_count_requests_cost_and_classifier_latency(proxy: ProxyThread) -> None:
    post(proxy, {**CHAT, "model": "small"})
    post(proxy, {**CHAT, "model": "dead"})  # falls back to small
    text = httpx.get(proxy.url + "/metrics").text
    assert 'cost_router_requests_total{policy="passthrough",status="200",tier="small"}' in text
    assert "cost_router_classifier_seconds_count" in text
    assert 'cost_router_cost_usd_total{team="default",tier="small"}' in text
    assert 'cost_router_fallbacks_total{from_tier="dead",to_tier="small"}' in text


def test_hundreds_of_concurrent_requests_all_answered_and_traced(echo: str, tmp_path: Path) -> None:
    config = make_config([tier("small", echo, max_inflight=32, queue_timeout_s=10)], tmp_path)
    with ProxyThread(config) as proxy:

        async def burst() -> list[int]:
            async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
                calls = [
                    client.post("/v1/chat/completions", json={**CHAT, "model": "small"})
                    for _ in range(300)
                ]
                return [r.status_code for r in await asyncio.gather(*calls)]

        assert asyncio.run(burst()) == [200] * 300
        records = proxy.traces(300)
        assert len(records) == 300 and len({r["id"] for r in records}) == 300


def test_max_inflight_gives_429_rate_limited_without_fallback(echo: str, tmp_path: Path) -> None:
    slow = tier("small", echo, max_inflight=2, queue_timeout_s=0.1)
    config = make_config([slow], tmp_path)
    with ProxyThread(config) as proxy:
        # 1.5 s upstream answers: all six requests are in before the first two slots free up.
        statuses, codes = asyncio.run(_concurrent(proxy, 6, {"delay_ms": 1500}))
        assert statuses.count(200) == 2 and statuses.count(429) == 4
        assert set(codes) == {"rate_limited"}


def test_max_inflight_falls_back_to_next_tier(echo: str, tmp_path: Path) -> None:
    tiers = [
        tier("small", echo, max_inflight=1, queue_timeout_s=0.05, fallback=["large"]),
        tier("large", echo, max_inflight=8, price=(10, 30)),
    ]
    with ProxyThread(make_config(tiers, tmp_path)) as proxy:
        responses = asyncio.run(_concurrent_responses(proxy, 4, {"delay_ms": 1000}))
        assert [r.status_code for r in responses] == [200] * 4
        tiers_used = sorted(r.headers["x-router-tier"] for r in responses)
        assert tiers_used == ["large", "large", "large", "small"]


async def _concurrent_responses(
    proxy: ProxyThread, n: int, echo_opts: dict[str, Any]
) -> list[httpx.Response]:
    body = {**CHAT, "model": "small", "echo": echo_opts}
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        return list(
            await asyncio.gather(
                *(client.post("/v1/chat/completions", json=body) for _ in range(n))
            )
        )


async def _concurrent(
    proxy: ProxyThread, n: int, echo_opts: dict[str, Any]
) -> tuple[list[int], list[str]]:
    responses = await _concurrent_responses(proxy, n, echo_opts)
    codes = [r.json()["error"]["code"] for r in responses if r.status_code != 200]
    return [r.status_code for r in responses], codes


def test_client_disconnect_frees_the_tier_slot_at_once(echo: str, tmp_path: Path) -> None:
    config = make_config([tier("small", echo, max_inflight=1, queue_timeout_s=0)], tmp_path)
    with ProxyThread(config) as proxy:
        body = {**CHAT, "model": "small", "echo": {"delay_ms": 5000}}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=0.5)
        # The abandoned request no longer holds the only slot: a new one is served now,
        # long before the 5 s upstream answer would have freed it.
        r = httpx.post(
            proxy.url + "/v1/chat/completions", json={**CHAT, "model": "small"}, timeout=3
        )
        assert r.status_code == 200
        statuses = [t["status"] for t in proxy.traces(2)]
        assert 499 in statuses


def test_client_disconnect_mid_stream_closes_upstream(tmp_path: Path) -> None:
    with running_echo_upstream("--chunks", "200", "--chunk-delay-ms", "50") as slow:
        config = make_config([tier("small", slow)], tmp_path)
        with ProxyThread(config) as proxy:
            body = {**CHAT, "model": "small", "stream": True}
            with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body) as r:
                for _ in r.iter_raw():
                    break  # first bytes, then hang up
            stats = slow.removesuffix("/v1") + "/stats"
            for _ in range(100):
                if httpx.get(stats).json()["cancelled"] == 1:
                    break
                asyncio.run(asyncio.sleep(0.05))
            assert httpx.get(stats).json()["cancelled"] == 1
            record = proxy.traces(1)[-1]
            assert record["status"] == 499 and record["error"] == "client_disconnected"
            assert record["completion_tokens"] >= 1  # what was streamed is still charged


def test_litellm_tier_routes_through_litellm(echo: str, tmp_path: Path) -> None:
    t = tier("hosted", echo, kind="litellm")
    t["model"] = "openai/echo"
    t["api_key_env"] = "COST_ROUTER_TEST_KEY"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COST_ROUTER_TEST_KEY", "sk-test")
        with ProxyThread(make_config([t], tmp_path)) as proxy:
            r = post(proxy, {**CHAT, "model": "hosted"})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"].startswith("echo")
            assert r.headers["x-router-tier"] == "hosted"
            s = post(
                proxy,
                {
                    **CHAT,
                    "model": "hosted",
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
            events = _sse_payloads(s.text)
            assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] > 0


def test_prompt_is_traced_only_when_configured(echo: str, tmp_path: Path) -> None:
    for include in (False, True):
        out = tmp_path / str(include)
        config = make_config(
            [tier("small", echo)],
            out,
            traces={"path": str(out / "requests.jsonl"), "include_prompt": include},
        )
        with ProxyThread(config) as proxy:
            assert post(proxy, {**CHAT, "model": "small"}).status_code == 200
            record = proxy.traces(1)[-1]
        assert (record.get("prompt") is not None) is include
        if include:
            assert "hello there" in record["prompt"]
            assert record["messages"] == CHAT["messages"]


def test_timed_out_tier_falls_back(echo: str, tmp_path: Path) -> None:
    tiers = [
        tier("small", echo, timeout_s=0.3, fallback=["large"]),
        tier("large", echo, price=(10, 30)),
    ]
    with ProxyThread(make_config(tiers, tmp_path)) as proxy:
        r = post(proxy, {**CHAT, "model": "small", "echo": {"delay_ms": 800}})
        assert r.status_code == 200
        assert r.headers["x-router-tier"] == "large"
        assert r.headers["x-router-fallback-from"] == "small"
        r = post(proxy, {**CHAT, "model": "small", "echo": {"delay_ms": 800}, "stream": True})
        assert r.status_code == 200 and r.headers["x-router-tier"] == "large"


# --- the echo's prompt cache (issue 23, item 7) ----------------------------------------------


def _cached(url: str, words: str, model: str = "m", stream: bool = False, **echo: Any) -> int:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": words}]}
    if echo:
        body["echo"] = echo
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(url + "/chat/completions", json=body, timeout=10)
    assert r.status_code == 200
    if stream:
        usage = orjson.loads(r.content.split(b"\n\n")[-3].removeprefix(b"data: "))["usage"]
    else:
        usage = r.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 0 <= cached <= usage["prompt_tokens"]
    return int(cached)


def test_echo_reports_the_longest_cached_prefix_per_model_in_whole_blocks() -> None:
    ten = "a b c d e f g h i j"
    with running_echo_upstream("--cache-block", "4") as url:
        assert _cached(url, ten) == 0  # first sight: nothing cached
        assert _cached(url, ten) == 8  # two whole blocks of 4; the last 2 words are no block
        assert _cached(url, ten + " k l m") == 8  # a longer prompt with that prefix
        assert _cached(url, ten + " k l m", stream=True) == 12  # streams report it too
        assert _cached(url, ten, model="other") == 0  # per model: another model's cache is cold
        assert _cached(url, "z " + ten) == 0  # a prefix, not any shared text
        assert _cached(url, ten, cache_ttl_s=1e-9) == 0  # last used longer ago than the TTL
        assert _cached(url, ten, cache_block=1) == 0  # blocks of another size: none cached yet
        assert _cached(url, ten, cache_block=1) == 10  # exact
    with running_echo_upstream("--cache-ttl-s", "0") as url:
        assert _cached(url, ten) == _cached(url, ten) == 0  # no cache


def test_prefix_cache_stays_within_its_entries() -> None:
    cache = PrefixCache(entries=2)
    words = ["a", "b", "c", "d"]
    assert cache.serve("m", words, 1, 60) == 0  # 4 block prefixes, 2 kept: the last two
    assert len(cache.last_used) == 2
    assert cache.serve("m", words, 1, 60) == 0  # its first block was evicted: no prefix hit
