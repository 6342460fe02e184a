"""The echo upstream with injected faults: an upstream that misbehaves the ways real ones do.

A fault is chosen per request, deterministically:

- by the request: ``"metadata": {"fault": "<name>"}`` (the proxy passes ``metadata`` through;
  ``"none"`` asks for a normal answer), or
- by the server's seeded mix: ``--fault-rate 0.2 --seed 7`` faults about 20% of the requests
  that name none, drawn from ``--faults`` (default: every fault that fits the request). The draw
  hashes the seed and the request's prompt text, so the same request always gets the same fault
  whatever order concurrent requests arrive in.

Faults (``FAULTS``; "stream only" ones never hit a non-streaming request, which is answered
normally):

============================  =====================================================================
``huge_usage``                usage of ``HUGE_TOKENS`` completion tokens (body or usage chunk)
``negative_usage``            usage of ``NEGATIVE_TOKENS`` prompt and completion tokens
``nonnumeric_usage``          usage whose ``prompt_tokens`` is ``"abc"`` (the rest are numbers)
``cached_over_prompt``        ``prompt_tokens_details.cached_tokens`` of the prompt plus
                              ``CACHED_EXTRA``: more cached tokens than the prompt has
``negative_cached``           ``prompt_tokens_details.cached_tokens`` of ``NEGATIVE_TOKENS``
``details_string``            ``prompt_tokens_details`` that is a string, not an object
``details_list``              ``prompt_tokens_details`` that is a list, not an object
``hang``                      nothing for ``hang_s`` (past the router's timeout), then the normal
                              answer; ends early when the caller hangs up
``error_500``                 a 500 whose text body is a Python traceback naming ``INTERNAL_HOST``
                              and ``INTERNAL_IP``
``error_4xx_secret``          a 400 whose error message carries ``SECRET``
``stream_cut``                stream only: half the chunks, then the connection is closed
``stream_stall``              stream only: half the chunks, then nothing for ``hang_s``
``stream_no_done``            stream only: every chunk and the usage, then the end without [DONE]
``stream_huge_no_usage``      stream only: ``huge_mb`` MB of content (generated as it is sent,
                              never held) and no usage chunk, as llama.cpp does
``stream_bad_usage``          stream only: a usage chunk that is not valid JSON
``llama_validation_500``      asked for only (never drawn by the mix): the 500 llama-cpp-python's
                              server answers a request its validation refuses, with its body
============================  =====================================================================

``metadata`` may also carry ``fault_mb`` and ``hang_s`` for one request (strings, as the OpenAI
API types metadata values). ``GET /stats`` counts answers per fault.

    python -m benchmarks.fault_upstream --port 0 --fault-rate 0.2 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from benchmarks.echo_upstream import (
    SSE_HEADERS,
    EchoApp,
    EchoBehaviour,
    Receive,
    Scope,
    Send,
    _chunk,
    _full_answer,
    _responses_events,
    _send_json,
    _usage,
    _usage_chunk,
    _words,
    add_echo_arguments,
    behaviour_from,
    messages_events,
    running_echo_upstream,
    serve,
    usage_for,
)

HUGE_TOKENS = 10**8
NEGATIVE_TOKENS = -(10**6)
CACHED_EXTRA = 1000
SECRET = "sk-upstream-LEAKED-0123456789abcdef"
INTERNAL_HOST = "gpu-node-17.inference.corp.internal"
INTERNAL_IP = "10.31.7.42"
TRACEBACK_MARK = "Traceback (most recent call last)"

# Usage whose prompt-cache breakdown cannot be right: each would lower the charge if trusted.
CACHE_FAULTS = ("cached_over_prompt", "negative_cached", "details_string", "details_list")
BOTH = (
    "huge_usage",
    "negative_usage",
    "nonnumeric_usage",
    "hang",
    "error_500",
    "error_4xx_secret",
    *CACHE_FAULTS,
)
STREAM_ONLY = (
    "stream_cut",
    "stream_stall",
    "stream_no_done",
    "stream_huge_no_usage",
    "stream_bad_usage",
)
FAULTS = BOTH + STREAM_ONLY
# Faults only a request names: outside the seeded mix, so adding one moves no drawn fault.
ON_REQUEST_ONLY = ("llama_validation_500",)
NONE = "none"
# What llama-cpp-python 0.3.36's server answers an assistant message with `content: null`
# (its route handler wraps FastAPI's RequestValidationError as a 500), shortened.
LLAMA_VALIDATION_500 = {
    "error": {
        "message": "2 validation errors:\n  {'type': 'literal_error', 'loc': ('body', "
        "'messages', 1, 'ChatCompletionRequestSystemMessage', 'role'), 'msg': \"Input should "
        "be 'system'\", 'input': 'assistant', 'ctx': {'expected': \"'system'\"}}\n  "
        "{'type': 'string_type', 'loc': ('body', 'messages', 1, "
        "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid "
        "string', 'input': None}\n\n  File \"/srv/llama_cpp/server/app.py\", line 376, in "
        "create_chat_completion\n    POST /v1/chat/completions",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}

TRACEBACK = f"""{TRACEBACK_MARK}:
  File "/srv/inference/server.py", line 412, in generate
    out = await engine.generate(prompt, params, request_id)
  File "/srv/inference/engine.py", line 88, in generate
    conn = await pool.connect("{INTERNAL_HOST}", 8001)
