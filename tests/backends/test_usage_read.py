"""Usage as each upstream shape reports it (issue 23, item 5): prompt-cache reads and writes and
reasoning tokens read from the OpenAI, vLLM, llama.cpp and Anthropic-via-litellm shapes; any
breakdown that is not a count is a fault; the bounds (cached + written <= prompt, reasoning <=
completion) are the usage guard's; and the one cost formula prices the breakdown the same way
for one request (the proxy) and for arrays (the simulator), to the nano."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import Usage
from backends.config import Price, cost_nanos
from backends.usage import MALFORMED, NEGATIVE, read_responses_usage, read_usage, usage_json
from policies.budgets.estimate import worst_case
from router.proxy.usage_guard import (
    CACHED_OVER_PROMPT,
    REASONING_OVER_COMPLETION,
    UsageBound,
    checked_usage,
    priced,
)

# Anthropic-like: cache reads at 10% of input, cache writes at 125%.
CACHING = Price(
    input_per_mtok=3.0, output_per_mtok=15.0, cached_input_per_mtok=0.3, cache_write_per_mtok=3.75
)


def test_openai_shape_reads_cached_and_reasoning_tokens() -> None:
    usage = read_usage(
        {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 256,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
    )
    assert usage == Usage(2006, 300, True, None, 1920, 0, 256)


def test_vllm_without_prompt_details_and_llama_cpp_python_are_all_fresh() -> None:
    # vLLM without --enable-prompt-tokens-details sends null; llama-cpp-python's server sends
    # the three counts only.
    vllm = read_usage({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": None})
    assert vllm == Usage(10, 2, True)
    assert read_usage({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}) == Usage(
        10, 2, True
    )
    # OpenAI's null for a count it did not measure is no fault either.
    nulls = {"prompt_tokens_details": {"cached_tokens": None}, "completion_tokens_details": {}}
    assert read_usage({"prompt_tokens": 10, "completion_tokens": 2, **nulls}) == Usage(10, 2, True)


def test_llama_server_shapes() -> None:
    # llama-server's OpenAI-compatible usage, and older builds' timings only.
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    assert read_usage(usage) == Usage(40, 3, True, None, 32)
    timings = {"cache_n": 24, "prompt_n": 16, "predicted_n": 3}
    assert read_usage({"prompt_tokens": 40, "completion_tokens": 3}, timings) == Usage(
        40, 3, True, None, 24
    )
    assert read_usage(usage, timings).cached_tokens == 32  # the usage's own field wins
    assert read_usage({"prompt_tokens": 40, "completion_tokens": 3}, {"cache_n": "x"}) == Usage(
        fault=MALFORMED
    )


def _litellm_usage(**anthropic: int) -> dict[str, Any]:
    """What litellm's ModelResponse usage for an Anthropic answer is on the wire (its own Usage
    type, dumped as backends/litellm_backend.py dumps it), from Anthropic's counts."""
    from litellm.types.utils import PromptTokensDetailsWrapper
    from litellm.types.utils import Usage as LiteLLMUsage

    read, written = anthropic["cache_read_input_tokens"], anthropic["cache_creation_input_tokens"]
    # litellm's Anthropic transformation: prompt_tokens = input + cache read + cache creation.
    prompt = anthropic["input_tokens"] + read + written
    usage = LiteLLMUsage(
        prompt_tokens=prompt,
        completion_tokens=anthropic["output_tokens"],
        total_tokens=prompt + anthropic["output_tokens"],
        prompt_tokens_details=PromptTokensDetailsWrapper(
            cached_tokens=read, cache_creation_tokens=written
        ),
        cache_read_input_tokens=read,
        cache_creation_input_tokens=written,
    )
    return usage.model_dump(exclude_none=True)


