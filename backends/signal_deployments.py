"""Active health and load of each deployment of a tier (backends/deployments.py): a probe loop.

Every `probe_interval_s`, each deployment gets a readiness probe and, when it names a
`metrics_url` (vLLM), a scrape of its queue and KV cache (parsed by backends/metrics_scrape.py,
as the tier-level signals poller does) for load-aware balancing. Readiness is the first of
/readyz, /health (at the server root) and GET {base_url}/models that the server serves (answers
other than 404/405), remembered per deployment; `balancing.health_path` names one instead.
A probe never raises: a failure is an unhealthy verdict (backends/deployments.py `probed`: a
refused connection at once, a slow or failed answer at the second in a row).
`register_deployments` puts each deployment's state in the router's /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping
from weakref import WeakKeyDictionary

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from backends.deployments import Deployment, DeploymentSet, balanced_sets
from backends.metrics_scrape import KV_CACHE, RUNNING, WAITING, parse_metrics
from trace_format.tasks import stop_tasks

log = logging.getLogger(__name__)

NOT_SERVED = frozenset({404, 405})


def server_root(base_url: str) -> str:
    """The server root of an OpenAI base URL (…/v1 stripped): where /health lives."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class DeploymentProber:
    """Probes every deployment of one `DeploymentSet` each `interval_s`."""

    def __init__(
        self,
        deployments: DeploymentSet,
        interval_s: float,
        timeout_s: float,
        health_path: str | None = None,
    ) -> None:
        self.set = deployments
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._candidates: dict[str, list[str]] = {}
        for d in deployments.deployments:
            root = server_root(d.base_url)
            if health_path is not None:
                self._candidates[d.name] = [f"{root}/{health_path.lstrip('/')}"]
            else:
                self._candidates[d.name] = [
                    f"{root}/readyz",
                    f"{root}/health",
                    f"{d.base_url}/models",
                ]
        self._configured = health_path is not None
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def probe_once(self) -> None:
        await asyncio.gather(*(self._probe(d) for d in self.set.deployments))
        self.set.refresh_load()

    async def _probe(self, d: Deployment) -> None:
        unreachable = False
        try:
            healthy, detail = await self._health(d)
        except httpx.ConnectError as exc:  # nothing listens there: out at once
            healthy, detail, unreachable = False, f"unreachable: {type(exc).__name__}", True
        except Exception as exc:  # noqa: BLE001 - a probe reports, never takes the router down
            healthy, detail = False, f"{type(exc).__name__}: {exc}"
        self.set.probed(d, healthy, detail, unreachable)
        if d.metrics_url is not None:
            await self._scrape(d, healthy)

    async def _health(self, d: Deployment) -> tuple[bool, str]:
        candidates = self._candidates[d.name]
        for i, url in enumerate(candidates):
            try:
                resp = await self._http().get(url)
            except httpx.ConnectError:
                raise
            except httpx.HTTPError as exc:
                return False, f"GET {url}: {type(exc).__name__}"
            last = i == len(candidates) - 1
            if resp.status_code in NOT_SERVED and not last and not self._configured:
                continue  # this server does not serve that path: try the next kind
            if i > 0 and not self._configured:
                self._candidates[d.name] = candidates[i:]  # remember what it serves
            return resp.status_code == 200, f"GET {url} answered {resp.status_code}"
        return False, "no probe path"

    async def _scrape(self, d: Deployment, healthy: bool) -> None:
        assert d.metrics_url is not None
        waiting = running = kv = None
        if healthy:
            try:
                resp = await self._http().get(d.metrics_url)
                if resp.status_code == 200:
                    scrape = parse_metrics(resp.text)
                    waiting, running = scrape.gauge(WAITING), scrape.gauge(RUNNING)
                    kv = scrape.gauge(*KV_CACHE)
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("tier %s: deployment %s metrics: %s", self.set.tier, d.name, exc)
        # Unknown load is no load: a deployment is never held back by a reading it lacks.
        d.waiting, d.running, d.kv_cache_usage = waiting, running, kv

    async def run(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        """Start probing on the running event loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name=f"deployment-probes-{self.set.tier}"
            )

    async def stop(self) -> None:
        await stop_tasks(self._task)
        self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class DeploymentsCollector(Collector):
    """Each deployment's balancer state in the router's /metrics, read at scrape time:
    `cost_router_deployment_available|inflight|waiting{tier,deployment}` and the counters
    `cost_router_deployment_served_total|ejections_total{tier,deployment}`."""

    def __init__(self, sets: Mapping[str, DeploymentSet]) -> None:
        self.sets = sets

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["tier", "deployment"]
        available = GaugeMetricFamily(
            "cost_router_deployment_available",
            "1 when the deployment takes requests (not ejected, last probe healthy).",
            labels=labels,
        )
        inflight = GaugeMetricFamily(
            "cost_router_deployment_inflight",
            "This replica's requests in flight on the deployment.",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "cost_router_deployment_requests_waiting",
            "Requests queued on the deployment's server (vLLM).",
            labels=labels,
        )
        served = CounterMetricFamily(
            "cost_router_deployment_served", "Attempts the deployment answered.", labels=labels
        )
        ejections = CounterMetricFamily(
            "cost_router_deployment_ejections",
            "Times the deployment was ejected by passive health.",
            labels=labels,
        )
        now = time.monotonic()
        for tier, s in self.sets.items():
            for d in s.deployments:
                key = [tier, d.name]
                available.add_metric(key, float(d.available(now)))
                inflight.add_metric(key, float(d.inflight))
                if d.waiting is not None:
                    waiting.add_metric(key, d.waiting)
                served.add_metric(key, float(d.served))
                ejections.add_metric(key, float(d.ejections))
        yield from (available, inflight, waiting, served, ejections)


_REGISTERED: WeakKeyDictionary[CollectorRegistry, DeploymentsCollector] = WeakKeyDictionary()


def register_deployments(backends: Mapping[str, object], registry: CollectorRegistry) -> None:
    """Adds the per-deployment series of every backend that balances deployments to `registry`;
    a second call for the same registry (a rebuilt state sharing its metrics) points the existing
    collector at the new backends."""
    sets = balanced_sets(backends)
    collector = _REGISTERED.get(registry)
    if collector is not None:
        collector.sets = sets
    elif sets:
        collector = DeploymentsCollector(sets)
        registry.register(collector)
        _REGISTERED[registry] = collector
