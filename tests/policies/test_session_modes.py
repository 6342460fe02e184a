"""Session identity and modes: the pure rules (policies/sessions/identity.py, modes.py)."""

from __future__ import annotations

import pytest

from backends.config import Price
from policies.sessions.identity import InvalidSessionId, in_tool_loop, session_of, uses_tools
from policies.sessions.modes import CacheQuote, Move, plan, prompt_cost, switch_saves

TIERS = ["small", "large"]
SYSTEM = {"role": "system", "content": "You are terse."}


def chat(*turns: str) -> dict:
    messages = [SYSTEM]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "auto", "messages": messages}


def test_the_id_comes_from_the_header_then_metadata_then_the_prefix() -> None:
    body = {**chat("hi"), "metadata": {"session_id": "conv-7"}}
    assert session_of("hdr-1", body, "t").id == "hdr-1"
    assert session_of("hdr-1", body, "t").source == "header"
    assert session_of(None, body, "t").id == "conv-7"
    derived = session_of(None, chat("hi"), "t")
    assert derived is not None and derived.source == "derived" and derived.id.startswith("auto-")


def test_a_derived_id_holds_over_a_conversation_and_separates_teams_and_openings() -> None:
    first = session_of(None, chat("plan a trip"), "t")
    later = session_of(None, chat("plan a trip", "ok", "to Rome", "sure", "in May"), "t")
    assert first is not None and later is not None
    assert first.id == later.id
    assert (first.turn, later.turn) == (1, 3)
    assert session_of(None, chat("plan a trip"), "other").id != first.id
    assert session_of(None, chat("plan a walk"), "t").id != first.id
    # The documented collision: same team, system prompt and first user turn = one session.
    assert session_of(None, chat("plan a trip", "no", "different"), "t").id == first.id


def test_a_given_id_is_scoped_by_team_in_the_store() -> None:
    a, b = session_of("same", chat("x"), "a"), session_of("same", chat("x"), "b")
    assert a is not None and b is not None
    assert a.id == b.id and a.store_key != b.store_key


@pytest.mark.parametrize("bad", ["", "x" * 129, "has space", "semi;colon", "new\nline"])
def test_an_unusable_id_is_refused_naming_where_it_came_from(bad: str) -> None:
    with pytest.raises(InvalidSessionId) as err:
        session_of(bad, chat("x"), "t")
    assert err.value.param == "x-session-id"
    with pytest.raises(InvalidSessionId) as err:
        session_of(None, {**chat("x"), "metadata": {"session_id": bad}}, "t")
    assert err.value.param == "metadata.session_id"
    with pytest.raises(InvalidSessionId):
        session_of(None, {**chat("x"), "metadata": {"session_id": 7}}, "t")


def test_completions_have_a_session_only_when_named() -> None:
    assert session_of(None, {"model": "auto", "prompt": "hi"}, "t") is None
    named = session_of("c1", {"model": "auto", "prompt": "hi"}, "t")
    assert named is not None and named.turn == 0


def test_tool_loops_are_recognised() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]}
    result = {"role": "tool", "tool_call_id": "c", "content": "42"}
    base = chat("what is 6*7")
    assert not in_tool_loop(base)
    assert in_tool_loop({**base, "messages": [*base["messages"], call, result]})
    assert not in_tool_loop(
        {
            **base,
            "messages": [*base["messages"], call, result, {"role": "user", "content": "thanks"}],
        }
    )
    anthropic = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c"}]}
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "c"}]}
    assert in_tool_loop({**base, "messages": [*base["messages"], use, anthropic]})
    assert uses_tools({**base, "tools": [{"type": "function"}]})
    assert not uses_tools(base)


def test_each_mode_across_turns() -> None:
    assert plan("per_request", "small", TIERS).by_last["large"] == Move("small", "per_request")
    assert plan("sticky", "small", TIERS).by_last["large"] == Move("large", "held")
    assert plan("sticky", "large", TIERS).by_last["small"] == Move("small", "held")
    assert plan("escalate_only", "large", TIERS).by_last["small"] == Move("large", "escalated")
    assert plan("escalate_only", "small", TIERS).by_last["large"] == Move("large", "held")
    assert plan("sticky", "large", TIERS).by_last["large"] == Move("large", "same")
    assert plan("sticky", "small", TIERS).fresh == Move("small", "new")


def test_the_tool_loop_and_load_shedding_outrank_the_mode() -> None:
    loop = plan("per_request", "large", TIERS, tool_loop=True)
    assert loop.by_last["small"] == Move("small", "tool_loop")
    shed = plan("sticky", "small", TIERS, shed=True)
    assert shed.by_last["large"] == Move("small", "load_shed", record=False)
    assert shed.fresh == Move("small", "load_shed", record=False)
    assert plan("sticky", "small", TIERS, tool_loop=True, shed=True).by_last["large"].reason == (
        "tool_loop"
    )


PRICES = {
    "small": Price(input_per_mtok=1.0, output_per_mtok=2.0),
    "large": Price(input_per_mtok=10.0, output_per_mtok=30.0, cached_input_per_mtok=1.0),
}


def test_cache_aware_moves_down_only_when_the_turn_saves_more_than_the_cache_is_worth() -> None:
    # 10,000-token prompt, 9,900 cached on large: large costs 9,900 x 1 + 100 x 10 = 10,900
    # (micro-USD), small fresh costs 10,000 x 1 = 10,000: the move saves, so it is taken.
    long_prefix = CacheQuote(10_000, 9_900, PRICES)
    assert prompt_cost(long_prefix, "large", cached=True) == pytest.approx(0.0109)
    assert switch_saves(long_prefix, "large", "small")
    assert plan("cache_aware", "small", TIERS, cache=long_prefix).by_last["large"] == Move(
        "small", "switch_saves"
    )
    cheap_cache = {
        **PRICES,
        "large": Price(input_per_mtok=10.0, output_per_mtok=30.0, cached_input_per_mtok=0.5),
    }
    # cached at 0.5: large costs 9,900 x 0.5 + 100 x 10 = 5,950 < small's 10,000: held.
    held = plan("cache_aware", "small", TIERS, cache=CacheQuote(10_000, 9_900, cheap_cache))
    assert held.by_last["large"] == Move("large", "cache_held")
    # Up is always allowed (quality); a tier without cached prices holds no cache discount.
    assert plan("cache_aware", "large", TIERS, cache=long_prefix).by_last["small"] == Move(
        "large", "escalated"
    )
    fresh_only = {
        n: Price(input_per_mtok=p.input_per_mtok, output_per_mtok=p.output_per_mtok)
        for n, p in PRICES.items()
    }
    assert switch_saves(CacheQuote(10_000, 9_900, fresh_only), "large", "small")


def test_a_tier_outside_the_deciding_policy_starts_afresh_except_in_a_tool_loop() -> None:
    """A session last on a tier the policy does not use (another arm's): the policy decides,
    as for a new session; a tool result still goes back to the tier that made the call."""
    only_small = plan("sticky", "small", TIERS, policy_tiers=["small"])
    assert only_small.by_last["large"] == Move("small", "new")
    assert only_small.by_last["small"] == Move("small", "same")
    loop = plan("sticky", "small", TIERS, tool_loop=True, policy_tiers=["small"])
    assert loop.by_last["large"] == Move("large", "tool_loop")
