"""Latency model: speculative-decoding math, the FIFO discrete-event queue, the levers."""

from __future__ import annotations

import numpy as np
import pytest

from simulations.latency import (
    LatencyModelError,
    TierLatency,
    fifo_queue_start,
    simulate,
    spec_speedup,
    spec_tokens_per_step,
    with_speculative,
    with_speed_factor,
)


def test_tokens_per_step_closed_form_and_limits() -> None:
    assert spec_tokens_per_step(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert spec_tokens_per_step(0.0, 7) == pytest.approx(1.0)  # nothing accepted: target's token
    assert spec_tokens_per_step(1.0, 5) == pytest.approx(6.0)  # everything accepted: k + 1
    # Continuous at a -> 1.
    assert spec_tokens_per_step(1 - 1e-9, 5) == pytest.approx(6.0, rel=1e-6)


def test_tokens_per_step_matches_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    a, k, steps = 0.6, 4, 200_000
    accepted = rng.random((steps, k)) < a
    # Accepted prefix length (first rejection stops the run) + the target's own token.
    prefix = np.where(accepted.all(axis=1), k, np.argmin(accepted, axis=1))
    assert (prefix + 1).mean() == pytest.approx(spec_tokens_per_step(a, k), rel=0.01)


def test_draft_cost_can_make_speculation_a_loss() -> None:
    assert spec_speedup(0.7, 5, 0.0) == pytest.approx(spec_tokens_per_step(0.7, 5))
    assert spec_speedup(0.7, 5, 0.1) == pytest.approx(spec_tokens_per_step(0.7, 5) / 1.5)
    assert spec_speedup(0.1, 8, 0.3) < 1.0
    with pytest.raises(LatencyModelError, match="acceptance"):
        spec_tokens_per_step(1.5, 3)


def test_fifo_queue_by_hand() -> None:
    arrivals = np.array([0.0, 0.0, 0.0, 5.0])
    service = np.array([1.0, 2.0, 1.0, 1.0])
    np.testing.assert_allclose(fifo_queue_start(arrivals, service, 1), [0, 1, 3, 5])
    np.testing.assert_allclose(fifo_queue_start(arrivals, service, 2), [0, 0, 1, 5])
    np.testing.assert_allclose(fifo_queue_start(arrivals, service, 8), [0, 0, 0, 5])


def test_mm1_mean_wait_matches_queueing_theory() -> None:
    # M/M/1 with rho = 0.5: mean wait in queue = rho / (mu - lambda) = 1 s.
    rng = np.random.default_rng(1)
    n = 200_000
    arrivals = np.cumsum(rng.exponential(2.0, n))
    service = rng.exponential(1.0, n)
    wait = fifo_queue_start(arrivals, service, 1) - arrivals
    assert wait[1000:].mean() == pytest.approx(1.0, rel=0.06)


def test_simulate_per_tier_and_levers() -> None:
    small = TierLatency(ttft_s=0.1, per_token_s=0.01, concurrency=1)
    large = TierLatency(ttft_s=0.5, per_token_s=0.05, concurrency=1, prefill_per_token_s=0.001)
    arrivals = np.array([0.0, 0.0, 10.0])
    tiers = np.array([0, 1, 1])
    prompt = np.array([100, 100, 100])
    completion = np.array([10, 10, 10])
    res = simulate(arrivals, tiers, prompt, completion, [small, large])
    np.testing.assert_allclose(res.e2e_s, [0.2, 0.5 + 0.1 + 0.5, 1.1])
    np.testing.assert_allclose(res.ttft_s, [0.1, 0.6, 0.6])
    faster = with_speculative(large, 0.7, 5, 0.0)
    assert faster.per_token_s == pytest.approx(large.per_token_s / spec_tokens_per_step(0.7, 5))
    assert faster.ttft_s == large.ttft_s  # speculation only changes decoding
    quant = with_speed_factor(small, 2.0)
    assert (quant.ttft_s, quant.per_token_s) == pytest.approx((0.05, 0.005))


def test_unsorted_arrivals_name_the_record() -> None:
    small = TierLatency(0.1, 0.01)
    with pytest.raises(LatencyModelError, match="record 2"):
        simulate(np.array([0.0, 2.0, 1.0]), np.zeros(3, dtype=int), np.ones(3), np.ones(3), [small])


def test_utilization_flags_an_overloaded_tier() -> None:
    model = TierLatency(ttft_s=0.0, per_token_s=1.0, concurrency=2)
    arrivals = np.arange(0.0, 100.0)  # one per second, each needs 4 s on one of 2 slots
    res = simulate(arrivals, np.zeros(100, dtype=int), np.zeros(100), np.full(100, 4.0), [model])
    assert res.utilization[0] == pytest.approx(400 / (2 * 99))
    assert res.wait_s[-1] > res.wait_s[10] > 0  # the queue keeps growing