ConnectionRefusedError: [Errno 111] Connect call failed ('{INTERNAL_IP}', 8001)
"""

# The line uvicorn logs when an app ends a response early, which is what stream_cut does on
# purpose; it is dropped so that the server's log shows only real problems.
_CUT_LOG = "ASGI callable returned without completing response."


@dataclass(frozen=True, slots=True)
class FaultMix:
    rate: float = 0.0  # share of requests naming no fault that get one
    seed: int = 0
    faults: tuple[str, ...] = FAULTS  # what the mix draws from
    hang_s: float = 3600.0
    huge_mb: float = 40.0

    def choose(self, body: dict[str, Any]) -> str:
        """The fault for this request: the one it names, else the seeded draw, else "none"."""
        asked = _metadata(body).get("fault")
        if isinstance(asked, str):
            if asked != NONE and asked not in FAULTS + ON_REQUEST_ONLY:
                known = ", ".join(FAULTS + ON_REQUEST_ONLY)
                raise ValueError(f"unknown fault {asked!r}; known: {known}")
            return asked
        stream = bool(body.get("stream"))
        pool = [f for f in self.faults if stream or f not in STREAM_ONLY]
        if self.rate <= 0 or not pool:
            return NONE
        key = f"{self.seed}|{body.get('messages') or body.get('prompt')!r}".encode()
        digest = hashlib.sha256(key).digest()
        if int.from_bytes(digest[:8]) / 2**64 >= self.rate:
            return NONE
        return pool[int.from_bytes(digest[8:16]) % len(pool)]


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = _metadata(body).get(name)
    try:
        return default if value is None else float(value)
    except (TypeError, ValueError):
        return default


class _DropCutLog(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _CUT_LOG


class FaultApp(EchoApp):
    """EchoApp whose answers may carry a fault; a request with no fault gets the echo answer."""

    def __init__(self, behaviour: EchoBehaviour, mix: FaultMix) -> None:
        super().__init__(behaviour)
        self.mix = mix
        self.faults: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/stats":
            stats = {
                "served": self.served,
                "cancelled": self.cancelled,
                "faults": dict(self.faults),
            }
            await _send_json(send, 200, stats)
            return
        await super().__call__(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        logging.getLogger("uvicorn.error").addFilter(_DropCutLog())  # after uvicorn's log setup
        await super()._lifespan(receive, send)

    async def _answer(
        self, endpoint: str, body: dict[str, Any], send: Send, receive: Receive
    ) -> None:
        try:
            fault = self.mix.choose(body)
        except ValueError as exc:
            await _send_json(send, 400, {"error": {"message": str(exc), "type": "invalid"}})
            return
        stream = bool(body.get("stream"))
        if fault == NONE or (fault in STREAM_ONLY and not stream):
            self.faults[NONE] += 1
            await super()._answer(endpoint, body, send, receive)
            return
        self.faults[fault] += 1
        hang_s = _number(body, "hang_s", self.mix.hang_s)
        if fault == "hang":
            if not await _until_gone(receive, hang_s):  # still there: a late, normal answer
                await super()._answer(endpoint, body, send, receive)
            return
        self.served += 1
        b = self.behaviour.merged(body.get("echo"))
        if fault == "error_500":
            await _send_text(send, 500, TRACEBACK)
            return
        if fault == "llama_validation_500":
            await _send_json(send, 500, LLAMA_VALIDATION_500)
            return
        if fault == "error_4xx_secret":
            message = f"invalid api key {SECRET} for deployment at {INTERNAL_HOST}"
            error = {"error": {"message": message, "type": "invalid_request_error"}}
            await _send_json(send, 400, error)
            return
        prompt_tokens = _words(body)
        usage: dict[str, Any] = _usage(prompt_tokens, b.chunks)
        if fault == "huge_usage":
            usage = _usage(prompt_tokens, HUGE_TOKENS)
        elif fault == "negative_usage":
            usage = _usage(NEGATIVE_TOKENS, NEGATIVE_TOKENS)
        elif fault == "nonnumeric_usage":
            usage = {**usage, "prompt_tokens": "abc"}
        elif fault == "cached_over_prompt":
            usage["prompt_tokens_details"] = {"cached_tokens": prompt_tokens + CACHED_EXTRA}
        elif fault == "negative_cached":
            usage["prompt_tokens_details"] = {"cached_tokens": NEGATIVE_TOKENS}
        elif fault == "details_string":
            usage["prompt_tokens_details"] = "cached_tokens: all of them"
        elif fault == "details_list":
            usage["prompt_tokens_details"] = [prompt_tokens]
        if not stream:
            answer = _full_answer(
                endpoint, b.model, " ".join(["echo"] * b.chunks), prompt_tokens, b.chunks
            )
            await _send_json(send, 200, {**answer, "usage": usage_for(endpoint, usage)})
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        if endpoint == "messages":  # Anthropic's events, ended as each stream fault says
            await _messages_stream(fault, b, usage_for(endpoint, usage), send, receive, hang_s)
            return
        if endpoint == "responses":  # OpenAI's Responses events, ended as each fault says
            await _responses_stream(fault, b, usage_for(endpoint, usage), send, receive, hang_s)
            return
        if fault == "stream_huge_no_usage":
            await _huge_stream(endpoint, b.model, _number(body, "fault_mb", self.mix.huge_mb), send)
            return
        chunks = [
            _chunk(endpoint, b.model, "echo " if i < b.chunks - 1 else "echo", i == b.chunks - 1)
            for i in range(b.chunks)
        ]
        if fault in ("stream_cut", "stream_stall"):
            await _send_body(send, b"".join(chunks[: max(1, b.chunks // 2)]))
            if fault == "stream_stall":
                await _until_gone(receive, hang_s)
            return  # returning mid-response makes uvicorn close the connection
        tail = _usage_chunk(endpoint, b.model, usage)
        if fault == "stream_bad_usage":
            tail = tail[: len(tail) // 2] + b"\n\n"  # the usage event, cut in the middle
        await _send_body(send, b"".join(chunks) + tail)
        if fault == "stream_no_done":
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def _messages_stream(
    fault: str, b: EchoBehaviour, usage: dict[str, Any], send: Send, receive: Receive, hang_s: float
) -> None:
    events = messages_events(b, usage)
    if fault in ("stream_cut", "stream_stall"):
        await _send_body(send, b"".join(events[: 2 + max(1, b.chunks // 2)]))
        if fault == "stream_stall":
            await _until_gone(receive, hang_s)
        return  # returning mid-response makes uvicorn close the connection
    if fault == "stream_huge_no_usage":  # no usage anywhere, as a server that counts none
        events = [e.replace(b'"usage":', b'"x_usage":') for e in events]
    if fault == "stream_bad_usage":
        events[-2] = events[-2][: len(events[-2]) // 2] + b"\n\n"  # message_delta, cut
    if fault == "stream_no_done":
        events = events[:-1]  # no message_stop
    await _send_body(send, b"".join(events))
    await send({"type": "http.response.body", "body": b""})


async def _responses_stream(
    fault: str, b: EchoBehaviour, usage: dict[str, Any], send: Send, receive: Receive, hang_s: float
) -> None:
    """The stream faults in the Responses shape: the usage rides in the last event
    (response.completed), so a broken usage event or "no [DONE]" is a stream without its end."""
    events = _responses_events(b.model, b.chunks, usage)
    if fault in ("stream_cut", "stream_stall"):
        await _send_body(send, b"".join(events[: len(events) // 2]))
        if fault == "stream_stall":
            await _until_gone(receive, hang_s)
        return  # returning mid-response makes uvicorn close the connection
    if fault == "stream_bad_usage":
        events[-1] = events[-1][: len(events[-1]) // 2] + b"\n\n"
    elif fault == "stream_no_done":
        events.pop()
    await _send_body(send, b"".join(events))
    await send({"type": "http.response.body", "body": b""})


async def _send_body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _send_text(send: Send, status: int, text: str) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text.encode()})


async def _until_gone(receive: Receive, seconds: float) -> bool:
    """Wait `seconds`, or less if the caller hangs up first (the body was read already, so the
    next message is the disconnect); True when the caller hung up."""
    gone = asyncio.ensure_future(receive())
    try:
        await asyncio.wait_for(asyncio.shield(gone), seconds)
    except TimeoutError:
        return False
    finally:
        gone.cancel()
    return True


async def _huge_stream(endpoint: str, model: str, megabytes: float, send: Send) -> None:
    """`megabytes` of content chunks, sent 64 KiB at a time, then [DONE] with no usage."""
    word = "lorem "
    event = _chunk(endpoint, model, word * 170, False)  # about 1 KiB
    batch = event * max(1, 65536 // len(event))
    total = int(megabytes * 1_000_000)
    sent = 0
    while sent < total:
        await _send_body(send, batch)
        sent += len(batch)
    await send(
        {
            "type": "http.response.body",
            "body": _chunk(endpoint, model, "end", True) + b"data: [DONE]\n\n",
        }
    )


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fault-rate",
        type=float,
        default=0.0,
        help="share of requests naming no fault that get one (seeded draw)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated faults the mix draws from"
    )
    parser.add_argument("--hang-s", type=float, default=3600.0)
    parser.add_argument(
        "--huge-mb", type=float, default=40.0, help="size of a stream_huge_no_usage stream"
    )


def mix_from(a: argparse.Namespace, parser: argparse.ArgumentParser) -> FaultMix:
    faults = tuple(f for f in a.faults.split(",") if f)
    if unknown := [f for f in faults if f not in FAULTS]:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    if not 0 <= a.fault_rate <= 1:
        parser.error("--fault-rate must be between 0 and 1")
    return FaultMix(
        rate=a.fault_rate, seed=a.seed, faults=faults, hang_s=a.hang_s, huge_mb=a.huge_mb
    )


@contextmanager
def running_fault_upstream(*args: str, timeout_s: float = 20.0) -> Iterator[str]:
    """Start the fault upstream in a subprocess on a free port; yield its base URL (with /v1).
    `args` are its command-line options, e.g. ("--fault-rate", "0.2", "--seed", "7")."""
    with running_echo_upstream(
        *args, timeout_s=timeout_s, module="benchmarks.fault_upstream"
    ) as url:
        yield url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_echo_arguments(parser)
    add_fault_arguments(parser)
    a = parser.parse_args(argv)
    serve(FaultApp(behaviour_from(a), mix_from(a, parser)), a.host, a.port)


if __name__ == "__main__":
    main()
