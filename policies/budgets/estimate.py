"""Worst-case cost of a request, reserved before the upstream call (a true upper bound)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from backends.config import Price, TierConfig
from backends.tokens import TemplateCounter, count_tokens, tier_counter
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


def _bound_of(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def requested_max_tokens(body: dict[str, Any], endpoint: str = "chat/completions") -> int | None:
    """The largest bound among the fields the endpoint obeys: an upstream that honours either
    name can never generate more than this."""
    values = [v for name in bound_fields(endpoint) if (v := _bound_of(body, name)) is not None]
    return max(values, default=None)


def bound_source(body: dict[str, Any], endpoint: str = "chat/completions") -> str | None:
    """The field of `body` that `requested_max_tokens` took its bound from (the first the
    endpoint obeys, on a tie); None when the body sets none and the default applies."""
    bound = requested_max_tokens(body, endpoint)
    if bound is None:
        return None
    return next(name for name in bound_fields(endpoint) if _bound_of(body, name) == bound)


def choices_requested(body: dict[str, Any]) -> int:
    """Completions are billed per choice: n (and best_of, which generates that many)."""
    counts = [
        v
        for v in (body.get("n"), body.get("best_of"))
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
    ]
    return max(counts, default=1)


# `tokenizer` mode's margin over the tier's own count: the count is made with the tier's own
# tokenizer and template, so it is exact while the server runs the same llama.cpp and template;
# the margin absorbs a server that renders a little differently (another llama.cpp release, a
# BOS it adds), so the reservation stays above what the upstream charges.
TOKENIZER_MARGIN_RATIO = 1.02
TOKENIZER_MARGIN_TOKENS = 8

PROMPT_ESTIMATES = ("tokenizer", "bytes", "tiktoken")


def _prompt_json(body: dict[str, Any]) -> bytes:
    # `input`: what embeddings read (and an extra field elsewhere: counted, so never under).
    parts = [body.get(k) for k in ("messages", "prompt", "tools", "functions", "suffix", "input")]
    return orjson.dumps([p for p in parts if p is not None])


def _bytes_bound(body: dict[str, Any]) -> int:
    return len(_prompt_json(body)) + TEMPLATE_ALLOWANCE_TOKENS


def prompt_token_bound(
    body: dict[str, Any], mode: str = "bytes", counter: TemplateCounter | None = None
) -> int:
    """Upper bound on the upstream's prompt tokens.

    'tokenizer': the tier's own tokenizer over its own chat template (`counter`, known for a
    llama.cpp tier launched from a GGUF file: backends/tokens.py `tier_counter`), plus
    `TOKENIZER_MARGIN_*`; where the tier's tokenizer is not known, or the body holds what the
    count does not cover (tools, non-text content), 'bytes'.
    'bytes': the UTF-8 length of the JSON of everything that reaches the prompt. A byte-level BPE
    token covers at least one byte, and JSON only adds characters, so this never undercounts
    (about 4x over on English text).
    'tiktoken': cl100k token count with a 25% margin: tighter, but not a bound for other
    tokenizers (SmolLM2 counts up to 2.7x cl100k on ShareGPT prompts: benchmarks/
    reservation_ratio.py).
    """
    if mode == "tokenizer":
        counted = counter.prompt_tokens(body) if counter is not None else None
        if counted is not None:
            return math.ceil(counted * TOKENIZER_MARGIN_RATIO) + TOKENIZER_MARGIN_TOKENS
        return _bytes_bound(body)
    if mode == "tiktoken":
        blob = _prompt_json(body).decode("utf-8")
        return math.ceil(count_tokens(blob) * 1.25) + TEMPLATE_ALLOWANCE_TOKENS
    return _bytes_bound(body)


def prompt_counter(tier: TierConfig, mode: str) -> TemplateCounter | None:
    """The counter `prompt_token_bound` uses for `tier` in `mode` (None: not counted)."""
    if mode != "tokenizer" or tier.launch is None:
        return None
    launch = tier.launch
    return tier_counter(launch.engine, launch.model, tuple(launch.extra_args))


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
    counter: TemplateCounter | None = None,
) -> WorstCase:
    """prompt tokens x input price + max_tokens x output price (default when absent), per choice.
    `endpoint` decides which field is the bound (`requested_max_tokens`).

    Monotone in both token counts, and every prompt token is priced at the dearest prompt price
    (`Price.worst_cost_nanos`: input, cached or cache write, whichever is highest), so the worst
    case is never below the actual cost of the same request, whatever the provider cached."""
    prompt = prompt_token_bound(body, mode, counter)
    bound = requested_max_tokens(body, endpoint) or default_max_tokens
    completion = 0 if endpoint in PROMPT_ONLY else bound * choices_requested(body)
    return WorstCase(prompt, completion, price.worst_cost_nanos(prompt, completion))
