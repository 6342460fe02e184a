"""Reading an upstream's reported usage without trusting it.

Usage decides what a team is charged, so a value that is not a count (a string, a float, a
bool, a negative number) is an upstream fault: the caller counts the tokens itself instead and
reports the fault (a metric and a log line), and never turns the value into money. Whether a
well-formed count is plausible for the request (past its max_tokens bound) is the router's
check, which knows the bounds (router/proxy/usage_guard.py).
"""

from __future__ import annotations

from typing import Any

from backends.base import Usage
from backends.config import Price
from backends.tokens import count_prompt_tokens, count_tokens
from trace_format.request_text import (
    messages_answer_text,
    messages_as_chat,
    responses_answer_text,
    responses_as_chat,
)

MALFORMED = "malformed"  # missing, not an integer; a details field that is not an object
NEGATIVE = "negative"
FAULTS = (MALFORMED, NEGATIVE)

# Where each shape puts the prompt-cache counts. OpenAI, vLLM (--enable-prompt-tokens-details)
# and llama.cpp's llama-server: `prompt_tokens_details.cached_tokens`; litellm's answers from
# Anthropic: `prompt_tokens_details.cached_tokens` / `cache_creation_tokens` (newer litellm also
# `cache_write_tokens`), and beside them Anthropic's own `cache_read_input_tokens` /
# `cache_creation_input_tokens`. In all of them prompt_tokens counts the cached and written
# tokens too (litellm adds them to Anthropic's input_tokens), so fresh input is the rest.
# llama-cpp-python's server reports no details: all its prompt tokens are fresh.
CACHED_FIELDS = ("cached_tokens",)
CACHE_WRITE_FIELDS = ("cache_write_tokens", "cache_creation_tokens")
TOP_CACHED = "cache_read_input_tokens"
TOP_CACHE_WRITE = "cache_creation_input_tokens"


def _count(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int):
        return MALFORMED
    return NEGATIVE if value < 0 else value


def _optional(value: Any) -> int | str:
    """A details count: absent or null is 0 (OpenAI sends null for what it did not measure)."""
    return 0 if value is None else _count(value)


def _details(usage: dict[str, Any], key: str) -> dict[str, Any] | str:
    details = usage.get(key)
    if details is None:
        return {}
    return details if isinstance(details, dict) else MALFORMED


def _first(details: dict[str, Any], names: tuple[str, ...], usage: dict[str, Any], top: str) -> Any:
    for name in names:
        if details.get(name) is not None:
            return details[name]
    return usage.get(top)


def _breakdown(usage: dict[str, Any], timings: Any) -> tuple[int, int, int] | str:
    """(cached, cache_write, reasoning) tokens, or the fault that makes them untrustworthy."""
    prompt_details = _details(usage, "prompt_tokens_details")
    completion_details = _details(usage, "completion_tokens_details")
    if isinstance(prompt_details, str) or isinstance(completion_details, str):
        return MALFORMED
    raw_cached = _first(prompt_details, CACHED_FIELDS, usage, TOP_CACHED)
    if raw_cached is None and isinstance(timings, dict):
        # Older llama-server builds: the reused prefix only in the answer's `timings`.
        raw_cached = timings.get("cache_n")
    cached = _optional(raw_cached)
    written = _optional(_first(prompt_details, CACHE_WRITE_FIELDS, usage, TOP_CACHE_WRITE))
    reasoning = _optional(completion_details.get("reasoning_tokens"))
    for value in (cached, written, reasoning):
        if isinstance(value, str):
            return value
    assert isinstance(cached, int) and isinstance(written, int) and isinstance(reasoning, int)
    return cached, written, reasoning


