"""The simulator replays sessions (issue 23, item 6): each conversation in order, a prompt cache
per tier, each session mode side by side on one trace. Synthetic multi-turn traces whose every
cost is worked out by hand below (in nano-USD: tokens x USD per Mtok x 1000)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from backends.config import Price
from benchmarks.echo_upstream import running_echo_upstream
from policies.registry import PolicyEnv
from policies.sessions.config import MODES
from router.cli import app
from router.config import sim_config_from
from simulations.sessions import (
    CacheModel,
    SessionTrace,
    at_equal_share,
    compare_modes,
    load_session_trace,
    measure_cache,
    replay_sessions,
)
from simulations.sim_config import DEFAULT_POLICY, SimConfig
from simulations.trace import TraceError
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.sim import sim_config

# small: $1 in, $2 out, $0.1 cached; large: $10 in, $20 out, $0.5 cached (per Mtok).
PRICES = {
    "small": Price(input_per_mtok=1, output_per_mtok=2, cached_input_per_mtok=0.1),
    "large": Price(input_per_mtok=10, output_per_mtok=20, cached_input_per_mtok=0.5),
}
HIT_ALL = CacheModel(hit_rate={"small": 1.0, "large": 1.0}, default_ttl_s=300)

# (session, turn, time, score, prompt, completion): threshold 0.5, so the policy alone says
# a: small, large, small; b: large, small; c: large, small (c's second prompt is nearly all
# prefix: cache_aware keeps it large).
TURNS = [
    ("a", 1, 0.0, 0.1, 1000, 100),
    ("a", 2, 10.0, 0.9, 2000, 100),
    ("a", 3, 20.0, 0.1, 3000, 100),
    ("b", 1, 1.0, 0.9, 500, 100),
    ("b", 2, 11.0, 0.1, 1500, 100),
    ("c", 1, 2.0, 0.9, 1000, 10),
    ("c", 2, 7.0, 0.1, 1020, 10),
]


def record(
    session: str,
    turn: int,
    time: float,
    score: float | None,
    prompt: int,
    completion: int,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "id": f"{session}-{turn}-{time}",
        "time": 1_800_000_000.0 + time,
        "session": session,
        "turn": turn,
        "score": score,
        "tier": "small" if score is not None and score < 0.5 else "large",
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "status": 200,
        **extra,
    }


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def sim(**session: Any) -> SimConfig:
    policy = {"type": "threshold", "small": "small", "large": "large", "threshold": 0.5}
    if session:
        policy["session"] = session
    base = sim_config(policies={DEFAULT_POLICY: policy})
    return replace(base, env=PolicyEnv(PRICES, DEFAULT_POLICY))


@pytest.fixture
def trace(tmp_path: Path) -> SessionTrace:
    # Written out of order: the loader sorts by session, turn, time.
    return load_session_trace([write(tmp_path / "t.jsonl", [record(*t) for t in TURNS[::-1]])])


def nanos(units: float) -> float:
    """`units` are tokens x USD per Mtok summed; one of them is 1000 nano-USD."""
    return units * 1000


def test_the_loader_groups_sessions_in_turn_order(trace: SessionTrace) -> None:
    assert list(trace.sessions) == ["a", "a", "a", "b", "b", "c", "c"]
    assert trace.prompt_tokens.tolist() == [t[4] for t in TURNS]
    assert [len(r) for r in trace.session_rows()] == [3, 2, 2]


def test_per_request_prices_each_turn_with_the_cache_its_tier_holds(trace: SessionTrace) -> None:
    run = replay_sessions(sim(), trace, "per_request", HIT_ALL)
    assert run.tiers == ["small", "large", "small", "large", "small", "large", "small"]
    # a3 on small reads a1's 1000 prompt tokens from small's cache; no other turn follows one
    # its tier served.
    assert run.cached_tokens.tolist() == [0, 0, 1000, 0, 0, 0, 0]
    assert run.cost_nanos.tolist() == [
        nanos(1000 * 1 + 100 * 2),  # a1 small, nothing cached
        nanos(2000 * 10 + 100 * 20),  # a2 large
        nanos(2000 * 1 + 1000 * 0.1 + 100 * 2),  # a3 small: 1000 cached, 2000 fresh
        nanos(500 * 10 + 100 * 20),  # b1 large
        nanos(1500 * 1 + 100 * 2),  # b2 small
        nanos(1000 * 10 + 10 * 20),  # c1 large
        nanos(1020 * 1 + 10 * 2),  # c2 small
    ]
    assert run.switches.tolist() == [2, 1, 1]


def test_every_mode_side_by_side_with_hand_computed_costs(trace: SessionTrace) -> None:
    rows = {r["mode"]: r for r in compare_modes(sim(), trace, HIT_ALL)}
    # per_request: a 1200 + 22000 + 2300, b 7000 + 1700, c 10200 + 1040
    # sticky: a stays small: 1200, then 1000 of 2000 cached: 1000 + 100 + 200, then 2000 of
    #   3000: 1000 + 200 + 200; b stays large: 7000, then 500 cached: 10000 + 250 + 2000;
    #   c stays large: 10200, then 1000 cached: 200 + 500 + 200
    # escalate_only: a small, large, large (3rd: 2000 cached: 10000 + 1000 + 2000); b, c as
    #   sticky (never down)
    # cache_aware: a3 and b2 move down (small's fresh prompt is cheaper than large's cached
    #   one: 3000 < 2100 x 0.5 + 900 x 10; 1500 < 600 x 0.5 + 900 x 10); c2 stays large
    #   (1020 > 1010 x 0.5 + 10 x 10)
    # all-large: a 12000, 1000 + 10000 + 500 ... : 12000 + 12500 + 13000; b 19250; c 11100
    expected = {
        "per_request": (1200 + 22000 + 2300) + (7000 + 1700) + (10200 + 1040),
        "sticky": (1200 + 1300 + 1400) + (7000 + 12250) + (10200 + 900),
        "escalate_only": (1200 + 22000 + 13000) + (7000 + 12250) + (10200 + 900),
        "cache_aware": (1200 + 22000 + 2300) + (7000 + 1700) + (10200 + 900),
        "all-large": (12000 + 12500 + 13000) + (7000 + 12250) + (10200 + 900),
    }
    for mode, units in expected.items():
        assert rows[mode]["cost_usd"] == pytest.approx(nanos(units) / 1e9, abs=1e-12), mode
        assert rows[mode]["share_of_all_large"] == pytest.approx(units / expected["all-large"])
    assert rows["per_request"]["switches_per_session"] == pytest.approx(4 / 3)
    assert rows["sticky"]["switches_per_session"] == 0
    assert rows["escalate_only"]["switches_per_session"] == pytest.approx(1 / 3)
    assert rows["cache_aware"]["switches_per_session"] == pytest.approx(1.0)
    assert rows["cache_aware"]["sessions_switched"] == pytest.approx(2 / 3)
    assert rows["sticky"]["large_share"] == pytest.approx(4 / 7)
    # Without the cache every prompt token is fresh: sticky's turns cost their list price.
    fresh_sticky = (1200 + 2200 + 3200) + (7000 + 17000) + (10200 + 10400)
    assert rows["sticky"]["cost_without_cache_usd"] == pytest.approx(nanos(fresh_sticky) / 1e9)
    # The trace as served is per_request's routing, re-priced by the same cache model.
    assert rows["trace"]["cost_usd"] == rows["per_request"]["cost_usd"]


def test_cache_aware_prices_the_quote_the_proxy_recorded(tmp_path: Path) -> None:
    # b2 moves down on the token counts (1500 fresh on small < 600 cached + 900 fresh on
    # large), but the proxy quoted it as 1500 tokens of which 1490 are the prefix: it kept it
    # large (1500 > 1490 x 0.5 + 10 x 10), and the replay must decide as the proxy did.
    quoted = {"session_prompt_tokens": 1500, "session_prefix_tokens": 1490}
    records = [record(*t) for t in TURNS[3:5]]
    records[1] |= quoted
    trace = load_session_trace([write(tmp_path / "t.jsonl", records)])
    assert trace.quote_prefix is not None and trace.quote_prefix.tolist() == [-1, 1490]
    assert replay_sessions(sim(), trace, "cache_aware", HIT_ALL).tiers == ["large", "large"]
    without = load_session_trace([write(tmp_path / "u.jsonl", [record(*t) for t in TURNS[3:5]])])
    assert replay_sessions(sim(), without, "cache_aware", HIT_ALL).tiers == ["large", "small"]


def test_the_cache_expires_after_its_ttl_and_the_session_after_its_own(tmp_path: Path) -> None:
    records = [
        record("s", 1, 0.0, 0.1, 1000, 100),
        record("s", 2, 400.0, 0.9, 2000, 100),  # 400 s later: small's cache (300 s) is gone
        record("s", 3, 500.0, 0.1, 3000, 100),
    ]
    trace = load_session_trace([write(tmp_path / "t.jsonl", records)])
    sticky = replay_sessions(sim(mode="sticky"), trace, "sticky", HIT_ALL)
    assert sticky.tiers == ["small"] * 3
    assert sticky.cached_tokens.tolist() == [0, 0, 2000]
    # The session's own state expires after ttl_s (here 60 s): each turn starts afresh.
    short = replay_sessions(sim(mode="sticky", ttl_s=60), trace, "sticky", HIT_ALL)
    assert short.tiers == ["small", "large", "small"]


def test_hit_rates_are_measured_from_the_traces_cached_tokens(tmp_path: Path) -> None:
    # As served: s1 small, s2 small (cacheable prefix 1000, the provider cached 500), s3 large.
    records = [
        record("s", 1, 0.0, 0.1, 1000, 100, cached_tokens=0),
        record("s", 2, 10.0, 0.1, 2000, 100, cached_tokens=500),
        record("s", 3, 20.0, 0.9, 3000, 100, cached_tokens=0),
    ]
    trace = load_session_trace([write(tmp_path / "t.jsonl", records)])
    model = measure_cache(trace)
    assert model.hit_rate == {"small": 0.5}  # large had no cacheable prefix: no measurement
    assert model.shared_tokens == {"small": 0, "large": 0}
    run = replay_sessions(sim(mode="sticky"), trace, "sticky", model)
    # sticky keeps all three small: 2nd reads 0.5 x 1000, 3rd 0.5 x 2000
    assert run.cached_tokens.tolist() == [0, 500, 1000]
    assert run.cost_nanos.tolist() == [
        nanos(1000 + 200),
        nanos(1500 + 50 + 200),
        nanos(2000 + 100 + 200),
    ]


def test_a_tool_result_stays_on_the_tier_that_made_the_call(tmp_path: Path) -> None:
    records = [
        record("s", 1, 0.0, 0.9, 1000, 10),
        # The policy would send the tool result small; the proxy kept it large (tool loop).
        record("s", 1, 5.0, 0.1, 1100, 10, session_reason="tool_loop"),
        record("s", 2, 9.0, 0.1, 1200, 10),
    ]
    trace = load_session_trace([write(tmp_path / "t.jsonl", records)])
    run = replay_sessions(sim(), trace, "per_request", HIT_ALL)
    assert run.tiers == ["large", "large", "small"]


def test_the_context_window_moves_a_turn_in_a_session_replay(tmp_path: Path) -> None:
    records = [record("s", 1, 0.0, 0.1, 1000, 100), record("s", 2, 10.0, 0.1, 5000, 100)]
    trace = load_session_trace([write(tmp_path / "t.jsonl", records)])
    windowed = replace(sim(), context_windows={"small": 4096, "large": None})
    run = replay_sessions(windowed, trace, "sticky", HIT_ALL)
    assert run.tiers == ["small", "large"]
    tight = replace(sim(), context_windows={"small": 4096, "large": 4096})
    refused = replay_sessions(tight, trace, "sticky", HIT_ALL)
    assert refused.tiers == ["small", None] and refused.cost_nanos[1] == 0


def test_a_trace_with_nothing_served_is_an_error(tmp_path: Path) -> None:
    bad = record("s", 1, 0.0, 0.1, 10, 1, status=500)
    with pytest.raises(TraceError, match="no served requests"):
        load_session_trace([write(tmp_path / "t.jsonl", [bad])])
    missing = {**record("s", 1, 0.0, 0.1, 10, 1), "prompt_tokens": None}
    with pytest.raises(TraceError, match="line 1: missing field 'prompt_tokens'"):
        load_session_trace([write(tmp_path / "u.jsonl", [missing])])


def test_simulate_sessions_prints_every_mode_side_by_side(tmp_path: Path) -> None:
    records = [record(*t, cached_tokens=0) for t in TURNS]
    path = write(tmp_path / "t.jsonl", records)
    out = tmp_path / "modes.json"
    result = CliRunner().invoke(
        app, ["simulate", "--sessions", "-t", str(path), "--hit-rate", "1", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    for mode in ("per_request", "sticky", "escalate_only", "cache_aware", "all-large", "trace"):
        assert f"| {mode}" in result.output or mode in result.output
    modes = json.loads(out.read_text())["modes"]
    assert [m["mode"] for m in modes][:4] == [
        "per_request",
        "sticky",
        "escalate_only",
        "cache_aware",
    ]
    bad = CliRunner().invoke(app, ["simulate", "--sessions", "-t", str(tmp_path / "none.jsonl")])
    assert bad.exit_code == 2 and "error:" in bad.output


HARD = (
    "Prove that there are infinitely many primes p such that p+2 is also prime, or explain "
    "rigorously why this remains an open problem, and derive the Hardy-Littlewood constant."
)
PLANS = ["HEEH", "EHEE", "EEEE", "HHEE", "EHHE", "HEHE"]


def run_proxy(mode: str, trace_dir: Path) -> tuple[SimConfig, SessionTrace]:
    """The conversations of PLANS through the real proxy (policy at threshold 0.3 with this
    session mode) in front of a fresh caching echo upstream; its trace and the simulator's
    view of the config."""
    with running_echo_upstream() as url:
        small = tier("small", url, price=(1.0, 2.0))
        large = tier("large", url, price=(10.0, 20.0))
        small["price"]["cached_input_per_mtok"] = 0.1
        large["price"]["cached_input_per_mtok"] = 1.0
        policy = {"type": "threshold", "threshold": 0.3, "session": {"mode": mode}}
        cfg = make_config(
            [small, large], trace_dir, policies={"auto": policy}, default_policy="auto"
        )
        with ProxyThread(cfg) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
            sent = 0
            for c, plan_ in enumerate(PLANS):
                messages: list[dict[str, Any]] = []
                for k, kind in enumerate(plan_):
                    words = " ".join(f"c{c}t{k}w{j}" for j in range(10 + 13 * k))
                    text = (HARD if kind == "H" else "42") + " " + words
                    messages.append({"role": "user", "content": text})
                    answer = client.chat.completions.create(
                        model="router:auto",
                        messages=messages,  # type: ignore[arg-type]
                        max_tokens=8,
                        extra_headers={"x-session-id": f"conversation-{c}"},
                    )
                    messages.append(
                        {"role": "assistant", "content": answer.choices[0].message.content}
                    )
                    sent += 1
            proxy.traces(expect=sent)
    return sim_config_from(cfg), load_session_trace([trace_dir / "requests.jsonl"])


def test_the_simulator_predicts_what_the_proxy_charged_in_every_mode(tmp_path: Path) -> None:
    """Every mode run live; then each mode predicted from the per_request trace alone: the same
    tier for every request and the cost within 1% of what the proxy charged (the echo caches
    whole blocks of 16 tokens, as --cache-block 16 tells the model)."""
    live = {m: run_proxy(m, tmp_path / m) for m in MODES}
    sim, per_request = live["per_request"]
    cache = measure_cache(per_request, default_block=16)
    for mode, (_, trace) in live.items():
        predicted = replay_sessions(sim, per_request, mode, cache)
        assert predicted.tiers == list(trace.tiers), mode
        charged = float(trace.cost_usd.sum())
        assert int(predicted.cost_nanos.sum()) / 1e9 == pytest.approx(charged, rel=0.01), mode
    switches = {m: replay_sessions(sim, per_request, m, cache).switches.sum() for m in MODES}
    assert switches["per_request"] > 0 and switches["sticky"] == 0


def test_modes_compared_at_an_equal_large_share(trace: SessionTrace) -> None:
    """Scores are 0.1 or 0.9, so a threshold in (0.1, 0.9] is the only one between all-large
    and all-small: per_request's share there is 3/7 (the target, met), sticky's 4/7 (the
    nearest it can come: 7/7, 4/7 or 0)."""
    tuned = {t.mode: t for t in at_equal_share(sim(), trace, HIT_ALL, 3 / 7)}
    assert 0.1 < tuned["per_request"].threshold <= 0.9
    assert tuned["per_request"].run.tiers.count("large") == 3
    assert tuned["sticky"].run.tiers.count("large") == 4
    rows = compare_modes(sim(), trace, HIT_ALL, target_share=3 / 7)
    assert rows[0]["mode"] == "per_request" and "threshold" in rows[0]
    assert rows[0]["large_share"] == pytest.approx(3 / 7)
