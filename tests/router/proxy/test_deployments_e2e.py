"""End to end: several deployments of one tier behind the real proxy, with the official `openai`
client over real HTTP. Echo upstreams of unequal speed (the balancing strategies, a deployment
killed mid-test and brought back), and two real llama.cpp servers, one killed mid-test."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from benchmarks.echo_upstream import running_echo_upstream
from policies.budgets.money import usd_to_nanos
from policies.config import BudgetLimit, BudgetsConfig
from policies.keys import hash_key
from tests.support.audit import Told, audit_budgets
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.metrics_server import FIRST, MetricsServer
from tests.support.ports import free_port
from tests.support.proxy import ProxyThread, llama_server, make_config, stop_process, tier
from tests.support.waiting import wait_for

MESSAGES = [{"role": "user", "content": "hello there"}]


def deployments_tier(name: str, deployments: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    data = tier(name, "unused", **extra)
    del data["base_url"]
    return {**data, "deployments": deployments}


def client_of(proxy: ProxyThread) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def served_by(client: OpenAI, **extra: Any) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model="large", max_tokens=4, messages=MESSAGES, temperature=0, **extra
    )
    assert raw.parse().choices[0].message.content
    return raw.headers["x-router-deployment"]


def spread(client: OpenAI, requests: int, concurrency: int) -> Counter[str]:
    with ThreadPoolExecutor(concurrency) as pool:
        return Counter(pool.map(lambda _: served_by(client), range(requests)))


@pytest.fixture(scope="module")
def echoes() -> Iterator[dict[str, str]]:
    """Three echo upstreams: two fast, one slow."""
    with (
        running_echo_upstream("--delay-ms", "10") as fast1,
        running_echo_upstream("--delay-ms", "10") as fast2,
        running_echo_upstream("--delay-ms", "150") as slow,
    ):
        yield {"fast1": fast1, "fast2": fast2, "slow": slow}


def test_least_outstanding_sends_fewer_to_the_slow_one(
    echoes: dict[str, str], tmp_path: Path
) -> None:
    deployments = [{"name": n, "base_url": u} for n, u in echoes.items()]
    config = make_config([deployments_tier("large", deployments)], tmp_path)
    with ProxyThread(config) as proxy:
        shares = spread(client_of(proxy), 60, 6)
    assert sum(shares.values()) == 60
    assert shares["slow"] < shares["fast1"] and shares["slow"] < shares["fast2"], shares
    assert shares["slow"] < 60 / 3  # round-robin would give it a third


def test_weighted_follows_the_weights_and_names_the_deployment(
    echoes: dict[str, str], tmp_path: Path
) -> None:
    deployments = [
        {"name": n, "base_url": u, "weight": w}
        for (n, u), w in zip(echoes.items(), (3, 1, 1), strict=True)
    ]
    weighted = deployments_tier("large", deployments, balancing={"strategy": "weighted"})
    config = make_config([weighted], tmp_path)
    with ProxyThread(config) as proxy:
        client = client_of(proxy)
        shares = Counter(served_by(client) for _ in range(25))
        stream = client.chat.completions.with_raw_response.create(
            model="large", max_tokens=4, messages=MESSAGES, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
        streamed_by = stream.headers["x-router-deployment"]
        traces = proxy.traces(26)
    assert shares == {"fast1": 15, "fast2": 5, "slow": 5}
    assert Counter(t["deployment"] for t in traces[:25]) == shares
    assert traces[-1]["deployment"] == streamed_by and traces[-1]["stream"]


def test_failing_deployment_retried_in_tier_charged_once(tmp_path: Path) -> None:
    """A deployment answering 503 is retried on another deployment of the same tier, not on the
    fallback tier; the request is charged once, for the answer it got (the budget audit: spend
    == ledger == what the clients were told, no live reservation)."""
    prefix = random_prefix()
    budgets = {"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix}
    with running_echo_upstream("--fail-status", "503") as bad, running_echo_upstream() as good:
        config = make_config(
            [
                deployments_tier(
                    "large",
                    [{"name": "bad", "base_url": bad}, {"name": "good", "base_url": good}],
                    fallback=["small"],
                    balancing={"strategy": "round_robin"},
                ),
                tier("small", good, price=(0.1, 0.1)),
            ],
            tmp_path,
            teams={"t": {"budget": {"limit_usd": 1.0, "period": "total"}}},
            keys=[{"key_sha256": hash_key("sk-test-t"), "team": "t"}],
            auth={"required": True},
            budgets=budgets,
        )
        told = Told()
        try:
            with ProxyThread(config) as proxy:
                client = OpenAI(base_url=proxy.url + "/v1", api_key="sk-test-t", max_retries=0)
                raws = [
                    client.chat.completions.with_raw_response.create(
                        model="large", max_tokens=4, messages=MESSAGES
                    )
                    for _ in range(4)
                ]
                traces = proxy.traces(4)
                # Round-robin sent three of them to `bad` first: three failures eject it.
                status = proxy.state.backends["large"].deployments.status()  # type: ignore[attr-defined]
            for raw in raws:
                told.response("t", raw.http_response)
            audit = audit_budgets(
                BudgetsConfig(**budgets), {"t": BudgetLimit(limit_usd=1.0, period="total")}, told
            )
        finally:
            delete_prefix(prefix)
    assert audit.breaches() == [], audit.figures()
    assert status["bad"]["ejections"] == 1 and status["bad"]["served"] == 0
    price = config.tier("large").price
    for raw in raws:
        usage = raw.parse().usage
        assert usage is not None
        assert raw.headers["x-router-deployment"] == "good"
        assert raw.headers["x-router-tier"] == "large"
        assert "x-router-fallback-from" not in raw.headers
        expected = price.cost(usage.prompt_tokens, usage.completion_tokens)
        assert float(raw.headers["x-router-cost-usd"]) == pytest.approx(expected, abs=1e-9)
        assert audit.charges[raw.headers["x-router-request-id"]].nanos == usd_to_nanos(expected)
    assert all(t["tiers_tried"] == ["large"] and t["status"] == 200 for t in traces)


def test_load_aware_through_the_proxy(tmp_path: Path) -> None:
    """Deployments exposing vLLM metrics: the proxy sends requests to the one with the shorter
    queue, and policies see the tier's load as that queue."""
    busy, idle = MetricsServer(), MetricsServer()
    idle.metrics = FIRST.replace("} 7.0", "} 0.0").replace("} 5.0", "} 1.0")
    try:
        deployments = [
            {
                "name": n,
                "base_url": f"http://127.0.0.1:{s.port}/v1",
                "metrics_url": f"http://127.0.0.1:{s.port}/metrics",
            }
            for n, s in (("busy", busy), ("idle", idle))
        ]
        config = make_config(
            [deployments_tier("large", deployments, balancing={"probe_interval_s": 0.1})], tmp_path
        )
        with ProxyThread(config) as proxy:
            client = client_of(proxy)
            served_by(client)  # the first request starts the probes
            wait_for(lambda: "large" in proxy.state.load(), 5, "the tier's load from its probes")
            assert proxy.state.load()["large"].waiting == 1
            assert {served_by(client) for _ in range(4)} == {"idle"}
    finally:
        busy.close()
        idle.close()


