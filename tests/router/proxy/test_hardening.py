"""Issue 12's request-path and server findings, each against the real proxy over real HTTP (and
raw sockets where a well-behaved client cannot misbehave), with budgets on a real Redis:

- finding 2: /v1/completions reserves exactly the bound its upstream obeys (`max_tokens`);
- finding 3: a body nested past the limit is a 400 before anything is reserved;
- finding 10: upstream internals (bodies, tracebacks, addresses) never reach the client;
- finding 13: slow bodies and slow heads are cut (408), huge heads refused (431), non-JSON
  content types refused (415), HTTP/1.0 clients get no chunked framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn

from policies.budgets.estimate import bound_fields, worst_case
from policies.budgets.factory import build_stores
from policies.budgets.memory import InMemoryBudgetStore
from policies.keys import Identity, hash_key
from router.proxy.budget_gate import BudgetGate
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.ports import free_port
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.waiting import wait_for

KEY = "sk-hardening-alpha"
AUTH = {"authorization": f"Bearer {KEY}"}
JSON = {"content-type": "application/json"}
SECRET = "sk-upstream-SECRET-7f3a"
INTERNAL_HOST = "db-internal-7.corp.example"
PROMPT = [{"role": "user", "content": "hello"}]


class RecordingUpstream:
    """An OpenAI-compatible upstream that records each body it receives. `hold` in a body
    keeps the answer until the test releases it; `crash` answers 500 with a traceback naming
    an internal host; `reject` answers a 400 whose message carries a secret; `deep` answers JSON
    nested too deep to re-serialise."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.release = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": f"{kind}.complete"})
                if kind == "lifespan.shutdown":
                    return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = orjson.loads(raw)
        self.bodies.append(body)
        mode = body.get("mode")
        if mode == "hold":
            await asyncio.to_thread(self.release.wait, 30)
        if mode == "crash":
            text = (
                f'Traceback (most recent call last):\n  File "/srv/engine/worker.py", line 7\n'
                f"ConnectionError: {INTERNAL_HOST} (10.31.4.7:5432) key {SECRET}"
            )
            await _send(send, 500, text.encode(), b"text/plain")
            return
        if mode == "reject":
            error = {
                "error": {
                    "message": f"invalid api key {SECRET} for {INTERNAL_HOST}",
                    "type": "invalid_request_error",
                }
            }
            await _send(send, 400, orjson.dumps(error), b"application/json")
            return
        if mode == "deep":  # valid JSON, but too deep to be re-serialised
            raw = b'{"id":"r","choices":[],"x":' + b"[" * 300 + b"]" * 300 + b"}"
            await _send(send, 200, raw, b"application/json")
            return
        text_key = "text" if "prompt" in body else "message"
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        if body.get("stream"):
            delta = (
                {"index": 0, "text": "hi"}
                if text_key == "text"
                else {"index": 0, "delta": {"content": "hi"}}
            )
            events = [
                {"id": "r", "model": "m", "choices": [delta]},
                {"id": "r", "model": "m", "choices": [], "usage": usage},
            ]
            sse = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
            await _send(send, 200, sse + b"data: [DONE]\n\n", b"text/event-stream")
            return
        choice.update(
            {"text": "hi"}
            if text_key == "text"
            else {"message": {"role": "assistant", "content": "hi"}}
        )
        answer = {"id": "r", "model": "m", "choices": [choice], "usage": usage}
        await _send(send, 200, orjson.dumps(answer), b"application/json")


async def _send(send: Any, status: int, body: bytes, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, RecordingUpstream]]:
    app = RecordingUpstream()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 20, "the recording upstream to start")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", app
    finally:
        app.release.set()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


# Output is dear and input cheap, so a reservation's size says which bound it was made for.
PRICE = (1.0, 1000.0)