def test_anthropic_through_litellm_reads_cache_reads_and_writes() -> None:
    raw = _litellm_usage(
        input_tokens=50,
        cache_read_input_tokens=1000,
        cache_creation_input_tokens=200,
        output_tokens=7,
    )
    usage = read_usage(raw)
    assert usage == Usage(1250, 7, True, None, 1000, 200, 0)
    # Fresh 50 at $3, 1000 read at $0.30, 200 written at $3.75, 7 out at $15 (per Mtok).
    assert CACHING.cost_nanos(1250, 7, 1000, 200) == 50 * 3000 + 1000 * 300 + 200 * 3750 + 7 * 15000
    # Anthropic's own field names alone (another OpenAI-shaped gateway) read the same.
    bare = {"prompt_tokens": 1250, "completion_tokens": 7}
    top = {"cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200}
    assert read_usage({**bare, **top}) == usage


@pytest.mark.parametrize(
    ("usage", "fault"),
    [
        ({"prompt_tokens_details": "cached"}, MALFORMED),
        ({"prompt_tokens_details": [5]}, MALFORMED),
        ({"completion_tokens_details": "lots"}, MALFORMED),
        ({"prompt_tokens_details": {"cached_tokens": "5"}}, MALFORMED),
        ({"prompt_tokens_details": {"cached_tokens": 5.0}}, MALFORMED),
        ({"prompt_tokens_details": {"cached_tokens": True}}, MALFORMED),
        ({"prompt_tokens_details": {"cached_tokens": -1}}, NEGATIVE),
        ({"prompt_tokens_details": {"cache_write_tokens": -1}}, NEGATIVE),
        ({"completion_tokens_details": {"reasoning_tokens": -3}}, NEGATIVE),
        ({"cache_read_input_tokens": "all"}, MALFORMED),
        ({"cache_creation_input_tokens": -7}, NEGATIVE),
    ],
)
def test_a_breakdown_that_is_no_count_breaks_the_report(usage: dict[str, Any], fault: str) -> None:
    assert read_usage({"prompt_tokens": 10, "completion_tokens": 2, **usage}) == Usage(fault=fault)


BOUND = UsageBound(
    prompt_tokens=100,
    completion_tokens=50,
    completion_enforced=True,
    reserved_nanos=CACHING.worst_cost_nanos(100, 50),
)


def own_count() -> Usage:
    return Usage(90, 20, False)  # the router's count: no breakdown, every prompt token fresh


@pytest.mark.parametrize(
    ("reported", "charged"),
    [
        (Usage(80, 40, True, None, 64, 16, 30), Usage(80, 40, True, None, 64, 16, 30)),
        (Usage(80, 40, True, None, 80), Usage(80, 40, True, None, 80)),  # all cached: fine
        (Usage(80, 40, True, None, 81), Usage(90, 20, False, CACHED_OVER_PROMPT)),
        (Usage(80, 40, True, None, 60, 21), Usage(90, 20, False, CACHED_OVER_PROMPT)),
        (Usage(80, 40, True, None, 0, 0, 41), Usage(90, 20, False, REASONING_OVER_COMPLETION)),
    ],
)
def test_the_breakdown_is_held_to_its_totals(reported: Usage, charged: Usage) -> None:
    assert checked_usage(reported, BOUND, own_count) == charged


def test_a_fault_is_never_a_credit() -> None:
    """A broken breakdown is charged as our own count with every prompt token fresh: never less
    than the same counts with any part of them priced as cached."""
    faulted = checked_usage(Usage(80, 40, True, None, 81), BOUND, own_count)
    charge = priced(faulted, CACHING, BOUND).cost_usd
    assert charge == CACHING.cost(90, 20) > CACHING.cost(90, 20, 80)


def test_reasoning_tokens_are_charged_once_as_output() -> None:
    with_reasoning = priced(Usage(80, 40, True, None, 0, 0, 30), CACHING, BOUND)
    assert with_reasoning.cost_usd == CACHING.cost(80, 40)


def test_the_reservation_prices_every_prompt_token_at_the_dearest_prompt_price() -> None:
    body = {"messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 10}
    worst = worst_case(body, CACHING, 1024)
    assert worst.nanos == cost_nanos(3.75, 15.0, worst.prompt_tokens, 10)
    p = worst.prompt_tokens
    for cached, written in [(0, 0), (p, 0), (0, p), (p // 2, p // 2)]:
        assert CACHING.cost_nanos(p, 10, cached, written) <= worst.nanos
    cheap_writes = Price(input_per_mtok=1, output_per_mtok=1, cache_write_per_mtok=0.5)
    assert worst_case(body, cheap_writes, 1024).nanos == cost_nanos(1, 1, p, 10)


def test_a_tier_without_cache_prices_is_priced_as_before() -> None:
    plain = Price(input_per_mtok=0.6, output_per_mtok=0.6)
    for prompt, completion, cached in [(7, 3, 5), (123457, 999, 100000), (1, 0, 1)]:
        two_term = round(float(prompt * 0.6 * 1000 + completion * 0.6 * 1000))
        assert plain.cost_nanos(prompt, completion, cached) == two_term
        assert plain.worst_cost_nanos(prompt, completion) == two_term


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.integers(0, 10**5),
            st.floats(0, 1),
            st.floats(0, 1),
            st.sampled_from([0, 1, 2]),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_scalar_and_array_costs_agree_to_the_nano(
    rows: list[tuple[int, int, float, float, int]],
) -> None:
    prices = [
        Price(input_per_mtok=0.6, output_per_mtok=0.6),
        Price(input_per_mtok=3, output_per_mtok=15, cached_input_per_mtok=0.3),
        Price(
            input_per_mtok=2.5,
            output_per_mtok=10,
            cached_input_per_mtok=1.25,
            cache_write_per_mtok=3.125,
        ),
    ]
    prompt = np.asarray([r[0] for r in rows], dtype=np.int64)
    completion = np.asarray([r[1] for r in rows], dtype=np.int64)
    cached = (prompt * np.asarray([r[2] for r in rows]) // 2).astype(np.int64)
    written = (prompt * np.asarray([r[3] for r in rows]) // 2).astype(np.int64)
    tiers = [prices[r[4]] for r in rows]
    scalar = [
        t.cost_nanos(int(p), int(c), int(k), int(w))
        for t, p, c, k, w in zip(tiers, prompt, completion, cached, written, strict=True)
    ]
    # The array path as the simulator calls it: per-row prices, and no cached counts on rows
    # whose tier sets no cache price (cost_nanos's None).
    has_cached = np.asarray([t.cached_input_per_mtok is not None for t in tiers])
    has_write = np.asarray([t.cache_write_per_mtok is not None for t in tiers])
    array = cost_nanos(
        np.asarray([t.input_per_mtok for t in tiers]),
        np.asarray([t.output_per_mtok for t in tiers]),
        prompt,
        completion,
        np.where(has_cached, cached, 0),
        np.where(has_write, written, 0),
        np.asarray([t.cached_input_per_mtok or 0.0 for t in tiers]),
        np.asarray([t.cache_write_per_mtok or 0.0 for t in tiers]),
    )
    assert array.tolist() == scalar


def test_usage_json_echoes_the_breakdown_openai_style() -> None:
    out = usage_json(Usage(100, 40, False, None, 64, 8, 30))
    assert out["prompt_tokens_details"] == {"cached_tokens": 64, "cache_write_tokens": 8}
    assert out["completion_tokens_details"] == {"reasoning_tokens": 30}
    assert "prompt_tokens_details" not in usage_json(Usage(100, 40, True))


@pytest.mark.parametrize(
    ("usage", "read"),
    [
        (None, None),
        (
            {
                "input_tokens": 2006,
                "input_tokens_details": {"cached_tokens": 1920},
                "output_tokens": 300,
                "output_tokens_details": {"reasoning_tokens": 120},
                "total_tokens": 2306,
            },
            Usage(2006, 300, True, None, 1920, 0, 120),
        ),
        ({"input_tokens": 5, "output_tokens": 2}, Usage(5, 2, True)),
        ({"input_tokens": -1, "output_tokens": 2}, Usage(fault=NEGATIVE)),
        ({"input_tokens": "5", "output_tokens": 2}, Usage(fault=MALFORMED)),
        (
            {"input_tokens": 5, "output_tokens": 2, "input_tokens_details": "x"},
            Usage(fault=MALFORMED),
        ),
        (
            {"input_tokens": 5, "output_tokens": 2, "input_tokens_details": {"cached_tokens": -3}},
            Usage(fault=NEGATIVE),
        ),
        ([5, 2], Usage(fault=MALFORMED)),
    ],
)
def test_the_responses_shape_reads_as_openais_counts(usage: Any, read: Usage | None) -> None:
    """OpenAI's Responses usage (a Response passed through from a tier that speaks it): input
    and output tokens, cache reads within the input, reasoning within the output."""
    assert read_responses_usage(usage) == read
