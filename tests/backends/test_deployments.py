"""Several deployments per tier: the config, the picker's strategies, passive and active health
(backends/deployments.py, backends/signal_deployments.py), and the backend's failover between
deployments, against real HTTP servers (the metrics fixture server, the echo upstream)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from backends.base import UpstreamError
from backends.config import BalancingConfig, TierConfig
from backends.deployments import Deployment, DeploymentsBusy, DeploymentSet
from backends.openai_http import OpenAIHTTPBackend
from benchmarks.echo_upstream import running_echo_upstream
from router.config import config_from_dict
from tests.support.metrics_server import FIRST, MetricsServer
from tests.support.ports import free_port
from trace_format.config_base import ConfigError

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


def tier_dict(deployments: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    price = {"input_per_mtok": 1, "output_per_mtok": 2}
    data: dict[str, Any] = {"name": "large", "model": "m", "price": price, **extra}
    if deployments is not None:
        data["deployments"] = deployments
    return data


def config_error(tier: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"tiers": [tier]}, environ={})
    return str(err.value)


class Clock:
    """A clock the test moves: cool-downs pass without waiting for them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_set(weights: list[float], clock: Clock | None = None, **balancing: Any) -> DeploymentSet:
    ds = [
        Deployment(f"d{i}", i, f"http://127.0.0.1:{i}/v1", None, w, 4)
        for i, w in enumerate(weights)
    ]
    return DeploymentSet("large", ds, BalancingConfig(**balancing), clock or Clock())


# --- config --------------------------------------------------------------------------------------


def test_deployments_config_defaults() -> None:
    cfg = config_from_dict(
        {
            "tiers": [
                tier_dict(
                    [
                        {"base_url": "http://a:8000/v1", "max_inflight": 8},
                        {
                            "base_url": "http://b:8000/v1",
                            "name": "b",
                            "weight": 2,
                            "api_key_env": "B_KEY",
                        },
                    ]
                )
            ]
        },
        environ={},
    )
    tier = cfg.tiers[0]
    assert tier.base_url is None and tier.deployments is not None
    assert [d.name for d in tier.deployments] == ["d0", "b"]
    assert tier.max_inflight == 8 + 64  # unset: what the deployments take together
    assert tier.balancing.strategy == "least_outstanding"
    explicit = TierConfig.model_validate(tier_dict([{"base_url": "http://a/v1"}], max_inflight=3))
    assert explicit.max_inflight == 3


@pytest.mark.parametrize(
    ("tier", "key", "words"),
    [
        (tier_dict([]), "tiers.0.deployments", "at least one deployment"),
        (
            tier_dict([{"base_url": "http://a/v1"}], base_url="http://b/v1"),
            "tiers.0.deployments",
            "either base_url",
        ),
        (
            tier_dict([{"base_url": "http://a/v1"}, {"base_url": "http://b/v1", "weight": 0}]),
            "tiers.0.deployments.1.weight",
            "greater than 0",
        ),
        (
            tier_dict(
                [{"base_url": "http://a/v1", "name": "x"}, {"base_url": "http://b/v1", "name": "x"}]
            ),
            "tiers.0.deployments",
            "unique",
        ),
        (
            tier_dict([{"base_url": "http://a/v1", "wieght": 2}]),
            "tiers.0.deployments.0.wieght",
            "Extra inputs",
        ),
        (
            tier_dict([{"base_url": "http://a/v1"}], balancing={"strategy": "fastest"}),
            "tiers.0.balancing.strategy",
            "least_outstanding",
        ),
        (tier_dict(), "tiers.0.base_url", "base_url (or deployments) is required"),
        (
            tier_dict([{"base_url": "http://a/v1"}], kind="litellm"),
            "tiers.0.deployments",
            "takes one server",
        ),
    ],
)
def test_config_errors_name_the_key(tier: dict[str, Any], key: str, words: str) -> None:
    message = config_error(tier)
    assert key in message and words in message, message


# --- the picker ----------------------------------------------------------------------------------


def test_least_outstanding_takes_the_idlest_per_weight() -> None:
    s = make_set([1, 1, 2])
    d0, d1, d2 = s.deployments
    d0.inflight, d1.inflight, d2.inflight = 1, 0, 1
    assert s.pick() is d1
    d1.inflight = 1
    assert s.pick() is d2  # 1 in flight at weight 2 is half as loaded
    # Ties go round: an idle set spreads requests instead of piling on the first.
    idle = make_set([1, 1, 1])
    assert Counter(idle.pick().name for _ in range(30)) == {"d0": 10, "d1": 10, "d2": 10}


