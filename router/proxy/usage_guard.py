"""What a request is charged for: the upstream's usage only when it is plausible for the request.

Usage is the upstream's claim, and it decides money, so it is checked against the bounds the
request was reserved for (`UsageBound`, from the budget gate): completion tokens past the
max_tokens bound the upstream was sent, or prompt tokens `PROMPT_FAULT_FACTOR` times the prompt
estimate, are an upstream fault, as are counts that are no counts (backends/usage.py). A fault is
never money: the request is charged for the router's own count of what it relayed, within the
bounds, and the fault is counted in `cost_router_upstream_usage_faults_total` and logged.

Valid usage is charged as reported, but never above the reservation (`UsageBound.reserved_nanos`,
the request's worst case): what it would cost beyond is recorded by the store as overage
(a tokenizer mismatch: the upstream counted more prompt tokens than the estimate allowed).

The breakdown is held to the totals it breaks down: tokens read from or written to the
provider's prompt cache are part of the prompt (more than the prompt is a fault), reasoning tokens
part of the completion (OpenAI counts them in completion_tokens: charged once, as output). A fault
drops the breakdown with the rest of the report: our own count knows no cache, so every prompt
token is charged as fresh input, never a credit. The reservation priced every prompt token at the
dearest prompt price (`Price.worst_cost_nanos`); the settle charges cached and written tokens at
their own prices (`priced`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from backends.base import Usage
from backends.config import NANOS_PER_USD, Price

# The byte-based prompt estimate is an upper bound for byte-level BPE tokenizers; a model whose
# chat template or tokenizer adds more may go past it a little (charged, as overage past the
# reservation), never this many times over.
PROMPT_FAULT_FACTOR = 4

COMPLETION_OVER_BOUND = "completion_over_bound"
PROMPT_OVER_BOUND = "prompt_over_bound"
CACHED_OVER_PROMPT = "cached_over_prompt"  # cached + cache-write tokens past prompt_tokens
REASONING_OVER_COMPLETION = "reasoning_over_completion"


@dataclass(frozen=True, slots=True)
class UsageBound:
    """The request's reserved worst case, in the units usage is checked in."""

    prompt_tokens: int  # the prompt estimate reserved for
    completion_tokens: int  # max_tokens x choices reserved for
    completion_enforced: bool  # the upstream was sent that bound, so it may not go past it
    reserved_nanos: int  # the reservation: no charge is above it


def _implausible(usage: Usage, bound: UsageBound) -> str | None:
    if bound.completion_enforced and usage.completion_tokens > bound.completion_tokens:
        return COMPLETION_OVER_BOUND
    if usage.prompt_tokens > PROMPT_FAULT_FACTOR * bound.prompt_tokens:
        return PROMPT_OVER_BOUND
    if usage.cached_tokens + usage.cache_write_tokens > usage.prompt_tokens:
        return CACHED_OVER_PROMPT
    if usage.reasoning_tokens > usage.completion_tokens:
        return REASONING_OVER_COMPLETION
    return None


def checked_usage(usage: Usage, bound: UsageBound, own_count: Callable[[], Usage]) -> Usage:
    """The usage to charge for. Reported and plausible: as reported. Otherwise (none reported, a
    broken report, or an implausible one) our own count, with the fault, and within the bounds:
    never more completion tokens than the upstream was allowed, nor prompt tokens than
    estimated."""
    if usage.reported and usage.fault is None:
        fault = _implausible(usage, bound)
        if fault is None:
            return usage
        usage = replace(own_count(), fault=fault)
    completion = usage.completion_tokens
    if bound.completion_enforced:
        completion = min(completion, bound.completion_tokens)
    prompt = min(usage.prompt_tokens, bound.prompt_tokens)
    # No breakdown: a count of ours (or a broken report) prices every prompt token as fresh.
    return Usage(max(0, prompt), max(0, completion), False, usage.fault)


@dataclass(frozen=True, slots=True)
class Priced:
    cost_usd: float  # charged and told to the client: never above the reservation
    actual_usd: float  # the usage at the tier's price; settle records what exceeds the cap


def priced(usage: Usage, price: Price, bound: UsageBound) -> Priced:
    actual = price.cost_nanos(
        usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.cache_write_tokens
    )
    return Priced(min(actual, bound.reserved_nanos) / NANOS_PER_USD, actual / NANOS_PER_USD)
