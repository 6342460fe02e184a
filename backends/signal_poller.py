"""The signals poller: scrapes each tier's /metrics every few seconds and keeps its `TierSignals`.

`SignalsPoller.load()` is what the policies' RoutingContext takes, `trace_signals()` what a trace
record carries. A server whose /metrics answers 404 or 405 (llama-cpp-python's) is `no_metrics`,
with readiness from GET /v1/models; a failed poll is logged on the state change, never raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import httpx

from backends.base import TierLoad
from backends.config import SignalsConfig, TierConfig
from backends.metrics_scrape import Scrape, parse_metrics
from backends.signal_endpoints import Endpoint, polled_endpoints
from backends.tier_signals import Status, TierSignals, derive
from trace_format.tasks import stop_tasks

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _TierState:
    signals: TierSignals
    scrape: Scrape | None = None
    scraped_at: float = 0.0  # monotonic


@dataclass(slots=True)
class SignalsPoller:
    """Polls every endpoint each `interval_s`; `load()` is what RoutingContext.load takes."""

    endpoints: list[Endpoint]
    interval_s: float = 2.0
    timeout_s: float = 1.0
    stale_after_s: float = 10.0
    client: httpx.AsyncClient | None = None
    # Wall clock of readings and of staleness (tests advance their own); intervals between two
    # scrapes, which rates are computed over, always use time.monotonic.
    clock: Callable[[], float] = time.time
    _states: dict[str, _TierState] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _own_client: bool = False

    @classmethod
    def for_tiers(cls, tiers: Sequence[TierConfig], settings: SignalsConfig) -> SignalsPoller:
        """A poller of the tiers that are ours to poll (backends.signal_endpoints)."""
        return cls(
            polled_endpoints(tiers), settings.interval_s, settings.timeout_s, settings.stale_after_s
        )

    def __post_init__(self) -> None:
        for ep in self.endpoints:
            self._states[ep.tier] = _TierState(TierSignals(tier=ep.tier))

    def _http(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=self.timeout_s)
            self._own_client = True
        return self.client

    async def poll_once(self) -> dict[str, TierSignals]:
        await asyncio.gather(*(self._poll_tier(ep) for ep in self.endpoints))
        return self.snapshot()

    async def _poll_tier(self, ep: Endpoint) -> None:
        state = self._states[ep.tier]
        try:
            new = await self._scrape_tier(ep, state)
        except Exception as exc:  # a poll must never take the router down with it
            new = replace(
                TierSignals(tier=ep.tier),
                status="error",
                time=self.clock(),
                detail=f"{type(exc).__name__}: {exc}",
            )
        if new.status != state.signals.status:
            _log_transition(ep, state.signals.status, new)
        state.signals = new

    async def _scrape_tier(self, ep: Endpoint, state: _TierState) -> TierSignals:
        now, mono = self.clock(), time.monotonic()
        resp = await self._get(ep.metrics_url) if ep.metrics_url else None
        if isinstance(resp, httpx.Response) and resp.status_code == 200:
            cur = parse_metrics(resp.text)
            signals = derive(
                ep.tier,
                cur,
                state.scrape,
                mono - state.scraped_at,
                last=state.signals if state.scrape else None,
                now=now,
            )
            state.scrape, state.scraped_at = cur, mono
            return signals
        ready, why = await self._ready(ep)
        if isinstance(resp, str):  # the metrics request itself failed
            return TierSignals(ep.tier, "unreachable", ready, now, detail=resp)
        if resp is not None and resp.status_code not in (404, 405):
            return TierSignals(
                ep.tier, "error", ready, now, detail=f"/metrics answered {resp.status_code}"
            )
        if not ready:
            return TierSignals(ep.tier, "unreachable", False, now, detail=why)
        why = "no Prometheus /metrics; readiness from /v1/models only"
        return TierSignals(ep.tier, "no_metrics", True, now, detail=why)

    async def _get(self, url: str) -> httpx.Response | str:
        try:
            return await self._http().get(url)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    async def _ready(self, ep: Endpoint) -> tuple[bool, str]:
        if not ep.base_url:
            return False, "no base_url"
        resp = await self._get(f"{ep.base_url.rstrip('/')}/models")
        if isinstance(resp, str):
            return False, resp
        return resp.status_code == 200, f"GET /models answered {resp.status_code}"

    def snapshot(self) -> dict[str, TierSignals]:
        return {tier: st.signals for tier, st in self._states.items()}

    def _fresh(self) -> dict[str, TierSignals]:
        cutoff = self.clock() - self.stale_after_s
        return {t: s for t, s in self.snapshot().items() if s.status == "ok" and s.time >= cutoff}

    def load(self) -> dict[str, TierLoad]:
        """Fresh load per tier; tiers without metrics (or with stale ones) are left out."""
        return {t: s.load() for t, s in self._fresh().items()}

    def trace_signals(self) -> dict[str, dict[str, float]] | None:
        """TraceRecord.backend_signals: every polled tier, with `metrics_available` 0 or 1."""
        polled = {t: s.numeric() for t, s in self.snapshot().items() if s.status != "not_polled"}
        return polled or None

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None and self.endpoints:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="signals-poller")

    async def stop(self) -> None:
        await stop_tasks(self._task)
        self._task = None
        if self._own_client and self.client is not None:
            await self.client.aclose()
            self.client, self._own_client = None, False


def measure_now(
    endpoints: list[Endpoint], interval_s: float = 2.0, timeout_s: float = 2.0
) -> dict[str, TierSignals]:
    """Two polls `interval_s` apart (rates need two), for CLIs; not for use inside an event loop."""
    poller = SignalsPoller(endpoints, interval_s=interval_s, timeout_s=timeout_s)

    async def twice() -> dict[str, TierSignals]:
        try:
            await poller.poll_once()
            await asyncio.sleep(interval_s)
            return await poller.poll_once()
        finally:
            await poller.stop()

    return asyncio.run(twice())


def _log_transition(ep: Endpoint, old: Status, new: TierSignals) -> None:
    if new.status == "ok":
        log.info("tier %s: metrics available at %s", ep.tier, ep.metrics_url)
    elif new.status == "no_metrics":
        log.warning(
            "tier %s: %s has no Prometheus metrics; routing without its load signals "
            "(readiness from /v1/models)",
            ep.tier,
            ep.metrics_url,
        )
    else:
        log.warning("tier %s: signals %s (was %s): %s", ep.tier, new.status, old, new.detail)