def read_usage(usage: Any, timings: Any = None) -> Usage | None:
    """The `usage` object of an answer or chunk: None when there is none (absent or null, as in
    every chunk but the last), a reported Usage, or Usage(0, 0, fault=...) when it is broken.
    `timings`: the answer's llama.cpp timings, read only when the usage names no cached tokens.

    A breakdown field that is not a count (or an object of counts) breaks the whole report: a
    broken cache count could only ever lower the charge. Whether the breakdown fits the totals
    (cached + written <= prompt, reasoning <= completion) is the usage guard's bound check."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return Usage(fault=MALFORMED)
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    for value in (prompt, completion):
        if isinstance(value, str):
            return Usage(fault=value)
    assert isinstance(prompt, int) and isinstance(completion, int)
    if (
        "prompt_tokens_details" not in usage
        and "completion_tokens_details" not in usage
        and TOP_CACHED not in usage
        and TOP_CACHE_WRITE not in usage
        and timings is None
    ):  # the two-count shape (llama-cpp-python, older servers): nothing more to read
        return Usage(prompt, completion, reported=True)
    breakdown = _breakdown(usage, timings)
    if isinstance(breakdown, str):
        return Usage(fault=breakdown)
    cached, written, reasoning = breakdown
    return Usage(prompt, completion, True, None, cached, written, reasoning)


def usage_cost(price: Price, usage: Usage) -> float:
    """USD for `usage` where no usage guard checked it (shadow comparisons, the LLM judge): the
    breakdown is priced only when it fits its totals, else every prompt token is fresh (a
    broken cache count is never a credit; the proxy's own charge is router/proxy/usage_guard.py)."""
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    cached, written = usage.cached_tokens, usage.cache_write_tokens
    if cached + written <= prompt:
        return price.cost(prompt, completion, cached, written)
    return price.cost(prompt, completion)


def counted_usage(request: dict[str, Any], answer: dict[str, Any]) -> Usage:
    """Our own count for an upstream that reported none (charged budgets need a number)."""
    texts: list[str] = []
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        if isinstance(text, str):
            texts.append(text)
    return Usage(count_prompt_tokens(request), count_tokens("".join(texts)), reported=False)


def counted_messages_usage(request: dict[str, Any], answer: dict[str, Any]) -> Usage:
    """`counted_usage` of a Messages request and answer (its text and tool_use blocks)."""
    return Usage(
        count_prompt_tokens(messages_as_chat(request)),
        count_tokens(messages_answer_text(answer)),
        reported=False,
    )


def counted_answer_usage(endpoint: str, request: dict[str, Any], answer: dict[str, Any]) -> Usage:
    """Our own count of a request and answer of `endpoint`, in that API's shape."""
    if endpoint == "messages":
        return counted_messages_usage(request, answer)
    if endpoint == "responses":
        return Usage(
            count_prompt_tokens(responses_as_chat(request)),
            count_tokens(responses_answer_text(answer)),
            reported=False,
        )
    return counted_usage(request, answer)


def answer_usage(
    request: dict[str, Any], answer: dict[str, Any], endpoint: str = "chat/completions"
) -> Usage:
    """The reported usage, else our own count; a broken report is counted and keeps its fault."""
    usage = read_answer_usage(endpoint, answer)
    if usage is not None and usage.fault is None:
        return usage
    counted = counted_answer_usage(endpoint, request, answer)
    counted.fault = usage.fault if usage is not None else None
    return counted


# Set inside a `usage` object the router counted itself (the upstream reported none, or usage
# it could not have used): OpenAI clients ignore the unknown field; a reader can tell an
# estimate from the upstream's count.
ESTIMATED_FIELD = "x_router_estimated"


def usage_json(usage: Usage, **extra: Any) -> dict[str, Any]:
    """The `usage` object a client gets for what it is charged: the counts, their breakdown
    OpenAI's way when there is one (what was priced as cached, cache write and reasoning),
    `extra` (the stream's cost), and the estimate mark when the counts are the router's own."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }
    if usage.cached_tokens or usage.cache_write_tokens:
        details = {"cached_tokens": usage.cached_tokens}
        if usage.cache_write_tokens:
            details["cache_write_tokens"] = usage.cache_write_tokens
        out["prompt_tokens_details"] = details
    if usage.reasoning_tokens:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    out.update(extra)
    if not usage.reported:
        out[ESTIMATED_FIELD] = True
    return out


# Anthropic Messages (`POST /v1/messages`, passed through to a tier that speaks it): the prompt
# is split in three, `input_tokens` (fresh), `cache_read_input_tokens` and
# `cache_creation_input_tokens`, so the prompt's total is their sum (unlike OpenAI's, where
# prompt_tokens already holds the cached tokens).
MESSAGES_PROMPT_FIELDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def read_messages_usage(usage: Any) -> Usage | None:
    """The `usage` object of a Messages answer or stream event, as `read_usage` does for chat:
    None when absent, a reported Usage (prompt = fresh + cache read + cache write), or
    Usage(fault=...) when a count is not one. A stream's `message_delta` may omit the prompt
    counts (they came with `message_start`): only `output_tokens` is required."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return Usage(fault=MALFORMED)
    completion = _count(usage.get("output_tokens"))
    fresh = _optional(usage.get("input_tokens"))
    cached = _optional(usage.get(TOP_CACHED))
    written = _optional(usage.get(TOP_CACHE_WRITE))
    for value in (completion, fresh, cached, written):
        if isinstance(value, str):
            return Usage(fault=value)
    assert isinstance(completion, int) and isinstance(fresh, int)
    assert isinstance(cached, int) and isinstance(written, int)
    return Usage(fresh + cached + written, completion, True, None, cached, written)


def read_answer_usage(endpoint: str, answer: dict[str, Any]) -> Usage | None:
    """The usage an answer of `endpoint` reports, in that API's shape (see read_usage)."""
    if endpoint == "messages":
        return read_messages_usage(answer.get("usage"))
    if endpoint == "responses":
        return read_responses_usage(answer.get("usage"))
    return read_usage(answer.get("usage"), answer.get("timings"))


def messages_usage_json(usage: Usage, **extra: Any) -> dict[str, Any]:
    """`usage_json` in Anthropic's shape: what the client is charged for, the prompt split into
    fresh input, cache reads and cache writes."""
    out: dict[str, Any] = {
        "input_tokens": max(
            0, usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens
        ),
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
    }
    out.update(extra)
    if not usage.reported:
        out[ESTIMATED_FIELD] = True
    return out


# OpenAI Responses (`POST /v1/responses`, passed through to a tier that speaks it): OpenAI's
# counts under other names, `input_tokens` (cached ones included, as prompt_tokens holds them)
# and `output_tokens` (reasoning included); the cache reads in `input_tokens_details`.
def read_responses_usage(usage: Any) -> Usage | None:
    """The `usage` of a Response object, as `read_usage` reads chat's: None when absent, a
    reported Usage, or Usage(fault=...) when a count (or a details object) is not one."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return Usage(fault=MALFORMED)
    prompt, completion = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    input_details = _details(usage, "input_tokens_details")
    output_details = _details(usage, "output_tokens_details")
    if isinstance(input_details, str) or isinstance(output_details, str):
        return Usage(fault=MALFORMED)
    cached = _optional(input_details.get("cached_tokens"))
    written = _optional(input_details.get("cache_write_tokens"))
    reasoning = _optional(output_details.get("reasoning_tokens"))
    for value in (prompt, completion, cached, written, reasoning):
        if isinstance(value, str):
            return Usage(fault=value)
    assert isinstance(prompt, int) and isinstance(completion, int)
    assert isinstance(cached, int) and isinstance(written, int) and isinstance(reasoning, int)
    return Usage(prompt, completion, True, None, cached, written, reasoning)