@pytest.fixture(scope="module")
def proxy(
    upstream: tuple[str, RecordingUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyThread]:
    url, _ = upstream
    prefix = random_prefix()
    config = make_config(
        [
            tier("main", url, price=PRICE),
            tier("dead", f"http://127.0.0.1:{free_port()}/v1", price=PRICE),
        ],
        tmp_path_factory.mktemp("hardening"),
        server={"body_timeout_s": 1.0, "max_header_bytes": 16 * 1024, "max_headers": 50},
        default_policy="main",
        policies={"main": {"type": "fixed", "tier": "main"}},
        teams={"alpha": {"budget": {"limit_usd": 10_000, "period": "monthly"}}},
        keys=[{"key_sha256": hash_key(KEY), "team": "alpha"}],
        auth={"required": True},
        budgets={"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
    )
    with ProxyThread(config) as p:
        yield p
    delete_prefix(prefix)


def reserved_usd(proxy: ProxyThread) -> float:
    r = httpx.get(proxy.url + "/v1/budget", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    return sum(s["reserved_usd"] for s in r.json()["scopes"])


def post(proxy: ProxyThread, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(proxy.url + path, json=body, headers=AUTH, timeout=30, **kw)


# --- finding 2 -----------------------------------------------------------------------------------


def test_completions_reserve_the_max_tokens_the_upstream_obeys(
    proxy: ProxyThread, upstream: tuple[str, RecordingUpstream]
) -> None:
    _, recorder = upstream
    recorder.release.clear()
    body = {
        "model": "main",
        "prompt": "hello",
        "max_completion_tokens": 1,
        "max_tokens": 100_000,
        "mode": "hold",
    }
    seen = len(recorder.bodies)
    done: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: done.append(post(proxy, "/v1/completions", body)))
    worker.start()
    try:
        wait_for(lambda: len(recorder.bodies) > seen, 10, "the upstream to get the request")
        sent = recorder.bodies[seen]
        held = reserved_usd(proxy)
    finally:
        recorder.release.set()
        worker.join(timeout=30)
    # The upstream generates up to max_tokens; the reservation covers exactly that many.
    assert sent["max_tokens"] == 100_000
    assert sent.get("max_completion_tokens", 100_000) == 100_000
    assert held >= 100_000 * PRICE[1] / 1e6
    assert done and done[0].status_code == 200, done


def test_chat_with_both_bounds_reserves_and_sends_the_larger(
    proxy: ProxyThread, upstream: tuple[str, RecordingUpstream]
) -> None:
    _, recorder = upstream
    body = {"model": "main", "messages": PROMPT, "max_completion_tokens": 7, "max_tokens": 9}
    seen = len(recorder.bodies)
    r = post(proxy, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    sent = recorder.bodies[seen]
    assert sent["max_tokens"] == 9 and sent["max_completion_tokens"] == 9


# --- finding 3 -----------------------------------------------------------------------------------


def test_deeply_nested_body_is_a_400_and_reserves_nothing(proxy: ProxyThread) -> None:
    raw = orjson.dumps({"model": "main", "messages": PROMPT, "metadata": "@"}).replace(
        b'"@"', b'{"a":' * 300 + b'"x"' + b"}" * 300
    )
    r = httpx.post(
        proxy.url + "/v1/chat/completions", content=raw, headers={**AUTH, **JSON}, timeout=30
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_json" and "nested deeper" in err["message"]
    assert reserved_usd(proxy) == 0


def test_an_upstream_answer_too_deep_to_relay_is_a_502_and_releases(proxy: ProxyThread) -> None:
    r = post(proxy, "/v1/chat/completions", {"model": "main", "messages": PROMPT, "mode": "deep"})
    assert r.status_code == 502, r.text  # the upstream's fault, not a 500 of ours
    assert r.json()["error"]["code"] == "upstream_error"
    wait_for(lambda: reserved_usd(proxy) == 0, 10, "the reservation to be released")
    assert trace_of(proxy, r)["status"] == 502


# --- finding 10 ----------------------------------------------------------------------------------


def _assert_clean(r: httpx.Response) -> None:
    for leak in (
        SECRET,
        INTERNAL_HOST,
        "10.31.4.7",
        "Traceback",
        "worker.py",
        "127.0.0.1",
        "ClientConnectorError",
    ):
        assert leak not in r.text, (leak, r.text)
    assert r.headers["x-router-request-id"] in r.json()["error"]["message"] or r.status_code >= 500


def test_upstream_5xx_traceback_never_reaches_the_client(proxy: ProxyThread) -> None:
    r = post(proxy, "/v1/chat/completions", {"model": "main", "messages": PROMPT, "mode": "crash"})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_error"
    _assert_clean(r)
    assert INTERNAL_HOST in trace_of(proxy, r)["error_detail"]  # the operator still sees it


def trace_of(proxy: ProxyThread, r: httpx.Response) -> dict[str, Any]:
    rid = r.headers["x-router-request-id"]
    found: list[dict[str, Any]] = []
    wait_for(
        lambda: found.extend(t for t in proxy.traces(0) if t["id"] == rid) or found,
        10,
        f"the trace of {rid}",
    )
    return found[0]


def test_unreachable_upstream_address_never_reaches_the_client(proxy: ProxyThread) -> None:
    r = post(proxy, "/v1/chat/completions", {"model": "dead", "messages": PROMPT})
    assert r.status_code == 503, r.text
    assert "unreachable" in r.json()["error"]["message"]
    _assert_clean(r)


def test_upstream_4xx_body_is_not_passed_through(proxy: ProxyThread) -> None:
    r = post(proxy, "/v1/chat/completions", {"model": "main", "messages": PROMPT, "mode": "reject"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "upstream_client_error" and err["type"] == "invalid_request_error"
    _assert_clean(r)
    assert SECRET in trace_of(proxy, r)["error_detail"]


# --- finding 13 ----------------------------------------------------------------------------------


def _connect(proxy: ProxyThread) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (10 s at most)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def test_slow_body_is_cut_with_408(proxy: ProxyThread) -> None:
    body = orjson.dumps({"model": "main", "messages": PROMPT})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    with _connect(proxy) as sock:
        sock.sendall(head)
        started = time.monotonic()
        sock.settimeout(0.2)
        answer = b""
        for byte in body:  # a client dripping its body, as slowloris does
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            try:
                answer += sock.recv(65536)
            except TimeoutError:
                continue
            if answer:
                break
        sock.settimeout(10)
        answer += _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer
    assert time.monotonic() - started < 5  # body_timeout_s is 1 s here

    def traced() -> bool:
        return any(t["status"] == 408 and t["error"] == "request_timeout" for t in proxy.traces(0))

    wait_for(traced, 10, "the cut request's trace record")


def test_slow_head_is_cut_with_408(proxy: ProxyThread) -> None:
    with _connect(proxy) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # and nothing more
        started = time.monotonic()
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "head",
    [
        b"x-big: " + b"a" * (1024 * 1024) + b"\r\n",  # one 1 MB header
        b"".join(b"x-h%d: v\r\n" % i for i in range(10_000)),  # 10,000 headers
    ],
    ids=["1MB-header", "10000-headers"],
)
def test_oversized_heads_are_431(proxy: ProxyThread, head: bytes) -> None:
    with _connect(proxy) as sock:
        # The server may close before the client has sent it all.
        with contextlib.suppress(OSError):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + head + b"\r\n")
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == (
        "request_header_fields_too_large"
    )


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_non_json_content_type_is_415(proxy: ProxyThread, content_type: str | None) -> None:
    raw = orjson.dumps({"model": "main", "messages": PROMPT})
    headers = {**AUTH, **({"content-type": content_type} if content_type else {})}
    r = httpx.post(proxy.url + "/v1/chat/completions", content=raw, headers=headers, timeout=30)
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_media_type"
    ok = httpx.post(
        proxy.url + "/v1/chat/completions",
        content=raw,
        timeout=30,
        headers={**AUTH, "content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200, ok.text


def test_http10_stream_is_not_chunked(proxy: ProxyThread) -> None:
    body = orjson.dumps({"model": "main", "messages": PROMPT, "stream": True})
    with _connect(proxy) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.0\r\nhost: x\r\n"
            + f"authorization: Bearer {KEY}\r\n".encode()
            + b"content-type: application/json\r\n"
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )
        answer = _read_all(sock)  # close-delimited: ends when the server closes
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding" not in head.lower()
    assert content.startswith(b"data: ") and content.endswith(b"data: [DONE]\n\n"), content


def test_config_rejects_bad_server_limits(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="body_timeout_s"):
        make_config([tier("main", "http://127.0.0.1:1/v1")], tmp_path, server={"body_timeout_s": 0})


def test_http10_plain_answer_has_a_content_length(proxy: ProxyThread) -> None:
    body = orjson.dumps({"model": "main", "messages": PROMPT})
    with _connect(proxy) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.0\r\nhost: x\r\n"
            + f"authorization: Bearer {KEY}\r\n".encode()
            + b"content-type: application/json\r\n"
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )
        answer = _read_all(sock)
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
    assert b"content-length: %d" % len(content) in head.lower()


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"max_tokens": 5},
        {"max_completion_tokens": 5},
        {"max_completion_tokens": 1, "max_tokens": 100_000},
        {"max_completion_tokens": 100_000, "max_tokens": 1},
    ],
)
def test_the_body_sent_carries_the_reserved_bound(
    endpoint: str, fields: dict[str, int], tmp_path: Path
) -> None:
    """Whatever bound fields a body has, every one the upstream could honour (either name) equals
    the bound the reservation is computed from."""
    config = make_config([tier("main", "http://127.0.0.1:1/v1", price=PRICE)], tmp_path)
    gate = BudgetGate(InMemoryBudgetStore(60), config.budgets, {}, [], config.tiers_by_name)
    base = (
        {"model": "main", "messages": PROMPT}
        if endpoint.startswith("chat")
        else {"model": "main", "prompt": "hi"}
    )
    sent = gate.bound_body({**base, **fields}, endpoint)
    worst = worst_case(
        sent, config.tiers[0].price, config.budgets.default_max_tokens, endpoint=endpoint
    )
    carried = {sent[n] for n in ("max_tokens", "max_completion_tokens") if n in sent}
    assert carried == {worst.completion_tokens}
    assert any(n in sent for n in bound_fields(endpoint))  # one the endpoint obeys


def _post_quietly(proxy: ProxyThread, path: str, body: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the proxy stops under this request
        post(proxy, path, body)


def test_a_request_cancelled_by_shutdown_releases_its_reservation(
    upstream: tuple[str, RecordingUpstream], tmp_path: Path
) -> None:
    """Past the drain timeout uvicorn cancels the requests still running: each gives back what
    it reserved (before, the hold stayed until its lease ran out, renewed meanwhile)."""
    url, recorder = upstream
    recorder.release.clear()
    prefix = random_prefix()
    config = make_config(
        [tier("main", url, price=PRICE)],
        tmp_path,
        server={"drain_timeout_s": 0},
        default_policy="main",
        policies={"main": {"type": "fixed", "tier": "main"}},
        teams={"alpha": {"budget": {"limit_usd": 10_000, "period": "monthly"}}},
        keys=[{"key_sha256": hash_key(KEY), "team": "alpha"}],
        auth={"required": True},
        budgets={"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
    )
    seen = len(recorder.bodies)
    try:
        with ProxyThread(config) as p:
            scope = p.state.budgets.scope(Identity("alpha", hash_key(KEY)[:16]))
            body = {"model": "main", "messages": PROMPT, "max_tokens": 10, "mode": "hold"}
            worker = threading.Thread(
                target=_post_quietly, daemon=True, args=(p, "/v1/chat/completions", body)
            )
            worker.start()
            wait_for(lambda: len(recorder.bodies) > seen, 10, "the upstream to get the request")
            assert reserved_usd(p) > 0
        store, _ = build_stores(config.budgets)

        async def reserved() -> int:
            try:
                return sum(s.reserved_nanos for s in await store.status(scope))
            finally:
                await store.aclose()

        assert asyncio.run(reserved()) == 0
    finally:
        recorder.release.set()
        delete_prefix(prefix)


def test_a_whole_float_bound_is_reserved_and_sent_as_the_integer(
    proxy: ProxyThread, upstream: tuple[str, RecordingUpstream]
) -> None:
    """JSON Schema (so the published schema) calls 100000.0 an integer: the proxy takes it,
    reserves for 100,000 tokens and sends the upstream the integer (router/http/schemas.py
    `Whole`), never a float the budget would not read as a bound."""
    _, recorder = upstream
    recorder.release.clear()
    body = {"model": "main", "prompt": "hello", "max_tokens": 100_000.0, "n": 1.0, "mode": "hold"}
    seen = len(recorder.bodies)
    done: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: done.append(post(proxy, "/v1/completions", body)))
    worker.start()
    try:
        wait_for(lambda: len(recorder.bodies) > seen, 10, "the upstream to get the request")
        sent = recorder.bodies[seen]
        held = reserved_usd(proxy)
    finally:
        recorder.release.set()
        worker.join(timeout=30)
    assert sent["max_tokens"] == 100_000 and type(sent["max_tokens"]) is int
    assert type(sent["n"]) is int
    assert held >= 100_000 * PRICE[1] / 1e6
    assert done and done[0].status_code == 200, done
