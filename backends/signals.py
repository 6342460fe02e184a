"""Live backend signals: poll each tier's Prometheus /metrics, derive load and spec acceptance.

vLLM exposes gauges (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`) and monotonically growing counters/histograms. Rates need two polls:
the acceptance rate is (accepted tokens added) / (draft tokens added) between consecutive polls,
the mean time to first token is (added histogram sum) / (added histogram count), and so on.

A server with no /metrics (llama-cpp-python's answers 404) is not an error: its state is
`no_metrics`, readiness comes from GET /v1/models, and the policies simply see no load for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from policies.base import TierLoad

if TYPE_CHECKING:
    from router.config import RouterConfig

log = logging.getLogger(__name__)

# Sample names as exposed (counters carry _total, histograms _sum/_count).
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current, pre-v1 name
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
# Per-output-token latency: current name first, the deprecated one second.
TPOT = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
E2E = "vllm:e2e_request_latency_seconds"

Status = Literal["ok", "no_metrics", "unreachable", "error", "not_polled"]
SNAPSHOT_VERSION = 1


class SnapshotError(ValueError):
    """A signals snapshot file that cannot be read; the message names the file."""


# --- one scrape ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scrape:
    """Values of one /metrics scrape, each summed over label sets (engines, model names)."""

    gauges: dict[str, float]
    counters: dict[str, float]  # counter and histogram _sum/_count samples, cumulative

    def gauge(self, *names: str) -> float | None:
        return next((self.gauges[n] for n in names if n in self.gauges), None)


def parse_metrics(text: str) -> Scrape:
    """Parses Prometheus exposition text (raises ValueError on malformed input)."""
    gauges: dict[str, float] = {}
    counters: dict[str, float] = {}
    kv_max: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "gauge":
                # Cache usage is a fraction per engine: the fullest engine is what limits us.
                if sample.name in KV_CACHE:
                    kv_max[sample.name] = max(kv_max.get(sample.name, 0.0), sample.value)
                else:
                    gauges[sample.name] = gauges.get(sample.name, 0.0) + sample.value
            elif family.type in ("counter", "histogram") and not sample.name.endswith("_bucket"):
                counters[sample.name] = counters.get(sample.name, 0.0) + sample.value
    gauges.update(kv_max)
    return Scrape(gauges=gauges, counters=counters)


# --- derived signals -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TierSignals:
    """What the router knows about one tier's server at one moment."""

    tier: str
    status: Status = "not_polled"
    ready: bool = False
    time: float = 0.0  # UNIX seconds of the poll
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    spec_acceptance: float | None = None  # accepted / draft tokens between the last two polls
    ttft_s: float | None = None  # mean time to first token of requests finished in the window
    tpot_s: float | None = None  # mean time per output token in the window
    e2e_s: float | None = None
    generation_tokens_per_s: float | None = None
    detail: str = ""

    def load(self) -> TierLoad:
        return TierLoad(
            running=self.running,
            waiting=self.waiting,
            kv_cache_usage=self.kv_cache_usage,
            spec_acceptance=self.spec_acceptance,
        )

    def numeric(self) -> dict[str, float]:
        """Flat numbers for traces and snapshots' consumers; absent values are left out."""
        out = {"ready": float(self.ready), "metrics_available": float(self.status == "ok")}
        for name in ("running", "waiting", "kv_cache_usage", "spec_acceptance", "ttft_s",
                     "tpot_s", "e2e_s", "generation_tokens_per_s"):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                out[name] = float(value)
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierSignals:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _delta(cur: Scrape, prev: Scrape | None, name: str) -> float | None:
    """Counter increase since the previous scrape; None when unknown or the counter was reset."""
    if prev is None or name not in cur.counters or name not in prev.counters:
        return None
    d = cur.counters[name] - prev.counters[name]
    return d if d >= 0 else None  # a decrease means the server restarted


def _mean_in_window(cur: Scrape, prev: Scrape | None, names: Iterable[str]) -> float | None:
    for name in names:
        total, count = _delta(cur, prev, f"{name}_sum"), _delta(cur, prev, f"{name}_count")
        if total is not None and count:
            return total / count
    return None


def derive(
    tier: str,
    cur: Scrape,
    prev: Scrape | None,
    elapsed_s: float,
    last: TierSignals | None = None,
    now: float | None = None,
) -> TierSignals:
    """Signals from the current scrape and the previous one (rates need both).

    Windowed values with no new events (no drafts, no finished requests) keep the last known
    value: an idle large tier still has the acceptance rate it had a moment ago.
    """
    drafted = _delta(cur, prev, DRAFT_TOKENS)
    accepted = _delta(cur, prev, ACCEPTED_TOKENS)
    acceptance = accepted / drafted if drafted and accepted is not None else None
    generated = _delta(cur, prev, GENERATION_TOKENS)
    windowed = {
        "spec_acceptance": acceptance,
        "ttft_s": _mean_in_window(cur, prev, (TTFT,)),
        "tpot_s": _mean_in_window(cur, prev, TPOT),
        "e2e_s": _mean_in_window(cur, prev, (E2E,)),
    }
    if last is not None:
        windowed = {k: v if v is not None else getattr(last, k) for k, v in windowed.items()}
    return TierSignals(
        tier=tier,
        status="ok",
        ready=True,
        time=time.time() if now is None else now,
        running=cur.gauge(RUNNING),
        waiting=cur.gauge(WAITING),
        kv_cache_usage=cur.gauge(*KV_CACHE),
        generation_tokens_per_s=generated / elapsed_s if generated is not None and elapsed_s > 0
        else None,
        **windowed,
    )


