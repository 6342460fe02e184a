"""A small, fast OpenAI-compatible server: the upstream for overhead benchmarks and load tests.

Raw ASGI on uvicorn (no framework) so that it costs as little CPU as possible and the proxy, not
this server, is what a benchmark measures. It answers `/v1/chat/completions`, `/v1/completions`
(both streaming and not, with usage), `/v1/embeddings` and `/v1/models`.

Behaviour is set per server on the command line and may be overridden per request with an
``echo`` object in the body (the proxy passes unknown fields through), e.g.
``{"echo": {"delay_ms": 200, "fail_status": 503}}``.

A prompt cache, as OpenAI's: per model (the request's ``model``), the prompts it served are kept
for ``--cache-ttl-s`` seconds after their last use (default 300, 0 = no cache), and an answer's
``usage.prompt_tokens_details.cached_tokens`` is the longest prefix of its prompt tokens that an
earlier request of the same model left in the cache, in whole blocks of ``--cache-block`` tokens
(default 16; OpenAI counts in 128-token increments; 1 = exact). Its tokens are the prompt's
whitespace-separated words, messages in order (what ``prompt_tokens`` counts). Every answer
reports the field, 0 on a miss, as OpenAI does.

    python -m benchmarks.echo_upstream --port 0     # prints "listening on http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@dataclass(frozen=True, slots=True)
class EchoBehaviour:
    delay_ms: float = 0.0  # before the (first byte of the) answer
    chunk_delay_ms: float = 0.0  # between streamed chunks
    chunks: int = 8  # content chunks per streamed answer
    fail_status: int = 0  # answer every request with this status (0 = never)
    usage: bool = True  # False mimics llama.cpp: no usage in streams even when asked
    model: str = "echo"
    cache_ttl_s: float = 300.0  # prompt cache lifetime after last use; 0: no cache
    cache_block: int = 16  # cached tokens are counted in whole blocks of this many
    # A chat request offering `tools` is answered with a call of its first tool until it
    # carries this many tool results (0: never call a tool); see _tool_call.
    tool_rounds: int = 0

    def merged(self, overrides: Any) -> EchoBehaviour:
        if not isinstance(overrides, dict):
            return self
        known = {k: v for k, v in overrides.items() if k in self.__dataclass_fields__}
        return replace(self, **known)


def _tokens(body: dict[str, Any]) -> list[str]:
    """A cheap stand-in for a tokenizer: whitespace-separated words of the prompt."""
    if "messages" in body:
        out: list[str] = []
        for m in body.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                out += content.split()
        return out
    prompt = body.get("prompt")
    return prompt.split() if isinstance(prompt, str) else []


def _words(body: dict[str, Any]) -> int:
    """The prompt's token count (a prompt that is not text counts as one)."""
    if "messages" not in body and not isinstance(body.get("prompt"), str):
        return 1
    return len(_tokens(body))


# Block prefixes kept at most (all models together): the oldest used go first, so a long load
# test's memory stays bounded (one entry is a hash and a float).
CACHE_ENTRIES = 200_000


