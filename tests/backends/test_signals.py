"""Signals: vLLM exposition parsing, rates between polls, snapshots, and polling over real HTTP.

The HTTP tests run a real server (http.server on a free port, in a thread) that serves the
fixture files written from vLLM's documented metric names and types.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from backends.base import TierLoad
from backends.config import SignalsConfig, TierConfig
from backends.metrics_scrape import parse_metrics
from backends.signal_endpoints import Endpoint, metrics_url_for, polled_endpoints
from backends.signal_poller import SignalsPoller
from backends.signal_snapshots import SnapshotError, load_snapshot, save_snapshot
from backends.signals_metrics import register_signals
from backends.tier_signals import TierSignals, derive
from tests.support.metrics_server import FIRST, LATER, MetricsServer
from tests.support.ports import free_port

# --- parsing and derivation ------------------------------------------------------------------


def test_parse_sums_engines_and_takes_the_fullest_cache() -> None:
    scrape = parse_metrics(FIRST)
    assert scrape.gauges["vllm:num_requests_running"] == 5.0  # engines 0 and 1: 3 + 2
    assert scrape.gauges["vllm:num_requests_waiting"] == 12.0
    assert scrape.gauges["vllm:kv_cache_usage_perc"] == 0.61  # max of 0.42 and 0.61
    assert scrape.counters["vllm:spec_decode_num_draft_tokens_total"] == 1600.0
    assert scrape.counters["vllm:spec_decode_num_accepted_tokens_total"] == 1000.0
    assert scrape.counters["vllm:time_to_first_token_seconds_count"] == 50.0
    # buckets are not summed into counters; the per-position counter is its own series
    assert not any(name.endswith("_bucket") for name in scrape.counters)


def test_acceptance_is_a_rate_between_polls_not_the_cumulative_ratio() -> None:
    first, later = parse_metrics(FIRST), parse_metrics(LATER)
    s = derive("large", later, first, elapsed_s=2.0)
    # (1600 - 1000) / (2400 - 1600) = 0.75, while cumulative 1600 / 2400 would be 0.667
    assert s.spec_acceptance == pytest.approx(0.75)
    assert s.ttft_s == pytest.approx(3.0 / 10)
    assert s.tpot_s == pytest.approx(4.0 / 400)
    assert s.e2e_s == pytest.approx(1.0)
    assert s.generation_tokens_per_s == pytest.approx(800 / 2.0)
    assert (s.running, s.waiting, s.kv_cache_usage) == (2.0, 1.0, 0.25)
    assert s.load() == TierLoad(running=2.0, waiting=1.0, kv_cache_usage=0.25, spec_acceptance=0.75)


def test_first_poll_has_gauges_but_no_rates() -> None:
    s = derive("large", parse_metrics(FIRST), None, elapsed_s=0.0)
    assert s.waiting == 12.0 and s.spec_acceptance is None and s.ttft_s is None


def test_idle_window_keeps_the_last_acceptance_and_reset_gives_none() -> None:
    first, later = parse_metrics(FIRST), parse_metrics(LATER)
    measured = derive("large", later, first, 2.0)
    idle = derive("large", later, later, 2.0, last=measured)  # no new drafts, no finished requests
    assert idle.spec_acceptance == pytest.approx(0.75)
    assert idle.ttft_s == pytest.approx(0.3)
    assert idle.generation_tokens_per_s == 0.0
    restarted = derive("large", first, later, 2.0)  # counters went down: server restarted
    assert restarted.spec_acceptance is None and restarted.generation_tokens_per_s is None


def test_pre_v1_cache_gauge_name_is_understood() -> None:
    text = FIRST.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert derive("large", parse_metrics(text), None, 0.0).kv_cache_usage == 0.61


def test_malformed_exposition_raises() -> None:
    with pytest.raises(ValueError):
        parse_metrics('vllm:num_requests_running{engine="0" 3\n')


# --- snapshots ------------------------------------------------------------------------------


def test_snapshot_round_trip(tmp_path: Path) -> None:
    s = derive("large", parse_metrics(LATER), parse_metrics(FIRST), 2.0, now=1.0)
    none = TierSignals("small", "no_metrics", True, 1.0, detail="no /metrics")
    path = tmp_path / "snap.json"
    save_snapshot(path, {"large": s, "small": none})
    loaded = load_snapshot(path)
    assert loaded == {"large": s, "small": none}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("not json", "is not JSON"),
        ("[]", "expected an object"),
        ('{"version": 9, "tiers": {}}', "unsupported snapshot version"),
        ('{"version": 1, "tiers": {"t": {"bogus_only": 1, "status": 3, "x": 1}}}', None),
    ],
)
def test_bad_snapshots_name_the_file(tmp_path: Path, content: str, words: str | None) -> None:
    path = tmp_path / "s.json"
    path.write_text(content)
    if words is None:  # unknown keys are ignored (newer writers), the tier still loads
        assert load_snapshot(path)["t"].tier == "t"
        return
    with pytest.raises(SnapshotError, match=words) as info:
        load_snapshot(path)
    assert str(path) in str(info.value)
    with pytest.raises(SnapshotError, match="cannot read"):
        load_snapshot(tmp_path / "missing.json")


# --- tiers -> endpoints ----------------------------------------------------------------------


def test_polled_endpoints_are_only_our_servers() -> None:
    price = {"input_per_mtok": 1, "output_per_mtok": 1}
    tiers = [
        TierConfig.model_validate(t)
        for t in [
            {
                "name": "vllm",
                "base_url": "http://h:8000/v1",
                "model": "m",
                "price": price,
                "launch": {"model": "org/m", "port": 8000},
            },
            {
                "name": "named",
                "base_url": "http://h:9/v1",
                "model": "m",
                "price": price,
                "metrics_url": "http://h:9100/custom",
            },
            {
                "name": "llama",
                "base_url": "http://h:8101/v1",
                "model": "m",
                "price": price,
                "launch": {"engine": "llama_cpp", "model": "m.gguf", "port": 8101},
            },
            {
                "name": "someone_elses_api",
                "base_url": "http://api.example/v1",
                "model": "m",
                "price": price,
            },
            {"name": "hosted", "kind": "litellm", "model": "gpt-4o", "price": price},
        ]
    ]
    eps = {e.tier: e for e in polled_endpoints(tiers)}
    assert set(eps) == {"vllm", "named", "llama"}
    assert eps["vllm"].metrics_url == "http://h:8000/metrics"  # vLLM: /metrics next to /v1
    assert eps["named"].metrics_url == "http://h:9100/custom"
    assert eps["llama"].metrics_url is None  # known to have none: readiness only
    assert metrics_url_for("http://h:1/") == "http://h:1/metrics"


def test_poller_for_tiers_takes_the_signals_section() -> None:
    tiers = [
        TierConfig.model_validate(
            {
                "name": "large",
                "base_url": "http://h:8000/v1",
                "model": "m",
                "metrics_url": "http://h/m",
                "price": {"input_per_mtok": 1, "output_per_mtok": 1},
            }
        )
    ]
    poller = SignalsPoller.for_tiers(
        tiers, SignalsConfig(interval_s=3, timeout_s=0.5, stale_after_s=7)
    )
    assert poller.endpoints == [Endpoint("large", "http://h:8000/v1", "http://h/m")]
    assert (poller.interval_s, poller.timeout_s, poller.stale_after_s) == (3, 0.5, 7)


# --- polling over real HTTP ------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    s = MetricsServer()
    yield s
    s.close()


def test_poller_computes_acceptance_across_two_real_polls(server: MetricsServer) -> None:
    poller = SignalsPoller([server.endpoint()], interval_s=0.05, timeout_s=2.0)

    async def go() -> dict[str, TierSignals]:
        try:
            first = await poller.poll_once()
            assert first["large"].status == "ok" and first["large"].spec_acceptance is None
            server.metrics = LATER
            return await poller.poll_once()
        finally:
            await poller.stop()

    snap = asyncio.run(go())
    assert snap["large"].spec_acceptance == pytest.approx(0.75)
    assert poller.load()["large"] == TierLoad(2.0, 1.0, 0.25, pytest.approx(0.75))
    trace = poller.trace_signals()
    assert trace is not None
    assert trace["large"]["waiting"] == 1.0 and trace["large"]["metrics_available"] == 1.0


def test_router_metrics_re_export_per_tier(server: MetricsServer) -> None:
    dead = Endpoint("small", f"http://127.0.0.1:{free_port()}/v1", None)
    poller = SignalsPoller([server.endpoint(), dead], timeout_s=2.0)
    registry = CollectorRegistry()
    register_signals(poller, registry)

    async def go() -> None:
        try:
            await poller.poll_once()
            server.metrics = LATER
            await poller.poll_once()
        finally:
            await poller.stop()

    asyncio.run(go())
    text = generate_latest(registry).decode()
    assert 'cost_router_backend_requests_waiting{tier="large"} 1.0' in text
    assert 'cost_router_backend_spec_acceptance_rate{tier="large"} 0.75' in text
    assert 'cost_router_backend_metrics_available{tier="large"} 1.0' in text
    assert 'cost_router_backend_up{tier="small"} 0.0' in text
    assert 'cost_router_backend_signals_state{state="unreachable",tier="small"} 1.0' in text
    assert 'requests_waiting{tier="small"}' not in text  # nothing invented for a dead tier


def test_server_without_metrics_degrades_to_readiness_only(server: MetricsServer) -> None:
    server.metrics = None  # /metrics answers 404, as llama-cpp-python's server does
    poller = SignalsPoller([server.endpoint("small")], timeout_s=2.0)

    async def go() -> dict[str, TierSignals]:
        try:
            return await poller.poll_once()
        finally:
            await poller.stop()

    s = asyncio.run(go())["small"]
    assert (s.status, s.ready) == ("no_metrics", True)
    assert "readiness from /v1/models" in s.detail
    assert poller.load() == {}  # policies see no load for it
    assert poller.trace_signals() == {"small": {"ready": 1.0, "metrics_available": 0.0}}


def test_unreachable_and_malformed_servers_do_not_raise(server: MetricsServer) -> None:
    server.metrics = "this is { not prometheus\n"
    dead = Endpoint("gone", f"http://127.0.0.1:{free_port()}/v1", None)
    poller = SignalsPoller([server.endpoint(), dead], timeout_s=2.0)

    async def go() -> dict[str, TierSignals]:
        try:
            return await poller.poll_once()
        finally:
            await poller.stop()

    snap = asyncio.run(go())
    assert snap["large"].status == "error" and "ValueError" in snap["large"].detail
    assert (snap["gone"].status, snap["gone"].ready) == ("unreachable", False)
    assert poller.load() == {}


def test_stale_readings_are_not_given_to_policies(server: MetricsServer) -> None:
    now = [1_000.0]
    poller = SignalsPoller(
        [server.endpoint()], timeout_s=2.0, stale_after_s=1.0, clock=lambda: now[0]
    )

    async def go() -> None:
        try:
            await poller.poll_once()
        finally:
            await poller.stop()

    asyncio.run(go())
    assert "large" in poller.load()
    now[0] += 0.9
    assert "large" in poller.load()  # still fresh
    now[0] += 0.2
    assert poller.load() == {}  # 1.1 s old: stale


def test_background_task_polls_until_stopped(server: MetricsServer) -> None:
    poller = SignalsPoller([server.endpoint()], interval_s=0.02, timeout_s=2.0)

    async def go() -> None:
        poller.start()
        server.metrics = LATER
        for _ in range(100):
            await asyncio.sleep(0.02)
            if poller.snapshot()["large"].status == "ok":
                break
        await poller.stop()
        assert poller._task is None

    asyncio.run(go())
    assert poller.snapshot()["large"].waiting == 1.0
