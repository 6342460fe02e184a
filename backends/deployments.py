"""Several deployments (servers) of one tier: which one serves the next request, and which are out.

A tier may list `deployments` (backends/config.py `DeploymentConfig`) instead of one `base_url`;
its backend (backends/openai_http.py) asks `DeploymentSet.pick` for a server per attempt and
reports back how the attempt went. Everything here is synchronous and O(deployments): the
request path never awaits to choose, and the state is only touched from the event loop.

- Strategies: `least_outstanding` (default) takes the fewest requests in flight per unit of
  weight, plus the server's own queue (`vllm:num_requests_waiting`) when its /metrics is polled,
  ties broken by the most free KV cache and then in turn; `weighted` is smooth weighted
  round-robin (nginx's: shares follow the weights, without bursts); `round_robin` in turn.
- A deployment at its `max_inflight` is skipped.
- Passive health: `eject_after_failures` consecutive failures (timeouts, 5xx), or one failure to
  connect (nothing listens there), eject it for `cooldown_s`; when active probes run
  (backends/signal_deployments.py) it then stays out until a probe finds it healthy again.
- Active health: a failed probe takes it out at once, a healthy one brings it back.
- When every deployment is out, all of them are tried anyway (Envoy's "panic" mode): a tier whose
  servers all failed once must not stay dark for a cool-down, and a one-server tier behaves as
  before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from backends.base import TierLoad, UpstreamError
from backends.config import BalancingConfig, DeploymentConfig

log = logging.getLogger(__name__)

PROBE_FAILURES = 2  # probes in a row that fail (other than a refused connection) to take it out


class DeploymentsBusy(UpstreamError):
    """Every deployment of the tier that could serve is at its `max_inflight`: the tier is at
    capacity (the request path treats it like a full tier limiter)."""

    def __init__(self, tier: str) -> None:
        super().__init__(tier, "every deployment is at its max_inflight", public="at capacity")


@dataclass(slots=True, eq=False)
class Deployment:
    """One server of a tier and what the balancer knows about it."""

    name: str
    index: int  # position in the tier's list (the backend's server of the same index)
    base_url: str
    metrics_url: str | None
    weight: float
    max_inflight: int
    inflight: int = 0
    failures: int = 0  # consecutive
    ejected_until: float = 0.0  # monotonic; 0 = never ejected
    healthy: bool = True  # the active probes' verdict (True until they say otherwise)
    probe_failures: int = 0  # consecutive
    waiting: float | None = None  # the server's own queue, from its /metrics (None: unknown)
    running: float | None = None
    kv_cache_usage: float | None = None
    current: float = 0.0  # smooth weighted round-robin's running weight
    served: int = 0
    ejections: int = 0

    def available(self, now: float) -> bool:
        return self.healthy and now >= self.ejected_until

    def status(self, now: float) -> dict[str, object]:
        """For readiness and tests: what the balancer sees of this deployment."""
        return {
            "inflight": self.inflight,
            "available": self.available(now),
            "healthy": self.healthy,
            "ejected": now < self.ejected_until,
            "served": self.served,
            "ejections": self.ejections,
            "waiting": self.waiting,
            "kv_cache_usage": self.kv_cache_usage,
        }


def deployments_of(configs: Sequence[DeploymentConfig]) -> list[Deployment]:
    return [
        Deployment(
            name=c.name or f"d{i}",
            index=i,
            base_url=c.base_url.rstrip("/"),
            metrics_url=c.metrics_url,
            weight=c.weight,
            max_inflight=c.max_inflight,
        )
        for i, c in enumerate(configs)
    ]


class DeploymentSet:
    """The deployments of one tier, the balancing strategy and their health."""

    def __init__(
        self,
        tier: str,
        deployments: Sequence[Deployment],
        balancing: BalancingConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert deployments, "a tier lists at least one deployment (checked by the config)"
        self.tier = tier
        self.deployments = list(deployments)
        self.by_name = {d.name: d for d in self.deployments}
        self.strategy = balancing.strategy
        self.eject_after = balancing.eject_after_failures
        self.cooldown_s = balancing.cooldown_s
        # With probes, an ejected deployment returns only once one finds it healthy.
        self.probing = balancing.probe_interval_s > 0
        self.clock = clock
        self._next = 0  # rotation: where the next scan starts (ties and round_robin)
        # What policies see of the tier (RoutingContext.load), refreshed after each probe round.
        self.tier_load: TierLoad | None = None

    def pick(self, exclude: Sequence[Deployment] = ()) -> Deployment | None:
        """The deployment for the next attempt, not one of `exclude` (those tried already), or
        None when every available one is at its max_inflight or tried."""
        now = self.clock()
        ds = self.deployments
        n = len(ds)
        start = self._next
        self._next = start + 1 if start + 1 < n else 0
        best: Deployment | None = None
        best_key: tuple[float, float] = (0.0, 0.0)
        spare: Deployment | None = None  # an unavailable one with room: panic mode's choice
        any_available = False
        weighted = self.strategy == "weighted"
        total = 0.0
        for i in range(n):
            d = ds[(start + i) % n]
            if not d.available(now):
                if (
                    d.inflight < d.max_inflight
                    and d not in exclude
                    and (spare is None or d.ejected_until < spare.ejected_until)
                ):
                    spare = d  # the one out longest
                continue
            any_available = True
            if d.inflight >= d.max_inflight or d in exclude:
                continue
            if weighted:
                d.current += d.weight
                total += d.weight
                key = (-d.current, 0.0)
            elif self.strategy == "round_robin":
                key = (float(i), 0.0)
            else:
                queue = d.waiting or 0.0
                key = ((d.inflight + queue) / d.weight, d.kv_cache_usage or 0.0)
            if best is None or key < best_key:
                best, best_key = d, key
        if best is None:
            # Panic mode only when none is available at all: healthy ones that are full or
            # already failed this request mean busy (or its last error), not a dead one.
            return None if any_available else spare
        if weighted:
            best.current -= total
        return best

    def succeeded(self, d: Deployment) -> None:
        # An ejected deployment stays out even when a request it took before (or in panic
        # mode) succeeds: a server shutting down finishes its last requests, then refuses.
        d.failures = 0
        d.served += 1

    def failed(self, d: Deployment, unreachable: bool = False) -> None:
        """An attempt on `d` failed; `unreachable`: no connection could be made at all."""
        d.failures += 1
        if unreachable or d.failures >= self.eject_after:
            self.eject(d, "unreachable" if unreachable else f"{d.failures} failures in a row")

    def eject(self, d: Deployment, why: str) -> None:
        now = self.clock()
        if now < d.ejected_until:
            return  # already out (a second in-flight request failing the same way)
        d.ejected_until = now + self.cooldown_s
        d.failures = 0
        d.ejections += 1
        if self.probing:
            d.healthy = False
        log.warning(
            "tier %s: deployment %s ejected for %.1f s (%s)",
            self.tier,
            d.name,
            self.cooldown_s,
            why,
        )

    def probed(
        self, d: Deployment, healthy: bool, detail: str = "", unreachable: bool = False
    ) -> None:
        """An active probe's verdict on `d`. A refused connection takes it out at once; a slow
        or failed answer only at the second in a row (a busy single-threaded server, such as
        llama.cpp's in the middle of a generation, may miss one probe's time limit)."""
        d.probe_failures = 0 if healthy else d.probe_failures + 1
        verdict = healthy or not (unreachable or d.probe_failures >= PROBE_FAILURES)
        if verdict != d.healthy:
            if verdict:
                log.info("tier %s: deployment %s healthy again", self.tier, d.name)
            else:
                log.warning(
                    "tier %s: deployment %s failed its health probe: %s", self.tier, d.name, detail
                )
        d.healthy = verdict

    def refresh_load(self) -> None:
        """The tier's load for policies: the queue a new request would join, i.e. that of the
        least-loaded available deployment with metrics (None: none has any)."""
        now = self.clock()
        best: Deployment | None = None
        for d in self.deployments:
            if d.waiting is None or not d.available(now):
                continue
            if best is None or (d.waiting, d.kv_cache_usage or 0.0) < (
                best.waiting or 0.0,
                best.kv_cache_usage or 0.0,
            ):
                best = d
        self.tier_load = (
            None
            if best is None
            else TierLoad(
                running=best.running, waiting=best.waiting, kv_cache_usage=best.kv_cache_usage
            )
        )

    def status(self) -> dict[str, dict[str, object]]:
        now = self.clock()
        return {d.name: d.status(now) for d in self.deployments}


def balanced_sets(backends: Mapping[str, object]) -> dict[str, DeploymentSet]:
    """The deployment sets of the backends that balance several deployments, by tier."""
    return {
        tier: s
        for tier, b in backends.items()
        if isinstance(s := getattr(b, "deployments", None), DeploymentSet)
    }