class PrefixCache:
    """Which block-aligned prompt prefixes each model has seen within its TTL.

    A prefix is keyed by a chained hash of its blocks, so a lookup is one hash and one dict probe
    per block of the prompt, and never compares text."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self.last_used: OrderedDict[tuple[str, int], float] = OrderedDict()

    def serve(self, model: str, tokens: list[str], block: int, ttl_s: float) -> int:
        """The cached tokens of this prompt (its longest cached block prefix); then the prompt's
        blocks are cached (or refreshed) for `ttl_s` seconds."""
        if ttl_s <= 0 or block <= 0:
            return 0
        now = time.monotonic()
        cached, hit, chain = 0, True, hash(model)
        for start in range(0, len(tokens) - block + 1, block):
            chain = hash((chain, *tokens[start : start + block]))
            key = (model, chain)
            used = self.last_used.pop(key, None)
            if hit and used is not None and now - used <= ttl_s:
                cached = start + block
            else:
                hit = False  # a longer prefix cannot be cached when this one is not
            self.last_used[key] = now
        while len(self.last_used) > self.entries:
            self.last_used.popitem(last=False)
        return cached


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class EchoApp:
    def __init__(self, behaviour: EchoBehaviour) -> None:
        self.behaviour = behaviour
        self.served = 0
        self.cancelled = 0  # streams whose client went away before the end
        self.cache = PrefixCache()

    def prompt_usage(self, body: dict[str, Any], b: EchoBehaviour) -> tuple[int, int]:
        """(prompt tokens, cached tokens) of a request; the prompt is cached for the next."""
        tokens = _tokens(body)
        model = body.get("model")
        key = model if isinstance(model, str) else b.model
        cached = self.cache.serve(key, tokens, b.cache_block, b.cache_ttl_s)
        prompt_tokens = len(tokens) if tokens or "messages" in body else _words(body)
        return prompt_tokens, cached

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path = scope["path"]
        if path in ("/v1/models", "/models"):
            models = {"object": "list", "data": [{"id": self.behaviour.model, "object": "model"}]}
            await _send_json(send, 200, models)
            return
        if path == "/stats":
            await _send_json(send, 200, {"served": self.served, "cancelled": self.cancelled})
            return
        endpoint = path.removeprefix("/v1/")
        if scope["method"] != "POST" or endpoint not in (
            "chat/completions",
            "completions",
            "embeddings",
            "messages",  # Anthropic Messages, not streamed (a tier with `apis: [messages]`)
            "responses",  # OpenAI Responses, not streamed (a tier with `apis: [responses]`)
        ):
            await _send_json(send, 404, {"error": {"message": "not found", "type": "not_found"}})
            return
        raw = await _read_body(receive)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            await _send_json(send, 400, {"error": {"message": "bad json", "type": "invalid"}})
            return
        await self._answer(endpoint, body, send, receive)

    async def _answer(
        self, endpoint: str, body: dict[str, Any], send: Send, receive: Receive
    ) -> None:
        b = self.behaviour.merged(body.get("echo"))
        self.served += 1
        if b.delay_ms:
            await asyncio.sleep(b.delay_ms / 1000)
        if b.fail_status:
            error = {"error": {"message": f"echo failure {b.fail_status}", "type": "echo_failure"}}
            await _send_json(send, b.fail_status, error)
            return
        if endpoint == "embeddings":
            await _send_json(send, 200, _embeddings(body, b.model))
            return
        prompt_tokens, cached = self.prompt_usage(body, b)
        call = _tool_call(body, b) if endpoint == "chat/completions" else None
        if call is not None:
            usage = _usage(prompt_tokens, 3, cached)
            if body.get("stream"):
                await _send_tool_stream(send, b, call, usage, body)
            else:
                await _send_json(send, 200, _tool_answer(b.model, call, usage))
            return
        if body.get("stream") and endpoint == "messages":
            usage = usage_for(endpoint, _usage(prompt_tokens, b.chunks, cached))
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await send({"type": "http.response.body", "body": b"".join(messages_events(b, usage))})
            return
        if body.get("stream") and endpoint == "responses":
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            usage = usage_for(endpoint, _usage(prompt_tokens, b.chunks, cached))
            for event in _responses_events(b.model, b.chunks, usage):
                if b.chunk_delay_ms:
                    await asyncio.sleep(b.chunk_delay_ms / 1000)
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        if body.get("stream") and endpoint not in ("messages", "responses"):
            await self._stream(endpoint, body, b, prompt_tokens, cached, send, receive)
            return
        text = " ".join(["echo"] * b.chunks)
        answer = _full_answer(endpoint, b.model, text, prompt_tokens, b.chunks, cached)
        await _send_json(send, 200, answer)

    async def _stream(
        self,
        endpoint: str,
        body: dict[str, Any],
        b: EchoBehaviour,
        prompt_tokens: int,
        cached: int,
        send: Send,
        receive: Receive,
    ) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        want_usage = b.usage and bool((body.get("stream_options") or {}).get("include_usage"))
        # uvicorn drops writes to a closed connection silently; watch for the disconnect instead,
        # so that tests can see that the proxy really closed the upstream stream.
        gone = asyncio.ensure_future(receive())
        try:
            for i in range(b.chunks):
                if i and b.chunk_delay_ms:
                    await asyncio.sleep(b.chunk_delay_ms / 1000)
                if gone.done():
                    self.cancelled += 1
                    return
                last = i == b.chunks - 1
                chunk = _chunk(endpoint, b.model, "echo " if not last else "echo", last)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if want_usage:
                tail = _usage_chunk(endpoint, b.model, _usage(prompt_tokens, b.chunks, cached))
                await send({"type": "http.response.body", "body": tail, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        finally:
            gone.cancel()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def _embeddings(body: dict[str, Any], model: str) -> dict[str, Any]:
    """One small vector per input, and usage with prompt tokens only (as OpenAI reports it)."""
    raw = body.get("input")
    inputs = raw if isinstance(raw, list) and raw and not isinstance(raw[0], int) else [raw]
    data, tokens = [], 0
    for i, item in enumerate(inputs):
        words = len(item) if isinstance(item, list) else len(str(item).split())
        tokens += max(1, words)
        data.append({"object": "embedding", "index": i, "embedding": [float(words), 0.5, -0.5]})
    return {
        "object": "list",
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def usage_for(endpoint: str, usage: dict[str, Any]) -> dict[str, Any]:
    """`_usage` (OpenAI's shape) in the shape of `endpoint`'s answers: Anthropic's for messages,
    the prompt split into fresh input and cache reads. Values that are no counts (the fault
    upstream's) are carried over as they are."""
    if endpoint == "responses":  # OpenAI's counts under the Responses names
        return {
            "input_tokens": usage.get("prompt_tokens"),
            "input_tokens_details": usage.get("prompt_tokens_details", {"cached_tokens": 0}),
            "output_tokens": usage.get("completion_tokens"),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens"),
        }
    if endpoint != "messages":
        return usage
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else details
    prompt = usage.get("prompt_tokens")
    fresh = prompt - cached if isinstance(prompt, int) and isinstance(cached, int) else prompt
    if isinstance(fresh, int) and isinstance(prompt, int) and prompt >= 0:
        fresh = max(0, fresh)  # more cached than the prompt: all of the prompt read from cache
    return {
        "input_tokens": fresh,
        "output_tokens": usage.get("completion_tokens"),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def messages_events(b: EchoBehaviour, usage: dict[str, Any]) -> list[bytes]:
    """An Anthropic Messages stream of `b.chunks` "echo" words: message_start (the prompt's
    usage), one text block, message_delta (the final usage, Anthropic's cumulative counts) and
    message_stop."""
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens"}
    message = {
        "id": "msg_echo-1",
        "type": "message",
        "role": "assistant",
        "model": b.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**start_usage, "output_tokens": 1},
    }
    block = {"type": "text", "text": ""}
    start = {"type": "content_block_start", "index": 0, "content_block": block}
    events = [
        _event("message_start", {"type": "message_start", "message": message}),
        _event("content_block_start", start),
    ]
    for i in range(b.chunks):
        delta = {"type": "text_delta", "text": "echo " if i < b.chunks - 1 else "echo"}
        event = {"type": "content_block_delta", "index": 0, "delta": delta}
        events.append(_event("content_block_delta", event))
    events.append(_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    end = {"stop_reason": "end_turn", "stop_sequence": None}
    delta_usage = {"output_tokens": usage.get("output_tokens")}
    events.append(
        _event("message_delta", {"type": "message_delta", "delta": end, "usage": delta_usage})
    )
    events.append(_event("message_stop", {"type": "message_stop"}))
    return events


def _full_answer(
    endpoint: str,
    model: str,
    text: str,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    if endpoint == "messages":
        return {
            "id": "msg_echo-1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage_for(endpoint, _usage(prompt_tokens, completion_tokens, cached_tokens)),
        }
    if endpoint == "responses":
        return {
            "id": "resp_echo-1",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
            "output": [
                {
                    "type": "message",
                    "id": "msg_echo-1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage_for(endpoint, _usage(prompt_tokens, completion_tokens, cached_tokens)),
        }
    if endpoint == "completions":
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "stop"}
        obj = "text_completion"
    else:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        obj = "chat.completion"
    return {
        "id": "echo-1",
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(prompt_tokens, completion_tokens, cached_tokens),
    }


def _chunk(endpoint: str, model: str, text: str, last: bool) -> bytes:
    finish = "stop" if last else None
    if endpoint == "completions":
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish}
        obj = "text_completion"
    else:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        obj = "chat.completion.chunk"
    payload = {"id": "echo-1", "object": obj, "created": 0, "model": model, "choices": [choice]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _responses_events(model: str, chunks: int, usage: dict[str, Any]) -> list[bytes]:
    """A Responses stream of `chunks` text deltas, OpenAI's events in order, usage at the end."""
    text = " ".join(["echo"] * chunks)
    answer = _full_answer("responses", model, text, 0, chunks)
    item = answer["output"][0]
    part = item["content"][0]
    at = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**answer, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        *(
            {
                "type": "response.output_text.delta",
                **at,
                "delta": "echo " if i < chunks - 1 else "echo",
                "logprobs": [],
            }
            for i in range(chunks)
        ),
        {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {**answer, "usage": usage}},
    ]
    return [
        b"event: "
        + e["type"].encode()
        + b"\ndata: "
        + orjson.dumps({**e, "sequence_number": n})
        + b"\n\n"
        for n, e in enumerate(events)
    ]


def _usage_chunk(endpoint: str, model: str, usage: dict[str, Any]) -> bytes:
    obj = "text_completion" if endpoint == "completions" else "chat.completion.chunk"
    payload = {
        "id": "echo-1",
        "object": obj,
        "created": 0,
        "model": model,
        "choices": [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


# --- tool calls (--tool-rounds / echo.tool_rounds) -------------------------------------------


def _tool_call(body: dict[str, Any], b: EchoBehaviour) -> dict[str, Any] | None:
    """The tool call this request gets, or None for a text answer. Its arguments echo what the
    request carried of tools (the model it was sent as, `tools`, `tool_choice`,
    `parallel_tool_calls` and the tool results so far), so a test sees that a proxy passed them
    through unchanged."""
    tools = body.get("tools")
    if b.tool_rounds <= 0 or not isinstance(tools, list) or not tools:
        return None
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    results = [m.get("content") for m in messages if m.get("role") == "tool"]
    if len(results) >= b.tool_rounds:
        return None
    function = tools[0].get("function") if isinstance(tools[0], dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    arguments = {
        "step": len(results),
        "model": body.get("model"),
        "tools": tools,
        "tool_choice": body.get("tool_choice"),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "tool_results": results,
    }
    return {
        "id": f"call_{len(results)}",
        "type": "function",
        "function": {"name": name or "tool", "arguments": orjson.dumps(arguments).decode()},
    }


def _tool_answer(model: str, call: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {
        "id": "echo-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": usage,
    }


async def _send_tool_stream(
    send: Send, b: EchoBehaviour, call: dict[str, Any], usage: dict[str, Any], body: dict[str, Any]
) -> None:
    """The call as OpenAI streams one: its id and name first, then the arguments in pieces."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    args = call["function"]["arguments"]
    third = max(1, len(args) // 3)
    pieces = [args[i : i + third] for i in range(0, len(args), third)]
    head = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
    deltas: list[tuple[dict[str, Any], str | None]] = [
        ({"role": "assistant", "content": None, "tool_calls": [head]}, None)
    ]
    deltas += [({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}, None) for p in pieces]
    deltas.append(({}, "tool_calls"))
    for delta, finish in deltas:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        payload = {
            "id": "echo-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": b.model,
            "choices": [choice],
        }
        chunk = b"data: " + orjson.dumps(payload) + b"\n\n"
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    if b.usage and (body.get("stream_options") or {}).get("include_usage"):
        tail = _usage_chunk("chat/completions", b.model, usage)
        await send({"type": "http.response.body", "body": tail, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": orjson.dumps(payload)})


def serve(app: Callable[[Scope, Receive, Send], Awaitable[None]], host: str, port: int) -> None:
    """Serve an ASGI app (an EchoApp or the fault upstream's subclass) on host:port."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        # One line instead of a traceback; exit 2 like any command given an unusable argument.
        sock.close()
        taken = exc.errno == errno.EADDRINUSE
        why = "is already in use" if taken else f"cannot be listened on: {exc.strerror or exc}"
        print(
            f"error: port {port} on {host} {why}: choose another with --port N (0 = any free port)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    sock.listen(4096)  # before the line is printed: a client may connect as soon as it reads it
    print(f"listening on http://{host}:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=60,
    )
    uvicorn.Server(config).run(sockets=[sock])


REPO_ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def running_echo_upstream(
    *args: str, timeout_s: float = 20.0, module: str = "benchmarks.echo_upstream"
) -> Iterator[str]:
    """Start the echo server (or `module`, another server with the same command line and
    "listening on" line) in a subprocess on a free port; yield its base URL (with /v1)."""
    cmd = [sys.executable, "-m", module, "--port", "0", *args]
    # Run from the checkout: benchmarks/ is not part of the installed package.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ), cwd=REPO_ROOT
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = ""
        while time.monotonic() < deadline and not line.startswith("listening on "):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"echo upstream exited with {proc.returncode}")
        if not line.startswith("listening on "):
            raise RuntimeError("echo upstream did not start")
        yield line.removeprefix("listening on ").strip() + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def add_echo_arguments(parser: argparse.ArgumentParser) -> None:
    """The echo server's command line (the fault upstream adds its own options to it)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port (printed)")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--fail-status", type=int, default=0)
    parser.add_argument("--no-usage", action="store_true", help="never send usage in streams")
    parser.add_argument("--model", default="echo")
    parser.add_argument(
        "--cache-ttl-s",
        type=float,
        default=300.0,
        help="prompt cache: seconds a prompt stays cached after its last use (0 = no cache)",
    )
    parser.add_argument(
        "--cache-block",
        type=int,
        default=16,
        help="cached tokens are counted in whole blocks of this many (1 = exact)",
    )
    parser.add_argument(
        "--tool-rounds",
        type=int,
        default=0,
        help="a request offering tools gets a call of its first tool until it carries this "
        "many tool results (0 = never)",
    )


def behaviour_from(a: argparse.Namespace) -> EchoBehaviour:
    return EchoBehaviour(
        delay_ms=a.delay_ms,
        chunk_delay_ms=a.chunk_delay_ms,
        chunks=a.chunks,
        fail_status=a.fail_status,
        usage=not a.no_usage,
        model=a.model,
        cache_ttl_s=a.cache_ttl_s,
        cache_block=a.cache_block,
        tool_rounds=a.tool_rounds,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_echo_arguments(parser)
    a = parser.parse_args(argv)
    serve(EchoApp(behaviour_from(a)), a.host, a.port)


if __name__ == "__main__":
    main()
