"""Does a request fit a tier's context window, and which tier serves it when it does not.

One rule for the proxy and the simulator (simulations/context_fit.py calls `fit_tier` too):

- a request needs `prompt + completion` tokens: the prompt as the budget reservation estimates
  it (policies/budgets/estimate.py `prompt_token_bound`, `budgets.prompt_estimate`) and the
  completion bound it reserves for (`max_completion_tokens` / `max_tokens`, else
  `budgets.default_max_tokens`). Both are upper bounds, so a request judged to fit never
  overflows the model; the price of that is that one close to the limit may be moved (or
  refused) although its real token count would have fitted.
- a tier fits when it sets no `context_window` or the need is at most that window;
- the chosen tier that fits serves; one that does not gives way to the cheapest candidate tier
  that fits (price order: policies/spec.py `tiers_by_price`), whatever chose it (a policy, a
  budget downgrade, a session's stickiness: the small tier cannot serve it);
- a tier the client named (`pinned`) is never moved: it fits or the request is refused;
- no candidate fits: refused (the proxy answers one 400 `context_length_exceeded`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.config import Price
from policies.budgets.estimate import prompt_token_bound, requested_max_tokens
from policies.spec import tiers_by_price

# What the trace's `reason` and the response header call a move made by this rule.
REASON = "context_window"


@dataclass(frozen=True, slots=True)
class ContextNeed:
    """The tokens a request may occupy in a model's context: prompt plus completion bound."""

    prompt_tokens: int
    completion_tokens: int
    bound_from: str  # where completion_tokens came from, for the refusal's message

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def context_need(
    body: dict[str, Any], endpoint: str, default_max_tokens: int, prompt_estimate: str
) -> ContextNeed:
    """What the request needs, from the same estimate and bound its budget reservation uses
    (policies/budgets/estimate.py `worst_case`, less the per-choice multiplier: each of `n`
    choices is its own sequence in the context, not one n times as long)."""
    bound = requested_max_tokens(body, endpoint)
    return ContextNeed(
        prompt_token_bound(body, prompt_estimate),
        bound if bound is not None else default_max_tokens,
        "max_tokens" if bound is not None else "budgets.default_max_tokens",
    )


def fits(window: int | None, tokens: int) -> bool:
    """Whether `tokens` fit a tier with this `context_window` (None: no limit)."""
    return window is None or tokens <= window


def fit_tier(
    chosen: str,
    tokens: int,
    windows: Mapping[str, int | None],
    prices: Mapping[str, Price],
    pinned: bool = False,
) -> str | None:
    """The tier that serves a request needing `tokens`: `chosen` when it fits; else (unless
    `pinned`) the cheapest tier of `prices` (the candidates: the policy's tiers) that fits;
    None when none does. `windows` maps tier names to their `context_window`."""
    if fits(windows.get(chosen), tokens):
        return chosen
    if pinned:
        return None
    return next((t for t in tiers_by_price(prices) if fits(windows.get(t), tokens)), None)


def largest_window(windows: Mapping[str, int | None], tiers: Sequence[str]) -> tuple[str, int]:
    """The tier of `tiers` with the largest window and that window (for a refusal's message;
    every one of them has a window, or the request would have fitted)."""
    sized = [(t, w) for t in tiers if (w := windows.get(t)) is not None]
    return max(sized, key=lambda tw: tw[1])


def refusal_message(
    need: ContextNeed, windows: Mapping[str, int | None], tiers: Sequence[str], named: bool
) -> str:
    """OpenAI's wording for a request over the model's context length, then which tiers were
    considered and how the counts were made."""
    tier, window = largest_window(windows, tiers)
    which = (
        f"the tier named ({tier})"
        if named
        else f"the largest of the tiers that could serve it ({tier}; tried: {', '.join(tiers)})"
    )
    return (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{need.tokens} tokens ({need.prompt_tokens} in the messages, {need.completion_tokens} "
        f"in the completion). Please reduce the length of the messages or completion. "
        f"Context window of {which}: {window} tokens; the prompt is the router's upper-bound "
        f"estimate (budgets.prompt_estimate), the completion from {need.bound_from}."
    )
