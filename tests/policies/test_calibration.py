"""The self-calibrating target share (policies/calibration.py): the shared step on the memory
store and in Redis (calibrate.lua) agree, replicas share one threshold that survives a restart,
the share holds when the score distribution moves, and config mistakes name their key."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from policies.base import BatchContext, RoutingContext, Tunable
from policies.calibration import (
    BINS,
    CalibrateParams,
    CalibratingPolicy,
    CalibrationSettings,
    Calibrator,
    MemoryCalibrationStore,
    RedisCalibrationStore,
    advance,
    calibration_store,
    replay_decisions,
)
from policies.config import PolicyConfig
from policies.registry import PolicyEnv, build_policies
from router.config import config_from_dict
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from trace_format.config_base import ConfigError

PRICES = {
    "small": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
    "large": {"input_per_mtok": 10, "output_per_mtok": 30},
}
TIERS = [{"name": n, "base_url": f"http://{n}", "model": n, "price": p} for n, p in PRICES.items()]


def settings(target: float = 0.3, start: float = 0.5, **params: Any) -> CalibrationSettings:
    return CalibrationSettings(target, start, CalibrateParams(**params), "tag-1")


def counts_of(scores: np.ndarray) -> np.ndarray:
    return np.bincount(np.minimum((scores * BINS).astype(np.int64), BINS - 1), minlength=BINS)


def stream(rng: np.random.Generator, n: int, a: float, b: float) -> np.ndarray:
    return rng.beta(a, b, n)


def build(params: dict[str, Any], **env: Any) -> Any:
    from backends.config import Price

    prices = {n: Price(**p) for n, p in PRICES.items()}
    policy_settings = PolicyConfig.model_validate({"type": "threshold", **params})
    return build_policies({"p": policy_settings}, PolicyEnv(prices=prices, **env))["p"]


# --- the shared step ----------------------------------------------------------------------------


def test_warmup_holds_the_start_then_steps_are_bounded() -> None:
    s = settings(warmup_requests=100, every_n_requests=10, max_step=0.01)
    rng = np.random.default_rng(1)
    state = None
    thresholds = []
    for _ in range(40):
        state = advance(state, counts_of(stream(rng, 10, 2, 5)), 10, s)
        thresholds.append(state.threshold)
    assert thresholds[:9] == [0.5] * 9  # 90 scores seen: still warming up
    steps = np.abs(np.diff([0.5, *thresholds]))
    assert steps.max() <= 0.01 + 1e-12
    # The quantile (about 0.36) is far below 0.5: the first updates take full steps toward it.
    assert steps[9:19] == pytest.approx([0.01] * 10)
    assert state is not None and state.seen == 400 and state.updates == 31


def test_converges_to_the_target_quantile_within_bounds() -> None:
    rng = np.random.default_rng(2)
    s = settings(warmup_requests=0, max_step=0.05, window_requests=2000)
    state = None
    for _ in range(300):
        state = advance(state, counts_of(stream(rng, 20, 2, 5)), 20, s)
    held_out = stream(rng, 20_000, 2, 5)
    assert state is not None
    assert abs(float((held_out >= state.threshold).mean()) - 0.3) < 0.02
    bounded = settings(warmup_requests=0, max_step=0.05, min_threshold=0.4, max_threshold=0.45)
    state = None
    for _ in range(50):
        state = advance(state, counts_of(stream(rng, 20, 2, 5)), 20, bounded)
    assert state is not None and state.threshold == 0.4  # the quantile (~0.36) is below the floor


def test_a_new_model_tag_restarts_calibration() -> None:
    s = settings(warmup_requests=0)
    state = advance(None, counts_of(np.full(50, 0.9)), 50, s)
    assert state.seen == 50 and state.threshold != 0.5
    other = CalibrationSettings(0.3, 0.5, s.params, "tag-2")
    fresh = advance(state, np.zeros(BINS, dtype=np.int64), 0, other)
    assert (fresh.seen, fresh.threshold, fresh.counts.sum()) == (0, 0.5, 0)


@pytest.fixture()
def redis_store():
    prefix = random_prefix()
    client = aioredis.Redis.from_url(REDIS_URL)
    yield RedisCalibrationStore(client, prefix), prefix, client  # each test closes it in its loop
    delete_prefix(prefix)


def test_redis_script_and_memory_store_take_the_same_steps(redis_store) -> None:
    store, _, client = redis_store
    memory = MemoryCalibrationStore()
    s = settings(
        warmup_requests=60,
        every_n_requests=15,
        max_step=0.03,
        window_requests=300,
        min_threshold=0.05,
        max_threshold=0.95,
    )
    rng = np.random.default_rng(3)

    async def run() -> None:
        for i in range(60):
            shift = 0 if i < 30 else 3  # the distribution moves half way
            pending = counts_of(stream(rng, 15, 2 + shift, 5))
            a = await store.push("p", pending, 15, s)
            b = await memory.push("p", pending, 15, s)
            assert a.seen == b.seen and a.updates == b.updates
            assert a.threshold == pytest.approx(b.threshold, abs=1e-9)
        stored, kept = await store.load("p"), await memory.load("p")
        assert stored is not None and kept is not None
        np.testing.assert_allclose(stored.counts, kept.counts, rtol=1e-9, atol=1e-9)
        assert stored.resets == kept.resets >= 1  # the shift was detected, the same way
        assert stored.cusum_up == pytest.approx(kept.cusum_up, abs=1e-9)
        await client.aclose()

    asyncio.run(run())


def test_replicas_share_one_threshold_that_survives_a_restart(redis_store) -> None:
    store, prefix, client = redis_store
    s = settings(warmup_requests=40, every_n_requests=10, max_step=0.05)
    rng = np.random.default_rng(4)

    async def run() -> None:
        a, b = Calibrator("p", s), Calibrator("p", s)
        for score in stream(rng, 400, 2, 5):
            for replica in (a, b):
                if replica.observe(float(score)):
                    await replica.sync(store)
        await a.sync(store)
        await b.sync(store)
        await a.sync(store)  # nothing new: reads what b's push left
        assert a.threshold == b.threshold != 0.5 and a.seen == b.seen == 800
        restarted = Calibrator("p", s)  # a new process: the start threshold until it reads
        assert restarted.threshold == 0.5 and restarted.due
        await restarted.sync(store)
        assert restarted.threshold == a.threshold and restarted.loaded
        await client.aclose()

    asyncio.run(run())


def test_an_unreachable_store_keeps_the_threshold_and_the_scores() -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from tests.support.ports import free_port

    client = aioredis.Redis(
        port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    dead = RedisCalibrationStore(client, "nowhere")
    calibrator = Calibrator("p", settings(every_n_requests=5))

    async def run() -> None:
        for _ in range(5):
            calibrator.observe(0.9)
        await calibrator.sync(dead)
        assert calibrator.threshold == 0.5 and not calibrator.loaded
        assert calibrator.failures == 1 and calibrator.take()[1] == 5  # kept for the next push

    asyncio.run(run())


def test_the_store_follows_the_budget_store() -> None:
    assert isinstance(calibration_store(object(), "p"), MemoryCalibrationStore)

    class WithRedis:
        redis = aioredis.Redis.from_url(REDIS_URL)

    assert isinstance(calibration_store(WithRedis(), "p"), RedisCalibrationStore)
    asyncio.run(WithRedis.redis.aclose())


# --- the policy ---------------------------------------------------------------------------------


def test_policy_decides_at_the_threshold_in_force() -> None:
    policy = build(
        {"target_large_share": 0.3, "calibrate": {"start_threshold": 0.6, "warmup_requests": 0}}
    )
    assert isinstance(policy, CalibratingPolicy) and isinstance(policy, Tunable)
    assert policy.threshold == 0.6 and policy.tiers() == ["small", "large"]
    policy.calibrator.threshold = 0.25
    scores = np.asarray([0.1, 0.2499, 0.25, 0.7])
    batch = policy.decide_batch(scores, BatchContext())
    one = [policy.tiers().index(policy.decide(RoutingContext(score=float(x))).tier) for x in scores]
    assert batch.tolist() == one == [0, 0, 1, 1]
    moved = policy.with_threshold(0.8)  # a calibrating policy of its own, starting there
    assert isinstance(moved, CalibratingPolicy) and moved.threshold == 0.8
    assert moved.calibrator is not policy.calibrator and not moved.calibrator.seen


def test_a_reload_carries_the_calibrated_threshold() -> None:
    from policies.calibration import CalibrationReply, carry_calibration

    params = {"target_large_share": 0.3, "calibrate": {"start_threshold": 0.6}}
    old = {"p": build(params), "q": build(params)}
    old["p"].calibrator.adopt(CalibrationReply(0.42, 500, 20))  # q never read the shared state
    new = {
        "p": build({**params, "target_large_share": 0.25}),
        "q": build(params),
        "r": build(params),
    }
    assert carry_calibration(old, new) == 1
    assert new["p"].threshold == 0.42 and new["p"].calibrator.loaded
    assert new["q"].threshold == new["r"].threshold == 0.6


def test_load_shedding_is_kept_under_calibration() -> None:
    policy = build(
        {
            "target_large_share": 0.3,
            "load_shed": {"max_waiting": 2, "margin": 0.1},
            "calibrate": {"start_threshold": 0.5},
        }
    )
    assert policy.current().margin == 0.1  # type: ignore[union-attr]


def test_start_threshold_defaults_to_the_card_without_a_trace() -> None:
    from policies.spec import card_threshold

    policy = build({"target_large_share": 0.3, "calibrate": {}})
    assert policy.threshold == card_threshold(None)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"threshold": 0.4, "calibrate": {}}, "calibrate needs target_large_share"),
        (
            {"target_large_share": 0.3, "calibrate": {"min_threshold": 0.6, "max_threshold": 0.5}},
            "policies.p.calibrate",
        ),
        ({"target_large_share": 0.3, "calibrate": {"every_n": 5}}, "policies.p.calibrate.every_n"),
        (
            {"target_large_share": 0.3, "calibrate": {"max_step": 0}},
            "policies.p.calibrate.max_step",
        ),
        ({"target_large_share": 0.3, "calibrate": {"enabled": False}}, "needs reference_trace"),
    ],
)
def test_config_mistakes_name_their_key(params: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict(
            {
                "tiers": TIERS,
                "default_policy": "p",
                "policies": {"p": {"type": "threshold", **params}},
            },
            environ={},
        )


# --- replay: the share holds when the traffic moves ----------------------------------------------


def test_replay_holds_the_share_through_a_shift_on_two_replicas() -> None:
    policy = build(
        {"target_large_share": 0.3, "calibrate": {"start_threshold": 0.5, "warmup_requests": 100}}
    )
    rng = np.random.default_rng(5)
    # Benchmark-like scores, then chat-like ones scored much higher (as ShareGPT prompts are).
    scores = np.concatenate([stream(rng, 3000, 2, 5), stream(rng, 3000, 5, 2)])
    result = replay_decisions(policy, scores, replicas=2)
    windows = result.tier_idx.reshape(-1, 500).mean(axis=1)
    after_warmup = np.delete(windows[2:], 4)  # the 500 requests right after the switch adapt
    assert np.all(np.abs(after_warmup - 0.3) <= 0.05), windows
    assert result.thresholds[0] == 0.5 and result.thresholds[-1] > 0.6


def test_simulator_replays_the_calibrating_policy() -> None:
    from simulations.replay import TierPrices, decide

    policy = build(
        {"target_large_share": 0.3, "calibrate": {"start_threshold": 0.9, "warmup_requests": 50}}
    )
    scores = np.random.default_rng(6).beta(2, 5, 2000)
    from backends.config import Price

    prices = TierPrices.from_prices({n: Price(**p) for n, p in PRICES.items()})
    tier_idx, _ = decide(policy, scores, prices, str, [str(i) for i in range(2000)])
    assert abs(float((tier_idx[1000:] == prices.index("large")).mean()) - 0.3) < 0.05


def test_the_shared_state_works_on_a_redis_cluster(redis_cluster) -> None:
    from policies.budgets.redis_cluster_store import RedisClusterBudgetStore
    from policies.config import BudgetsConfig

    prefix = random_prefix()
    budget_settings = BudgetsConfig(
        store="redis-cluster", redis_url=redis_cluster.url, key_prefix=prefix
    )
    s = settings(warmup_requests=20, every_n_requests=10)
    rng = np.random.default_rng(7)

    async def run() -> None:
        budgets = RedisClusterBudgetStore(budget_settings)
        store, memory = calibration_store(budgets, prefix), MemoryCalibrationStore()
        assert isinstance(store, RedisCalibrationStore)
        try:
            for _ in range(10):
                pending = counts_of(stream(rng, 10, 2, 5))
                a, b = await store.push("p", pending, 10, s), await memory.push("p", pending, 10, s)
                assert a.threshold == pytest.approx(b.threshold, abs=1e-9) and a.seen == b.seen
        finally:
            await budgets.aclose()

    try:
        asyncio.run(run())
    finally:
        redis_cluster.delete_prefix(prefix)


def test_a_replay_in_batches_goes_on_where_the_last_batch_ended() -> None:
    params = {
        "target_large_share": 0.3,
        "calibrate": {"start_threshold": 0.5, "warmup_requests": 30},
    }
    scores = np.random.default_rng(8).beta(2, 5, 1000)
    whole = replay_decisions(build(params), scores, replicas=2)
    policy = build(params)
    parts = [replay_decisions(policy, part, replicas=2) for part in np.split(scores, [333, 777])]
    np.testing.assert_array_equal(np.concatenate([p.thresholds for p in parts]), whole.thresholds)
    np.testing.assert_array_equal(np.concatenate([p.tier_idx for p in parts]), whole.tier_idx)
