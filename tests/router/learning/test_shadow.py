"""Shadow comparisons through the real proxy (uvicorn, real HTTP) in front of echo upstreams:
records land, the client's answer is never changed, delayed or charged for them, a full queue
drops and counts, and the daily cap holds across replicas sharing a Redis budget store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.echo_upstream import running_echo_upstream
from policies.budgets.factory import build_stores
from policies.budgets.scopes import BudgetScope
from policies.config import BudgetLimit, BudgetsConfig
from policies.hashing import unit_uniform
from router.config import config_from_dict
from router.learning.config import SHADOW_SCOPE
from router.learning.shadow_log import ShadowLog
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.waiting import wait_for
from trace_format.config_base import ConfigError
from trace_format.labels import iter_labels
from trace_format.shadow import iter_shadow

ECHO_TEXT = " ".join(["echo"] * 8)  # what the echo upstream answers


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


@pytest.fixture(scope="module")
def slow_echo() -> Iterator[str]:
    with running_echo_upstream("--delay-ms", "3000") as url:
        yield url


def tiers(echo: str, slow: str | None = None, **extra: Any) -> list[dict[str, Any]]:
    out = [
        tier("small", echo, price=(0.6, 0.6), **extra),
        tier("large", echo, price=(10, 30), **extra),
    ]
    if slow is not None:
        out.append(tier("slow", slow, price=(1, 1)))
    return out


def evaluation(**extra: Any) -> dict[str, Any]:
    return {"enabled": True, "sample_rate": 1.0, "store_content_teams": ["*"], **extra}


def metric(proxy: ProxyThread, name: str, **labels: str) -> float:
    text = httpx.get(proxy.url + "/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def shadow_records(proxy: ProxyThread) -> list[dict[str, Any]]:
    assert proxy.state.shadow is not None
    return list(iter_shadow(proxy.state.shadow.log.path))


def idle(proxy: ProxyThread) -> bool:
    return proxy.state.shadow is not None and proxy.state.shadow.idle()


def client(proxy: ProxyThread) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_full_sampling_records_both_answers_and_labels(echo: str, tmp_path: Path) -> None:
    config = make_config(
        tiers(echo), tmp_path, evaluation=evaluation(judges={"reference": {"match": "exact"}})
    )
    with ProxyThread(config) as proxy:
        oa = client(proxy)
        ids, tiers_seen = [], {}
        for i in range(6):
            raw = oa.chat.completions.with_raw_response.create(
                model="auto",
                max_tokens=16,
                messages=[{"role": "user", "content": f"hi {i}"}],
                extra_body={"metadata": {"reference_answer": ECHO_TEXT}},
            )
            ids.append(raw.headers["x-router-request-id"])
            tiers_seen[ids[-1]] = raw.headers["x-router-tier"]
        oa.chat.completions.create(
            model="auto",
            max_tokens=16,  # no reference: no label
            messages=[{"role": "user", "content": "no reference"}],
        )
        wait_for(lambda: len(shadow_records(proxy)) == 7 and idle(proxy), 20, "7 shadow records")
        records = {r["request_id"]: r for r in shadow_records(proxy)}
        assert set(ids) <= set(records)
        for rid in ids:
            rec = records[rid]
            assert rec["primary"]["tier"] == tiers_seen[rid]
            assert rec["shadow"]["tier"] == ({"small", "large"} - {tiers_seen[rid]}).pop()
            for side in ("primary", "shadow"):
                assert rec[side]["text"] == ECHO_TEXT
                assert rec[side]["completion_tokens"] == 8 and rec[side]["latency_ms"] > 0
            large = proxy.config.tier("large").price
            shadow_cost = rec["shadow"]["cost_usd"]
            if rec["shadow"]["tier"] == "large":
                assert shadow_cost == pytest.approx(large.cost(rec["shadow"]["prompt_tokens"], 8))
            assert rec["prompt"] == records[rid]["prompt"] and rec["team"] == "default"
        labels = {lb.request_id: lb for lb in iter_labels(tmp_path / "labels.jsonl")}
        assert set(ids) <= set(labels)  # the one without a reference answer has no label
        assert all(
            labels[r].judge == "reference" and labels[r].outcomes == {"small": 1.0, "large": 1.0}
            for r in ids
        )
        assert metric(proxy, "cost_router_shadow_sampled_total") == 7
        assert metric(proxy, "cost_router_shadow_completed_total") == 7
        assert (
            metric(proxy, "cost_router_judge_verdicts_total", judge="reference", result="label")
            == 6
        )
        assert (
            metric(proxy, "cost_router_judge_verdicts_total", judge="reference", result="no_label")
            == 1
        )


def test_streamed_answer_is_shadowed_after_its_last_chunk(echo: str, tmp_path: Path) -> None:
    config = make_config(tiers(echo), tmp_path, evaluation=evaluation())
    with ProxyThread(config) as proxy:
        stream = client(proxy).chat.completions.create(
            model="auto",
            max_tokens=16,
            stream=True,
            messages=[{"role": "user", "content": "stream please"}],
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.split() == ["echo"] * 8
        wait_for(lambda: len(shadow_records(proxy)) == 1 and idle(proxy), 20, "the shadow record")
        [rec] = shadow_records(proxy)
        assert rec["primary"]["text"] == text and rec["shadow"]["text"] == ECHO_TEXT


def test_content_only_for_teams_that_store_it(echo: str, tmp_path: Path) -> None:
    config = make_config(
        tiers(echo), tmp_path, evaluation=evaluation(store_content_teams=["other"])
    )
    with ProxyThread(config) as proxy:
        client(proxy).chat.completions.create(
            model="auto", max_tokens=8, messages=[{"role": "user", "content": "secret"}]
        )
        wait_for(lambda: len(shadow_records(proxy)) == 1, 20, "the shadow record")
        [rec] = shadow_records(proxy)
        assert "prompt" not in rec and "text" not in rec["primary"] and "text" not in rec["shadow"]
        assert b"secret" not in proxy.state.shadow.log.path.read_bytes()  # type: ignore[union-attr]
        assert rec["shadow"]["completion_tokens"] == 8


def test_client_is_not_delayed_by_a_slow_shadow_tier_nor_charged(
    echo: str, slow_echo: str, tmp_path: Path
) -> None:
    config = make_config(
        tiers(echo, slow_echo),
        tmp_path,
        teams={"default": {"budget": {"limit_usd": 5, "period": "daily"}}},
        evaluation=evaluation(shadow_tier="slow"),
    )
    with ProxyThread(config) as proxy:
        raw = client(proxy).chat.completions.with_raw_response.create(
            model="small", max_tokens=8, messages=[{"role": "user", "content": "quick"}]
        )
        answer = raw.parse()
        # The client has its whole answer while the shadow call (3 s upstream) is in flight.
        assert answer.choices[0].message.content == ECHO_TEXT
        assert raw.headers["x-router-tier"] == "small"
        wait_for(lambda: proxy.state.shadow.in_flight == 1, 5, "the shadow call to start")  # type: ignore[union-attr]
        assert shadow_records(proxy) == []
        wait_for(lambda: len(shadow_records(proxy)) == 1 and idle(proxy), 20, "the shadow answer")
        [rec] = shadow_records(proxy)
        assert rec["shadow"]["tier"] == "slow" and rec["shadow"]["latency_ms"] >= 3000
        assert rec["primary"]["latency_ms"] < rec["shadow"]["latency_ms"]
        budget = httpx.get(proxy.url + "/v1/budget", timeout=10).json()
        assert budget["scopes"][0]["spent_usd"] == pytest.approx(
            float(raw.headers["x-router-cost-usd"]), abs=1e-9
        )  # the team paid its own answer
        store = proxy.state.budgets.store
        [shadow_scope] = asyncio.run(store.status(proxy.state.shadow.scope))[:1]  # type: ignore[union-attr]
        assert shadow_scope.period == "daily" and shadow_scope.limit_nanos == 1_000_000_000
        assert shadow_scope.spent_nanos == round(rec["shadow"]["cost_usd"] * 1e9)
        assert metric(proxy, "cost_router_shadow_spend_usd_total", tier="slow") == pytest.approx(
            rec["shadow"]["cost_usd"]
        )


def test_full_queue_drops_and_counts_without_waiting(
    echo: str, slow_echo: str, tmp_path: Path
) -> None:
    config = make_config(
        tiers(echo, slow_echo),
        tmp_path,
        evaluation=evaluation(shadow_tier="slow", workers=1, queue_size=1),
    )
    with ProxyThread(config) as proxy:
        oa = client(proxy)
        body = {"model": "small", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        oa.chat.completions.create(**body)
        wait_for(lambda: proxy.state.shadow.in_flight == 1, 5, "the first shadow call")  # type: ignore[union-attr]
        for _ in range(4):  # one waits in the queue; three find it full
            assert oa.chat.completions.create(**body).choices[0].message.content == ECHO_TEXT
        assert metric(proxy, "cost_router_shadow_dropped_total", reason="queue_full") == 3
        assert metric(proxy, "cost_router_shadow_sampled_total") == 5
        wait_for(lambda: len(shadow_records(proxy)) == 2 and idle(proxy), 20, "two shadow records")


def test_sampling_is_by_request_id_and_filters_apply(echo: str, tmp_path: Path) -> None:
    config = make_config(
        tiers(echo),
        tmp_path,
        evaluation=evaluation(sample_rate=0.5, salt="s1", policies=["balanced"]),
    )
    with ProxyThread(config) as proxy:
        oa = client(proxy)
        ids = []
        for i in range(20):
            raw = oa.chat.completions.with_raw_response.create(
                model="auto", max_tokens=4, messages=[{"role": "user", "content": f"q{i}"}]
            )
            ids.append(raw.headers["x-router-request-id"])
        oa.chat.completions.create(
            model="small",
            max_tokens=4,  # passthrough: filtered out
            messages=[{"role": "user", "content": "explicit"}],
        )
        expected = {r for r in ids if unit_uniform("s1", r) < 0.5}
        assert 0 < len(expected) < 20
        wait_for(
            lambda: len(shadow_records(proxy)) == len(expected) and idle(proxy),
            20,
            "the sampled requests' shadow records",
        )
        assert {r["request_id"] for r in shadow_records(proxy)} == expected
        assert metric(proxy, "cost_router_shadow_sampled_total") == len(expected)


def test_rate_limit_drops_past_the_rate(echo: str, tmp_path: Path) -> None:
    config = make_config(tiers(echo), tmp_path, evaluation=evaluation(rate_per_s=0.001))
    with ProxyThread(config) as proxy:
        oa = client(proxy)
        for i in range(3):
            oa.chat.completions.create(
                model="auto", max_tokens=4, messages=[{"role": "user", "content": f"r{i}"}]
            )
        wait_for(lambda: metric(proxy, "cost_router_shadow_sampled_total") == 3, 10, "3 sampled")
        assert metric(proxy, "cost_router_shadow_dropped_total", reason="rate_limited") == 2


def test_shadow_spend_never_passes_its_cap_under_200_concurrent_requests(
    echo: str, tmp_path: Path
) -> None:
    """Two replicas share one Redis budget store; 100 concurrent requests each, all sampled.
    Every shadow call reserves its worst case under the shadow scope first, so the day's
    shadow spend (settled in Redis, and as written in the shadow files) stays within the cap."""
    prefix = random_prefix()
    cap = 0.01
    budgets = {"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix}
    ev = evaluation(shadow_tier="large", daily_cap_usd=cap, queue_size=256, workers=8)
    # Room for the whole burst: on a loaded CI machine the default 64 slots and 0.5 s queue wait
    # turn part of it into 429s, and this test is about the shadow cap, not tier capacity.
    roomy = {"max_inflight": 256, "queue_timeout_s": 30}
    configs = [
        make_config(tiers(echo, **roomy), tmp_path / f"r{i}", budgets=budgets, evaluation=ev)
        for i in range(2)
    ]

    async def burst(urls: list[str]) -> list[tuple[int, float]]:
        body = {
            "model": "small",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "a question of a few words"}],
        }
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            calls = [http.post(f"{urls[i % 2]}/v1/chat/completions", json=body) for i in range(200)]
            return [
                (r.status_code, float(r.headers["x-router-cost-usd"]))
                for r in await asyncio.gather(*calls)
            ]

    try:
        with ProxyThread(configs[0]) as a, ProxyThread(configs[1]) as b:
            answers = asyncio.run(burst([a.url, b.url]))
            assert [status for status, _ in answers] == [200] * 200
            accounted = ("cost_router_shadow_completed_total", "cost_router_shadow_dropped_total")

            def settled() -> bool:
                return all(
                    idle(p)
                    and sum(metric(p, n) for n in accounted)
                    == metric(p, "cost_router_shadow_sampled_total")
                    for p in (a, b)
                )

            wait_for(settled, 60, "every sampled request to be shadowed or dropped")
            records = shadow_records(a) + shadow_records(b)
            completed = sum(metric(p, "cost_router_shadow_completed_total") for p in (a, b))
            capped = sum(
                metric(p, "cost_router_shadow_dropped_total", reason="cap_reached") for p in (a, b)
            )
            assert sum(metric(p, "cost_router_shadow_sampled_total") for p in (a, b)) == 200
            assert len(records) == completed > 0 and capped > 0
            assert completed + capped == 200
            spent_files = sum(r["shadow"]["cost_usd"] for r in records)
            assert spent_files <= cap + 1e-12
            # And the team paid only its own answers.
            team_paid = sum(r["primary"]["cost_usd"] for r in records)
            assert team_paid > 0

        async def shadow_spend() -> tuple[int, int]:
            store, _ = build_stores(
                BudgetsConfig(store="redis", redis_url=REDIS_URL, key_prefix=prefix)
            )
            try:
                daily = BudgetLimit(limit_usd=cap, period="daily")
                [status] = (await store.status(BudgetScope(SHADOW_SCOPE, None, daily)))[:1]
                [team] = (await store.status(BudgetScope("default")))[:1]
                return status.spent_nanos + status.reserved_nanos, team.spent_nanos
            finally:
                await store.aclose()

        shadow_nanos, team_nanos = asyncio.run(shadow_spend())
        assert shadow_nanos <= round(cap * 1e9)
        assert shadow_nanos == pytest.approx(spent_files * 1e9, abs=len(records))
        # The team was charged exactly its own 200 answers: nothing of the shadow calls.
        assert team_nanos == pytest.approx(sum(cost for _, cost in answers) * 1e9, abs=200)
    finally:
        delete_prefix(prefix)


def test_retention_prunes_old_records(tmp_path: Path) -> None:
    log = ShadowLog(tmp_path / "shadow.jsonl", tmp_path / "labels.jsonl")
    now = 1_000_000.0
    for age_days in (40, 31, 29, 1):
        log.append({"request_id": f"r{age_days}", "time": now - age_days * 86400})
    (tmp_path / "shadow.jsonl").open("ab").write(b'{"torn')
    assert log.prune(30 * 86400, now=now) == 3
    assert [r["request_id"] for r in iter_shadow(log.path)] == ["r29", "r1"]
    assert log.prune(30 * 86400, now=now) == 0


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"evaluation": {"shadow_tier": "nope"}}, "evaluation.shadow_tier"),
        ({"evaluation": {"judges": {"llm": {"tier": "nope"}}}}, "evaluation.judges.llm.tier"),
        ({"evaluation": {"policies": ["nope"]}}, "evaluation.policies.0"),
        ({"teams": {SHADOW_SCOPE: {}}}, "reserved"),
        ({"evaluation": {"enabled": True}, "traces": {"path": None}}, "evaluation.path"),
        ({"evaluation": {"sample_rate": 2}}, "evaluation.sample_rate"),
        ({"evaluation": {"sampel_rate": 0.1}}, "evaluation.sampel_rate"),
    ],
)
def test_bad_evaluation_config_names_the_key(extra: dict[str, Any], key: str) -> None:
    data = {"tiers": [tier("small", "http://x/v1"), tier("large", "http://x/v1")], **extra}
    with pytest.raises(ConfigError) as err:
        config_from_dict(orjson.loads(orjson.dumps(data)), environ={})
    assert key in str(err.value)
