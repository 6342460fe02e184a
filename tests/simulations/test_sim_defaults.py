"""The simulator's defaults are the proxy's: `cost-router simulate` without a config replays what
`cost-router serve` without a config (the embedded demo, router/server/demo.py) would decide and
charge."""

from __future__ import annotations

import numpy as np

from policies.base import BatchContext, Tunable
from policies.registry import build_policies
from policies.spec import card_threshold
from router.server.demo import demo_config
from simulations.replay import pick_policy
from simulations.sim_config import default_sim_config


def test_the_simulators_defaults_are_the_embedded_demos() -> None:
    # Issue 16: the simulator assumed threshold 0.5; the demo uses the card's default_threshold.
    demo = demo_config(small_port=18101, large_port=18102, host="127.0.0.1", port=18080)
    sim = default_sim_config()
    env = demo.policy_env()
    assert dict(sim.prices) == dict(env.prices)
    assert sim.default_policy == demo.default_policy
    assert sim.model_path == demo.classifier.model_path
    assert sim.context_turns == demo.classifier.context_turns
    assert sim.budgets == demo.budgets.model_copy(update={"store": sim.budgets.store})
    assert dict(sim.teams) == demo.teams
    proxy = build_policies(demo.policies, env)[demo.default_policy]
    replayed = pick_policy(sim, None)
    assert isinstance(proxy, Tunable) and isinstance(replayed, Tunable)
    assert (replayed.small, replayed.large) == (proxy.small, proxy.large)
    assert replayed.threshold == proxy.threshold == card_threshold(None)
    assert card_threshold(None) != 0.5  # the shipped card's value, not the fallback
    scores = np.linspace(0.0, 1.0, 101)
    ctx = BatchContext(units=[str(i) for i in range(len(scores))])
    assert list(replayed.decide_batch(scores, ctx)) == list(proxy.decide_batch(scores, ctx))