class Load:
    """Clients sending requests without pause, in threads, until stopped."""

    def __init__(self, client: OpenAI, workers: int) -> None:
        self.client = client
        self.served: Counter[str] = Counter()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                name = served_by(self.client)
            except openai.APIError as exc:
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self.served[name] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.served.values())

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def test_killed_deployment_is_ejected_and_comes_back(tmp_path: Path) -> None:
    port = free_port()
    with (
        running_echo_upstream("--delay-ms", "5") as a,
        running_echo_upstream("--delay-ms", "5") as b,
        contextlib.ExitStack() as victim,
    ):
        c = victim.enter_context(running_echo_upstream("--delay-ms", "5", "--port", str(port)))
        # A cool-down long enough that c cannot come back (half-open) while the 15 requests
        # after the kill run on a loaded machine; how fast it is ejected is
        # benchmarks/balancing.py's to measure, not a timed assertion's.
        probe_s, cooldown_s = 0.2, 3.0
        deployments = [
            {"name": "a", "base_url": a},
            {"name": "b", "base_url": b},
            {"name": "c", "base_url": c},
        ]
        config = make_config(
            [
                deployments_tier(
                    "large",
                    deployments,
                    balancing={"probe_interval_s": probe_s, "cooldown_s": cooldown_s},
                )
            ],
            tmp_path,
        )
        with ProxyThread(config) as proxy, Load(client_of(proxy), 3) as load:
            backend = proxy.state.backends["large"]
            status = backend.deployments.status  # type: ignore[attr-defined]
            wait_for(lambda: load.served["c"] >= 5, 20, "c to serve some requests")
            victim.close()  # its process stops
            # Ejected by the next request that reaches it (refused connection) or the next probe.
            wait_for(lambda: not status()["c"]["available"], 5, "c to be ejected")
            metrics = httpx.get(proxy.url + "/metrics").text
            assert 'cost_router_deployment_available{deployment="c",tier="large"} 0.0' in metrics
            assert 'cost_router_deployment_available{deployment="a",tier="large"} 1.0' in metrics
            after_kill = load.total()
            wait_for(lambda: load.total() >= after_kill + 15, 20, "requests after the kill")
            served_c = load.served["c"]
            assert not status()["c"]["available"]
            with running_echo_upstream("--delay-ms", "5", "--port", str(port)):
                wait_for(lambda: status()["c"]["available"], 10, "c back after cool-down + probe")
                wait_for(lambda: load.served["c"] > served_c, 10, "c serving again")
        assert load.errors == []


def test_two_llama_servers_one_killed_mid_test(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    with (
        llama_server("smol", tmp_path / "l1") as (url1, _),
        llama_server("smol", tmp_path / "l2") as (url2, proc2),
    ):
        config = make_config(
            [
                deployments_tier(
                    "large",
                    [{"name": "one", "base_url": url1}, {"name": "two", "base_url": url2}],
                    model="smol",
                    balancing={"probe_interval_s": 0.5, "probe_timeout_s": 5},
                )
            ],
            tmp_path,
        )
        with ProxyThread(config) as proxy:
            client = client_of(proxy)
            before = Counter(served_by(client) for _ in range(4))
            assert before == {"one": 2, "two": 2}  # idle deployments take turns
            stop_process(proc2)
            after = [served_by(client) for _ in range(3)]
            # The stream must arrive through the survivor, parse whole and carry choices. Its text
            # is llama.cpp's: CI has seen streams of only empty deltas (greedy or not, loaded
            # machine), which say nothing about the deployments, so the text is not asserted.
            stream = client.chat.completions.with_raw_response.create(
                model="large", max_tokens=16, messages=MESSAGES, stream=True, temperature=0
            )
            chunks = list(stream.parse())
            assert any(c.choices for c in chunks)
            status = proxy.state.backends["large"].deployments.status()  # type: ignore[attr-defined]
    assert after == ["one"] * 3 and stream.headers["x-router-deployment"] == "one"
    assert not status["two"]["available"]