# --- snapshots (simulator feed) --------------------------------------------------------------


def save_snapshot(path: str | Path, signals: Mapping[str, TierSignals]) -> None:
    doc = {
        "version": SNAPSHOT_VERSION,
        "time": time.time(),
        "tiers": {name: s.to_dict() for name, s in signals.items()},
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def load_snapshot(path: str | Path) -> dict[str, TierSignals]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SnapshotError(f"cannot read signals snapshot {p}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{p} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tiers"), dict):
        raise SnapshotError(f"{p}: expected an object with 'tiers'")
    if doc.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"{p}: unsupported snapshot version {doc.get('version')!r}")
    try:
        tiers = doc["tiers"].items()
        return {name: TierSignals.from_dict({**s, "tier": name}) for name, s in tiers}
    except TypeError as exc:
        raise SnapshotError(f"{p}: bad tier entry: {exc}") from None


@dataclass(frozen=True, slots=True)
class MeasuredTier:
    """What the latency simulator takes from a tier's measurements (None = not measured)."""

    spec_acceptance: float | None
    ttft_s: float | None
    tpot_s: float | None


def measured_tiers(signals: Mapping[str, TierSignals]) -> dict[str, MeasuredTier]:
    """The simulator's view of a snapshot: tiers that had metrics, with what was measured."""
    return {
        name: MeasuredTier(s.spec_acceptance, s.ttft_s, s.tpot_s)
        for name, s in signals.items()
        if s.status == "ok"
    }


# --- polling ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    tier: str
    base_url: str | None  # OpenAI root (…/v1): readiness via GET {base_url}/models
    metrics_url: str | None


def metrics_url_for(base_url: str) -> str:
    """vLLM serves /metrics at the server root, next to /v1."""
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return f"{root}/metrics"


def endpoints_from_config(config: RouterConfig) -> list[Endpoint]:
    """Tiers whose server is ours to poll: those with a `metrics_url`, or a `launch` profile.

    A launched vLLM server serves /metrics next to /v1; a launched llama.cpp server has none, so
    it is polled for readiness only. Other OpenAI-compatible tiers (someone else's API) are not
    polled unless they name a metrics_url.
    """
    out = []
    for tier in config.tiers:
        if tier.kind != "openai" or not tier.base_url:
            continue
        metrics = tier.metrics_url
        if metrics is None and tier.launch is not None and tier.launch.engine == "vllm":
            metrics = metrics_url_for(tier.base_url)
        if metrics is not None or tier.launch is not None:
            out.append(Endpoint(tier.name, tier.base_url, metrics))
    return out


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
    _states: dict[str, _TierState] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _own_client: bool = False

    @classmethod
    def from_config(cls, config: RouterConfig) -> SignalsPoller:
        s = config.signals
        return cls(endpoints_from_config(config), s.interval_s, s.timeout_s, s.stale_after_s)

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
            new = replace(TierSignals(tier=ep.tier), status="error", time=time.time(),
                          detail=f"{type(exc).__name__}: {exc}")  # fmt: skip
        if new.status != state.signals.status:
            _log_transition(ep, state.signals.status, new)
        state.signals = new

    async def _scrape_tier(self, ep: Endpoint, state: _TierState) -> TierSignals:
        now, mono = time.time(), time.monotonic()
        resp = await self._get(ep.metrics_url) if ep.metrics_url else None
        if isinstance(resp, httpx.Response) and resp.status_code == 200:
            cur = parse_metrics(resp.text)
            signals = derive(ep.tier, cur, state.scrape, mono - state.scraped_at,
                             last=state.signals if state.scrape else None, now=now)  # fmt: skip
            state.scrape, state.scraped_at = cur, mono
            return signals
        ready, why = await self._ready(ep)
        if isinstance(resp, str):  # the metrics request itself failed
            return TierSignals(ep.tier, "unreachable", ready, now, detail=resp)
        if resp is not None and resp.status_code not in (404, 405):
            return TierSignals(ep.tier, "error", ready, now,
                               detail=f"/metrics answered {resp.status_code}")  # fmt: skip
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
        cutoff = time.time() - self.stale_after_s
        return {
            t: s for t, s in self.snapshot().items() if s.status == "ok" and s.time >= cutoff
        }

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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._own_client and self.client is not None:
            await self.client.aclose()
            self.client, self._own_client = None, False


def measure_now(endpoints: list[Endpoint], interval_s: float = 2.0,
                timeout_s: float = 2.0) -> dict[str, TierSignals]:  # fmt: skip
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
        log.warning("tier %s: %s has no Prometheus metrics; routing without its load signals "
                    "(readiness from /v1/models)", ep.tier, ep.metrics_url)  # fmt: skip
    else:
        log.warning("tier %s: signals %s (was %s): %s", ep.tier, new.status, old, new.detail)
