"""What a tier's server is known to reject, made acceptable just before it is sent, per server
kind; and which of its error answers say the request itself is invalid (never retried).

A tier's server kind is its launch profile's `engine` (`launch.engine: llama_cpp`, as the demo's
tiers and `cost-router backends launch` set it); a tier without a launch profile is sent what
the client sent. Only the OpenAI-compatible HTTP backend (backends/openai_http.py) applies this,
to every call it makes (the request path's, shadow comparisons', judges'), so what the server
reads is the one body here.

`llama_cpp` (llama-cpp-python's server, checked against 0.3.36; docs/deployment.md, "What a
tier's server is sent"):

- A `null` top-level field is dropped: OpenAI reads null as "unset", llama-cpp-python's
  validation refuses it for `temperature`, `top_p`, `stream` and the other fields it types
  without None.
- `max_completion_tokens` becomes `max_tokens` when the body sets no `max_tokens`: the server
  ignores the former and generates until it stops (the charge is capped at the reserved bound,
  the server's work is not; a shadow or judge call has no cap at all).
- Messages: `role: developer` becomes `system` (its validation knows no `developer`); a
  `content` that is null or absent becomes `""` (an assistant turn with `tool_calls` sends
  `content: null`; validation refuses it, and the chat templates concatenate content as text);
  a `content` that is a list of text parts only becomes their text joined by newlines (the
  server takes a list only on user turns, and text-only chat templates fail on one there too).
  Image parts are left as they are (a multimodal chat handler reads them).

Its server answers a request that fails validation with 500, not 4xx (its route handler wraps
FastAPI's RequestValidationError as an internal error): `invalid_request(kind, status, body)`
recognises that answer by its message, FastAPI's `N validation error(s):` rendering of the
errors with a location in the request `body`, so the request path neither falls back nor lets
the client retry (400). Other 500s (a template that fails, a crash) stay the tier's failure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from backends.config import TierConfig

Body = dict[str, Any]
Normalizer = Callable[[Body], Body]

LLAMA_CPP = "llama_cpp"
# FastAPI's str(RequestValidationError) (0.100 and later: "2 validation errors:\n  {'type': ...,
# 'loc': ('body', ...") and pydantic v1's ("1 validation error for Request\nbody -> ...").
_VALIDATION = re.compile(r"\A\d+ validation errors?( for [A-Za-z_]+)?:?\s*\n")
_BODY_LOC = re.compile(r"'loc': \('body'|^body -> ", re.MULTILINE)


def server_kind(tier: TierConfig) -> str | None:
    """The kind of server a tier runs, as far as the config says: its launch engine."""
    return tier.launch.engine if tier.launch is not None else None


def normalizer(tier: TierConfig) -> Normalizer | None:
    """The body rewrite for the tier's server kind; None when it needs none (the hot path then
    pays nothing)."""
    return _NORMALIZERS.get(server_kind(tier) or "")


def invalid_request(kind: str | None, status: int, body: Any) -> bool:
    """True when an error answer of a server of `kind` says the request itself is invalid,
    although its status does not (4xx always does, and is handled by its status)."""
    if kind != LLAMA_CPP or status != 500 or not isinstance(body, dict):
        return False
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return (
        isinstance(message, str)
        and _VALIDATION.match(message) is not None
        and _BODY_LOC.search(message) is not None
    )


def _text_only(parts: list[Any]) -> str | None:
    """The text of a content list made of text parts only, else None."""
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text":
            return None
        text = part.get("text")
        if not isinstance(text, str):
            return None
        texts.append(text)
    return "\n".join(texts)


def _llama_message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message  # the server's own error; never ours to invent a fix for
    out = message
    if message.get("role") == "developer":
        out = {**out, "role": "system"}
    content = message.get("content")
    if content is None:
        out = {**out, "content": ""}
    elif isinstance(content, list):
        text = _text_only(content)
        if text is not None:
            out = {**out, "content": text}
    return out


def normalize_llama_cpp(body: Body) -> Body:
    """llama-cpp-python's server: see the module doc. Copies what it changes, never `body`."""
    out = {k: v for k, v in body.items() if v is not None}
    if "max_tokens" not in out and isinstance(out.get("max_completion_tokens"), int):
        out["max_tokens"] = out["max_completion_tokens"]
    messages = out.get("messages")
    if isinstance(messages, list):
        out["messages"] = [_llama_message(m) for m in messages]
    return out


_NORMALIZERS: dict[str, Normalizer] = {LLAMA_CPP: normalize_llama_cpp}
