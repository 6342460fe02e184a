"""Worst-case cost of a request, reserved before the upstream call (a true upper bound)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from backends.config import Price
from backends.tokens import count_tokens
from policies.budgets.money import nanos_to_usd

# Chat templates add role markers and sometimes a default system prompt; this covers them.
TEMPLATE_ALLOWANCE_TOKENS = 64


# The completion bounds each endpoint's upstream obeys. vLLM's chat endpoint honours both names
# (OpenAI's new one first), its completions endpoint only `max_tokens`: reading the other name
# there reserved for 1 token while the upstream generated 100,000.
BOUND_FIELDS: dict[str, tuple[str, ...]] = {
    "chat/completions": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
}
TOKEN_BOUND_NAMES = ("max_completion_tokens", "max_tokens")
# Endpoints whose answer has no completion tokens: the worst case is the prompt alone.
PROMPT_ONLY = frozenset({"embeddings"})


def bound_fields(endpoint: str) -> tuple[str, ...]:
    """The fields that bound the completion on `endpoint` (both names for one we don't know)."""
    return BOUND_FIELDS.get(endpoint, TOKEN_BOUND_NAMES)


def requested_max_tokens(body: dict[str, Any], endpoint: str = "chat/completions") -> int | None:
    """The largest bound among the fields the endpoint obeys: an upstream that honours either
    name can never generate more than this."""
    values = [
        v
        for name in bound_fields(endpoint)
        if isinstance(v := body.get(name), int) and not isinstance(v, bool) and v > 0
    ]
    return max(values, default=None)


def choices_requested(body: dict[str, Any]) -> int:
    """Completions are billed per choice: n (and best_of, which generates that many)."""
    counts = [
        v
        for v in (body.get("n"), body.get("best_of"))
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
    ]
    return max(counts, default=1)


def prompt_token_bound(body: dict[str, Any], mode: str = "bytes") -> int:
    """Upper bound on the upstream's prompt tokens.

    'bytes': the UTF-8 length of the JSON of everything that reaches the prompt. A byte-level BPE
    token covers at least one byte, and JSON only adds characters, so this never undercounts.
    'tiktoken': cl100k token count with a 25% margin: tighter, but not a strict bound.
    """
    # `input`: what embeddings read (and an extra field elsewhere: counted, so never under).
    parts = [body.get(k) for k in ("messages", "prompt", "tools", "functions", "suffix", "input")]
    blob = orjson.dumps([p for p in parts if p is not None])
    if mode == "tiktoken":
        return math.ceil(count_tokens(blob.decode("utf-8")) * 1.25) + TEMPLATE_ALLOWANCE_TOKENS
    return len(blob) + TEMPLATE_ALLOWANCE_TOKENS


@dataclass(frozen=True, slots=True)
class WorstCase:
    prompt_tokens: int
    completion_tokens: int
    nanos: int

    @property
    def usd(self) -> float:
        return nanos_to_usd(self.nanos)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def worst_case(
    body: dict[str, Any],
    price: Price,
    default_max_tokens: int,
    mode: str = "bytes",
    endpoint: str = "chat/completions",
) -> WorstCase:
    """prompt tokens x input price + max_tokens x output price (default when absent), per choice.
    `endpoint` decides which field is the bound (`requested_max_tokens`).

    Monotone in both token counts (`Price.cost_nanos`), so the worst case is never below the
    actual cost of the same request."""
    prompt = prompt_token_bound(body, mode)
    bound = requested_max_tokens(body, endpoint) or default_max_tokens
    completion = 0 if endpoint in PROMPT_ONLY else bound * choices_requested(body)
    return WorstCase(prompt, completion, price.cost_nanos(prompt, completion))
