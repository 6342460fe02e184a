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
from backends.tokens import count_prompt_tokens, count_tokens

MALFORMED = "malformed"  # missing, not an integer
NEGATIVE = "negative"
FAULTS = (MALFORMED, NEGATIVE)


def _count(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int):
        return MALFORMED
    return NEGATIVE if value < 0 else value


def read_usage(usage: Any) -> Usage | None:
    """The `usage` object of an answer or chunk: None when there is none (absent or null, as in
    every chunk but the last), a reported Usage, or Usage(0, 0, fault=...) when it is broken."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return Usage(fault=MALFORMED)
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    for value in (prompt, completion):
        if isinstance(value, str):
            return Usage(fault=value)
    assert isinstance(prompt, int) and isinstance(completion, int)
    return Usage(prompt, completion, reported=True)


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


def answer_usage(request: dict[str, Any], answer: dict[str, Any]) -> Usage:
    """The reported usage, else our own count; a broken report is counted and keeps its fault."""
    usage = read_usage(answer.get("usage"))
    if usage is not None and usage.fault is None:
        return usage
    counted = counted_usage(request, answer)
    counted.fault = usage.fault if usage is not None else None
    return counted


# Set inside a `usage` object the router counted itself (the upstream reported none, or usage
# it could not have used): OpenAI clients ignore the unknown field; a reader can tell an
# estimate from the upstream's count.
ESTIMATED_FIELD = "x_router_estimated"


def usage_json(usage: Usage, **extra: Any) -> dict[str, Any]:
    """The `usage` object a client gets for what it is charged: the counts, `extra` (the
    stream's cost), and the estimate mark when the counts are the router's own."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        **extra,
    }
    if not usage.reported:
        out[ESTIMATED_FIELD] = True
    return out