def test_least_outstanding_prefers_short_queue_then_free_kv_cache() -> None:
    s = make_set([1, 1, 1])
    d0, d1, d2 = s.deployments
    d0.waiting, d1.waiting, d2.waiting = 5, 0, 0
    d1.kv_cache_usage, d2.kv_cache_usage = 0.9, 0.2
    assert {s.pick().name for _ in range(6)} == {"d2"}
    d2.inflight = 1  # now d1's emptier queue outweighs its fuller cache
    assert s.pick() is d1


def test_weighted_follows_the_weights_smoothly() -> None:
    s = make_set([3, 1], strategy="weighted")
    picks = [s.pick().name for _ in range(40)]
    assert Counter(picks) == {"d0": 30, "d1": 10}
    assert "d1,d1" not in ",".join(picks)  # smooth: never a burst on the light one


def test_round_robin_and_max_inflight() -> None:
    s = make_set([5, 1, 1], strategy="round_robin")
    assert [s.pick().name for _ in range(6)] == ["d0", "d1", "d2"] * 2
    for d in s.deployments:
        d.inflight = d.max_inflight
    assert s.pick() is None  # all full: the backend raises DeploymentsBusy
    s.deployments[1].inflight -= 1
    assert s.pick() is s.deployments[1]
    assert s.pick(exclude=[s.deployments[1]]) is None


def test_passive_ejection_cooldown_and_probe() -> None:
    clock = Clock()
    s = make_set([1, 1], clock, eject_after_failures=2, cooldown_s=5, probe_interval_s=1)
    d0, d1 = s.deployments
    s.failed(d0)
    assert d0.available(clock.now)  # one timeout is not enough
    s.succeeded(d0)
    s.failed(d0)
    assert d0.available(clock.now)  # a success in between resets the count
    s.failed(d0)
    assert not d0.available(clock.now)
    assert {s.pick().name for _ in range(4)} == {"d1"}
    s.failed(d1, unreachable=True)  # refused connection: out at once
    assert not d1.available(clock.now)
    # Everyone out: all are tried anyway, the one out longest first.
    assert s.pick() is d0 and s.pick(exclude=[d0]) is d1
    clock.now += 5
    assert not d0.available(clock.now)  # cool-down over, but no healthy probe yet
    s.probed(d0, True)
    assert d0.available(clock.now) and not d1.available(clock.now)
    s.succeeded(d1)  # a request it took before its ejection, finishing: still out
    assert not d1.available(clock.now)


def test_active_probe_ejects_and_restores() -> None:
    s = make_set([1, 1], probe_interval_s=1)
    d0, d1 = s.deployments
    s.probed(d0, False, "GET /health timed out")
    assert d0.healthy  # one slow answer is not enough (a busy llama.cpp server)
    s.probed(d0, False, "GET /health answered 503")
    assert {s.pick().name for _ in range(4)} == {"d1"}
    s.probed(d0, True)
    assert {s.pick().name for _ in range(4)} == {"d0", "d1"}
    s.probed(d1, False, "unreachable", unreachable=True)  # refused: out at once
    assert not d1.healthy


def test_without_probes_an_ejected_deployment_returns_after_cooldown() -> None:
    clock = Clock()
    s = make_set([1, 1], clock, cooldown_s=2, probe_interval_s=0)
    s.failed(s.deployments[0], unreachable=True)
    clock.now += 2
    assert s.deployments[0].available(clock.now)


# --- real servers --------------------------------------------------------------------------------


@pytest.fixture()
def metrics_servers() -> Iterator[tuple[MetricsServer, MetricsServer]]:
    busy, idle = MetricsServer(), MetricsServer()
    idle.metrics = FIRST.replace("} 7.0", "} 0.0").replace("} 5.0", "} 0.0")
    try:
        yield busy, idle
    finally:
        busy.close()
        idle.close()


def deployment_of(server: MetricsServer, name: str) -> dict[str, Any]:
    root = f"http://127.0.0.1:{server.port}"
    return {"name": name, "base_url": f"{root}/v1", "metrics_url": f"{root}/metrics"}


