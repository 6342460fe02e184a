"""Conversations through the real proxy with the official `openai` client over real HTTP: tool
loops stay on the tier that made the call (streamed and not), each session mode across turns,
two replicas sharing sessions on one Redis, a store outage, and how sessions compose with budget
downgrades, A/B arms and a tier the client names (docs/conversations.md).

The upstream is the echo server in its tool-call mode (`echo.tool_rounds`): it calls the first
tool offered until the conversation carries that many tool results, and its call's arguments
echo what it received, so the tests also see `tools`, `tool_choice`, `parallel_tool_calls` and
the tool messages arrive unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from classifiers.inference import DifficultyScorer
from tests.support.budgets import REDIS_URL, delete_prefix, private_redis, random_prefix
from tests.support.proxy import ProxyThread, make_config, tier

HARD = (
    "Prove that there are infinitely many primes p such that p+2 is also prime, or explain "
    "rigorously why this remains an open problem, and derive the Hardy-Littlewood constant."
)
EASY = "42"
THRESHOLD = 0.3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look a fact up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "second", "parameters": {"type": "object"}}},
]


def test_the_texts_score_on_either_side_of_the_threshold() -> None:
    """What the tests below rely on: the shipped classifier sends HARD large and EASY small."""
    hard, easy = DifficultyScorer.load(None).score_texts([HARD, EASY])
    assert hard >= THRESHOLD + 0.1 and easy < THRESHOLD - 0.1


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


def tiers(upstream: str, large_price: dict[str, float] | None = None) -> list[dict[str, Any]]:
    large = tier("large", upstream, price=(10.0, 30.0))
    if large_price is not None:
        large["price"] = large_price
    return [tier("small", upstream, price=(1.0, 1.0)), large]


def threshold(session: dict[str, Any] | None = None) -> dict[str, Any]:
    policy: dict[str, Any] = {"type": "threshold", "threshold": THRESHOLD}
    if session is not None:
        policy["session"] = session
    return policy


def config(upstream: str, tmp: Path, **extra: Any) -> Any:
    extra.setdefault("policies", {"agent": threshold()})
    extra.setdefault("default_policy", "agent")
    # Only the last user message is scored: each turn's tier follows its own text.
    return make_config(tiers(upstream), tmp, classifier={"context_turns": 0}, **extra)


def client(proxy: ProxyThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="none", max_retries=0)


def ask(
    c: openai.OpenAI,
    messages: list[dict[str, Any]],
    *,
    stream: bool = False,
    session: str | None = None,
    model: str = "auto",
    **kw: Any,
) -> tuple[Any, dict[str, Any]]:
    """One request: (response headers, the assistant message as a dict), streamed or not."""
    headers = {"x-session-id": session} if session else {}
    if not stream:
        raw = c.chat.completions.with_raw_response.create(
            model=model, messages=messages, extra_headers=headers, **kw
        )
        message = raw.parse().choices[0].message.model_dump(exclude_none=True)
        return raw.headers, message
    with c.chat.completions.with_streaming_response.create(
        model=model, messages=messages, stream=True, extra_headers=headers, **kw
    ) as resp:
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        for chunk in resp.parse():
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                for part in delta.tool_calls or []:
                    call = calls.setdefault(
                        part.index,
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    call["id"] = part.id or call["id"]
                    if part.function is not None:
                        call["function"]["name"] += part.function.name or ""
                        call["function"]["arguments"] += part.function.arguments or ""
        message: dict[str, Any] = {"role": "assistant"}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            message["content"] = "".join(text)
        return resp.headers, message


def session_header(headers: Any) -> dict[str, str]:
    fields = (part.split("=", 1) for part in headers["x-router-session"].split("; "))
    return dict(fields)


# --- tool loops -----------------------------------------------------------------------------


def run_tool_loop(
    c: openai.OpenAI, first: list[dict[str, Any]], results: list[str], stream: bool
) -> list[tuple[Any, dict[str, Any]]]:
    """An agent: ask, run the tool the model called (its result is the next of `results`),
    send the result back, until the model answers in text."""
    messages = list(first)
    answers = []
    echo = {"echo": {"tool_rounds": len(results)}}
    for step in range(len(results) + 1):
        headers, message = ask(
            c,
            messages,
            stream=stream,
            tools=TOOLS,
            tool_choice="auto",
            parallel_tool_calls=False,
            extra_body=echo,
        )
        answers.append((headers, message))
        if step == len(results):
            assert "tool_calls" not in message, message
            break
        (call,) = message["tool_calls"]
        args = json.loads(call["function"]["arguments"])
        # What the upstream got is what the client sent: tools and their messages unchanged.
        assert args["tools"] == TOOLS
        assert (args["tool_choice"], args["parallel_tool_calls"]) == ("auto", False)
        assert args["tool_results"] == results[:step]
        assert call["function"]["name"] == "lookup" and call["id"] == f"call_{step}"
        messages += [
            message,
            {"role": "tool", "tool_call_id": call["id"], "content": results[step]},
        ]
    return answers


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_loop_stays_on_the_tier_that_made_the_call(
    upstream: str, tmp_path: Path, stream: bool
) -> None:
    """An agent whose task is its system prompt (no user turn): the policy scores each request's
    last message, so it sends the task large and would send an easy tool result small. The tier
    never changes inside the loop: every tool result goes back to the tier that called the
    tool, with the reason `tool_loop`, and sessions are not configured at all (the default)."""
    with ProxyThread(
        config(upstream, tmp_path, traces={"path": str(tmp_path / "t.jsonl")})
    ) as proxy:
        c = client(proxy)
        system = [{"role": "system", "content": HARD}]
        answers = run_tool_loop(c, system, [EASY, HARD, EASY, EASY], stream)
        assert [h["x-router-tier"] for h, _ in answers] == ["large"] * 5
        reasons = [session_header(h)["reason"] for h, _ in answers]
        assert reasons == ["new"] + ["tool_loop"] * 4
        assert {session_header(h)["id"] for h, _ in answers} == {
            session_header(answers[0][0])["id"]
        }
        records = proxy.traces(5)
        assert [r["tier"] for r in records] == ["large"] * 5
        assert [r["session_reason"] for r in records] == reasons
        assert {r["session"] for r in records} == {session_header(answers[0][0])["id"]}
        assert {r["turn"] for r in records} == {0}  # no user message: still turn 0
        # What cache_aware would price (the simulator reads it): the prefix up to the last
        # answer, none before the first one, growing with the loop, never above the prompt.
        prefixes = [r["session_prefix_tokens"] for r in records]
        assert prefixes[0] == 0 and prefixes == sorted(prefixes) and prefixes[-1] > 0
        assert all(r["session_prefix_tokens"] <= r["session_prompt_tokens"] for r in records)
        # The policy's own decision is kept in the reason: it wanted small.
        assert "session tool_loop: large" in records[1]["reason"]
        assert records[1]["reason"].startswith("score 0.0000 < 0.3000")
        labels = {"policy": "agent", "mode": "per_request", "reason": "tool_loop"}
        registry = proxy.state.metrics.registry
        assert registry.get_sample_value("cost_router_session_decisions_total", labels) == 4


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_loop_under_a_per_request_random_policy_never_changes_tier(
    upstream: str, tmp_path: Path, stream: bool
) -> None:
    """A user's task and eight tool steps under a policy that draws every request's tier at
    random (without the tool-loop rule all nine land on one tier with probability 2^-8)."""
    cfg = config(
        upstream,
        tmp_path,
        policies={"coin": {"type": "random", "p": 0.5}},
        default_policy="coin",
    )
    with ProxyThread(cfg) as proxy:
        c = client(proxy)
        answers = run_tool_loop(c, [{"role": "user", "content": "find it"}], ["r"] * 8, stream)
        assert len({h["x-router-tier"] for h, _ in answers}) == 1
        assert {session_header(h)["turn"] for h, _ in answers} == {"1"}


# --- modes across turns -----------------------------------------------------------------------


def conversation(
    c: openai.OpenAI, model: str, texts: list[str], session: str
) -> list[dict[str, str]]:
    """One user turn per text, each answer kept in the history; the x-router-session of each."""
    messages: list[dict[str, Any]] = []
    out = []
    for text in texts:
        messages.append({"role": "user", "content": text})
        headers, message = ask(c, messages, model=model, session=session)
        messages.append({"role": "assistant", "content": message["content"]})
        out.append({**session_header(headers), "tier": headers["x-router-tier"]})
    return out


def test_each_mode_across_turns(upstream: str, tmp_path: Path) -> None:
    cached = {"input_per_mtok": 10.0, "output_per_mtok": 30.0, "cached_input_per_mtok": 0.1}
    policies = {
        "per": threshold({"mode": "per_request"}),
        "sticky": threshold({"mode": "sticky"}),
        "up": threshold({"mode": "escalate_only"}),
        "cache": threshold({"mode": "cache_aware"}),
    }
    cfg = make_config(
        tiers(upstream, cached),
        tmp_path,
        classifier={"context_turns": 0},
        policies=policies,
        default_policy="per",
    )
    turns = [EASY, HARD, EASY, HARD]
    with ProxyThread(cfg) as proxy:
        c = client(proxy)
        per = conversation(c, "router:per", turns, "per-1")
        assert [t["tier"] for t in per] == ["small", "large", "small", "large"]
        assert {t["reason"] for t in per} == {"per_request"}
        assert [t["turn"] for t in per] == ["1", "2", "3", "4"]
        sticky = conversation(c, "router:sticky", turns, "sticky-1")
        assert [t["tier"] for t in sticky] == ["small"] * 4
        assert [t["reason"] for t in sticky] == ["new", "held", "same", "held"]
        assert {t["mode"] for t in sticky} == {"sticky"}
        up = conversation(c, "router:up", turns, "up-1")
        assert [t["tier"] for t in up] == ["small", "large", "large", "large"]
        assert [t["reason"] for t in up] == ["new", "escalated", "held", "same"]
        # cache_aware: up freely; down only when the turn saves more than the large tier's
        # cache is worth. Here the prefix is long and large's cached reads cost a hundredth of
        # fresh, so the easy third turn stays large.
        cache = conversation(c, "router:cache", turns, "cache-1")
        assert [t["tier"] for t in cache] == ["small", "large", "large", "large"]
        assert [t["reason"] for t in cache] == ["new", "escalated", "cache_held", "same"]


def test_cache_aware_moves_down_when_the_tier_holds_no_cache_discount(
    upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream,
        tmp_path,
        policies={"cache": threshold({"mode": "cache_aware"})},
        default_policy="cache",
    )
    with ProxyThread(cfg) as proxy:
        turns = conversation(client(proxy), "auto", [HARD, EASY], "c-2")
        assert [t["tier"] for t in turns] == ["large", "small"]
        assert [t["reason"] for t in turns] == ["new", "switch_saves"]


def test_sessions_are_told_apart_by_id_and_derived_without_one(
    upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream, tmp_path, policies={"s": threshold({"mode": "sticky"})}, default_policy="s"
    )
    with ProxyThread(cfg) as proxy:
        c = client(proxy)
        assert conversation(c, "auto", [HARD], "a")[0]["tier"] == "large"
        assert conversation(c, "auto", [EASY], "b")[0]["tier"] == "small"
        assert conversation(c, "auto", [EASY, EASY], "a")[0]["reason"] == "held"
        # No id: derived from the opening, so a client that sends none still gets its session.
        system = {"role": "system", "content": "be brief"}
        h1, m1 = ask(c, [system, {"role": "user", "content": HARD}])
        h2, _ = ask(
            c, [system, {"role": "user", "content": HARD}, m1, {"role": "user", "content": EASY}]
        )
        s1, s2 = session_header(h1), session_header(h2)
        assert s1["id"] == s2["id"] and s1["id"].startswith("auto-")
        assert (s2["turn"], s2["reason"], h2["x-router-tier"]) == ("2", "held", "large")
        # metadata.session_id is the second source.
        h3, _ = ask(
            c, [{"role": "user", "content": EASY}], extra_body={"metadata": {"session_id": "a"}}
        )
        assert session_header(h3)["id"] == "a" and h3["x-router-tier"] == "large"


def test_an_unusable_session_id_is_a_400_naming_it(upstream: str, tmp_path: Path) -> None:
    with ProxyThread(config(upstream, tmp_path)) as proxy:
        c = client(proxy)
        with pytest.raises(openai.BadRequestError) as bad:
            ask(c, [{"role": "user", "content": "hi"}], session="has spaces")
        assert bad.value.body["param"] == "x-session-id"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as bad:
            ask(c, [{"role": "user", "content": "hi"}], extra_body={"metadata": {"session_id": 5}})
        assert bad.value.body["param"] == "metadata.session_id"  # type: ignore[index]


# --- composition --------------------------------------------------------------------------------


def test_a_tier_the_client_names_is_never_changed(upstream: str, tmp_path: Path) -> None:
    cfg = config(
        upstream, tmp_path, policies={"s": threshold({"mode": "sticky"})}, default_policy="s"
    )
    with ProxyThread(cfg) as proxy:
        c = client(proxy)
        assert conversation(c, "auto", [HARD], "n")[0]["tier"] == "large"
        named = conversation(c, "small", [HARD, EASY], "n")
        assert [t["tier"] for t in named] == ["small", "small"]
        assert {t["reason"] for t in named} == {"client_tier"}
        # The session itself is untouched by what the client named.
        assert conversation(c, "auto", [EASY, EASY], "n")[-1]["tier"] == "large"


def test_a_budget_downgrade_wins_over_a_sticky_session(upstream: str, tmp_path: Path) -> None:
    """Money wins: the session holds large, but large's worst case does not fit the team's
    limit, so the budget sends each request to small (x-router-downgraded)."""
    cfg = config(
        upstream,
        tmp_path,
        policies={"s": threshold({"mode": "sticky"})},
        default_policy="s",
        teams={"default": {"budget": {"limit_usd": 0.01, "period": "daily"}}},
    )
    with ProxyThread(cfg) as proxy:
        c = client(proxy)
        messages: list[dict[str, Any]] = []
        for text, reason in ((HARD, "new"), (EASY, "held")):
            messages.append({"role": "user", "content": text})
            headers, message = ask(c, messages, session="money", max_tokens=1000)
            messages.append({"role": "assistant", "content": message["content"]})
            assert headers["x-router-tier"] == "small"
            assert headers["x-router-downgraded"] == "true"
            assert session_header(headers)["reason"] == reason


def test_an_experiment_by_session_keeps_each_conversation_in_one_arm(
    upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream,
        tmp_path,
        policies={
            "agent": threshold(),
            "all-small": {"type": "fixed", "tier": "small"},
            "all-large": {"type": "fixed", "tier": "large"},
        },
        experiments=[
            {
                "name": "conv",
                "unit": "session",
                "arms": {
                    "a": {"policy": "all-small", "weight": 1},
                    "b": {"policy": "all-large", "weight": 1},
                },
            }
        ],
    )
    with ProxyThread(cfg) as proxy:
        c = client(proxy)
        arms = {}
        for i in range(12):
            seen = set()
            messages: list[dict[str, Any]] = []
            for text in (HARD, EASY, HARD):
                messages.append({"role": "user", "content": text})
                headers, message = ask(c, messages, session=f"conv-{i}")
                messages.append({"role": "assistant", "content": message["content"]})
                seen.add((headers["x-router-arm"], headers["x-router-tier"]))
            assert len(seen) == 1, seen  # one arm, and its tier, for the whole conversation
            arms[i] = seen.pop()
        assert {arm for arm, _ in arms.values()} == {"a", "b"}
        assert all(t == ("small" if a == "a" else "large") for a, t in arms.values())


# --- shared state and outages -------------------------------------------------------------------


def redis_config(upstream: str, tmp: Path, url: str, prefix: str, **budgets: Any) -> Any:
    return config(
        upstream,
        tmp,
        policies={"s": threshold({"mode": "sticky", "ttl_s": 60})},
        default_policy="s",
        budgets={"store": "redis", "redis_url": url, "key_prefix": prefix, **budgets},
    )


def test_two_replicas_on_one_redis_share_sessions(upstream: str, tmp_path: Path) -> None:
    prefix = random_prefix()
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        a = ProxyThread(redis_config(upstream, tmp_path / "a", REDIS_URL, prefix))
        b = ProxyThread(redis_config(upstream, tmp_path / "b", REDIS_URL, prefix))
        with a, b:
            ca, cb = client(a), client(b)
            assert conversation(ca, "auto", [HARD], "shared")[0]["tier"] == "large"
            # The next turns land on the other replica, which knows the session.
            later = conversation(cb, "auto", [HARD, EASY], "shared")
            assert later[1]["tier"] == "large" and later[1]["reason"] == "held"
            # A tool loop started on one replica continues on the other on the same tier.
            system = [{"role": "system", "content": HARD}]
            headers, message = ask(ca, system, tools=TOOLS, extra_body={"echo": {"tool_rounds": 1}})
            assert headers["x-router-tier"] == "large"
            (call,) = message["tool_calls"]
            result = {"role": "tool", "tool_call_id": call["id"], "content": EASY}
            headers, _ = ask(
                cb,
                [*system, message, result],
                tools=TOOLS,
                stream=True,
                extra_body={"echo": {"tool_rounds": 1}},
            )
            assert headers["x-router-tier"] == "large"
            assert session_header(headers)["reason"] == "tool_loop"
    finally:
        delete_prefix(prefix)


@pytest.mark.parametrize("fail_mode", ["closed", "open"])
def test_an_unreachable_store_fails_as_budgets_do(
    upstream: str, tmp_path: Path, fail_mode: str
) -> None:
    with private_redis(tmp_path) as server:
        cfg = redis_config(
            upstream, tmp_path, server.url, "cr", fail_mode=fail_mode, redis_timeout_s=0.5
        )
        with ProxyThread(cfg) as proxy:
            c = client(proxy)
            assert conversation(c, "auto", [HARD], "down")[0]["tier"] == "large"
            server.kill()
            if fail_mode == "closed":
                with pytest.raises(openai.InternalServerError) as refused:
                    conversation(c, "auto", [EASY], "down")
                assert refused.value.status_code == 503
                # The step rides on the budget reserve: the budget's own 503.
                assert refused.value.body["code"] == "budget_unavailable"  # type: ignore[index]
            else:
                (turn,) = conversation(c, "auto", [EASY], "down")
                assert (turn["tier"], turn["reason"]) == ("small", "store_unavailable")


def test_a_context_window_wins_over_a_sticky_session(upstream: str, tmp_path: Path) -> None:
    """Safety wins: the session holds small, but the conversation outgrew small's context
    window, so the request goes large (and the session's own tier stays small)."""
    small, large = tiers(upstream)
    small["context_window"] = 4000
    cfg = make_config(
        [small, large],
        tmp_path,
        classifier={"context_turns": 0},
        policies={"s": threshold({"mode": "sticky"})},
        default_policy="s",
    )
    with ProxyThread(cfg) as proxy:
        c = client(proxy)
        headers, _ = ask(c, [{"role": "user", "content": EASY}], session="grow", max_tokens=50)
        assert headers["x-router-tier"] == "small"
        long_turn = [{"role": "user", "content": EASY}, {"role": "assistant", "content": "ok"}]
        long_turn.append({"role": "user", "content": "word " * 2000})
        headers, _ = ask(c, long_turn, session="grow", max_tokens=50)
        assert headers["x-router-tier"] == "large"
        assert headers["x-router-context-window"] == "moved from small"
        assert session_header(headers)["reason"] in ("held", "same")
        # Short again: back on the session's own tier.
        headers, _ = ask(c, [{"role": "user", "content": EASY}], session="grow", max_tokens=50)
        assert headers["x-router-tier"] == "small"