def test_load_aware_balancing_from_vllm_metrics(
    metrics_servers: tuple[MetricsServer, MetricsServer],
) -> None:
    """The prober scrapes each deployment's vLLM /metrics; the picker then avoids the one with
    the long queue (12 waiting) for the idle one, and the answer names it."""
    busy, idle = metrics_servers
    tier = TierConfig.model_validate(
        tier_dict(
            [deployment_of(busy, "busy"), deployment_of(idle, "idle")],
            balancing={"probe_interval_s": 60},
        )
    )

    async def scenario() -> list[str | None]:
        backend = OpenAIHTTPBackend(tier)
        assert backend.deployments is not None and backend._prober is not None
        try:
            await backend._prober.probe_once()
            by = backend.deployments.by_name
            assert by["busy"].waiting == 12 and by["busy"].kv_cache_usage == 0.61
            assert by["idle"].waiting == 0
            # What policies see of the tier: the queue a new request would join.
            load = backend.deployments.tier_load
            assert load is not None and load.waiting == 0 and load.kv_cache_usage == 0.61
            return [(await backend.complete("chat/completions", CHAT)).deployment for _ in range(5)]
        finally:
            await backend.aclose()

    assert asyncio.run(scenario()) == ["idle"] * 5


def test_prober_finds_what_the_server_serves_and_sees_it_die() -> None:
    """The echo upstream serves neither /readyz nor /health: readiness falls back to /v1/models.
    A stopped server fails its probe."""
    with running_echo_upstream() as url:
        tier = TierConfig.model_validate(
            tier_dict([{"base_url": url}, {"base_url": f"http://127.0.0.1:{free_port()}/v1"}])
        )
        backend = OpenAIHTTPBackend(tier)
        assert backend.deployments is not None and backend._prober is not None
        up, down = backend.deployments.deployments

        async def probe() -> None:
            try:
                await backend._prober.probe_once()  # type: ignore[union-attr]
            finally:
                await backend.aclose()

        asyncio.run(probe())
        assert up.healthy and not down.healthy
        assert backend._prober._candidates[up.name] == [f"{url}/models"]


def test_backend_fails_over_between_deployments_then_busy() -> None:
    """A deployment answering 503 is retried on the other one of the same tier; a dead one is
    ejected at once; with both full, the tier is busy."""
    with running_echo_upstream("--fail-status", "503") as bad, running_echo_upstream() as good:
        dead = f"http://127.0.0.1:{free_port()}/v1"
        tier = TierConfig.model_validate(
            tier_dict(
                [
                    {"base_url": dead, "name": "dead"},
                    {"base_url": bad, "name": "bad"},
                    {"base_url": good, "name": "good", "max_inflight": 1},
                ],
                balancing={"strategy": "round_robin", "probe_interval_s": 0},
            )
        )

        async def scenario() -> None:
            backend = OpenAIHTTPBackend(tier)
            s = backend.deployments
            assert s is not None
            try:
                answers = [await backend.complete("chat/completions", CHAT) for _ in range(4)]
                assert {a.deployment for a in answers} == {"good"}
                assert not s.by_name["dead"].available(s.clock())
                chunks = [
                    c async for c in backend.stream("chat/completions", {**CHAT, "stream": True})
                ]
                assert b"[DONE]" in b"".join(chunks)
                s.by_name["good"].inflight = 1  # full; the others are out or failing
                s.eject(s.by_name["bad"], "test")
                with pytest.raises(DeploymentsBusy):
                    await backend.complete("chat/completions", CHAT)
                assert all(d.inflight == (1 if d.name == "good" else 0) for d in s.deployments)
            finally:
                await backend.aclose()

        asyncio.run(scenario())


def test_every_deployment_failing_is_one_error_naming_each() -> None:
    """The request path falls back to the next tier on it, with the 5xx status kept (502, not
    503) and each deployment's failure in the log and the trace."""
    with running_echo_upstream("--fail-status", "503") as bad:
        tier = TierConfig.model_validate(
            tier_dict(
                [{"base_url": bad, "name": "a"}, {"base_url": bad, "name": "b"}],
                balancing={"probe_interval_s": 0},
            )
        )

        async def scenario() -> list[UpstreamError]:
            backend = OpenAIHTTPBackend(tier)
            errors = []
            try:
                with pytest.raises(UpstreamError) as plain:
                    await backend.complete("chat/completions", CHAT)
                errors.append(plain.value)
                with pytest.raises(UpstreamError) as streamed:
                    await anext(backend.stream("chat/completions", {**CHAT, "stream": True}))
                errors.append(streamed.value)
            finally:
                await backend.aclose()
            return errors

        for err in asyncio.run(scenario()):
            assert err.status == 503 and err.public == "answered 503"
            assert "deployment a: answered 503" in str(err) and "deployment b:" in str(err)
