"""Shadow comparisons: after a client's answer has been sent, the same request goes to another
tier, off the request path, and a judge labels the pair.

`offer` is all the request path does: a few comparisons and a `put_nowait` on a bounded queue
(full -> dropped and counted; it never waits). A fixed number of workers take jobs from the queue:
each reserves the worst case of its call against the evaluation's daily cap (a team of its own in
the budget store, so the cap holds across replicas), calls the shadow tier without the tier's
in-flight limiter (a shadow call never takes a slot a client could get), settles what it cost,
writes the shadow record and then runs the judges. Nothing here is charged to the client's team,
and nothing here can change, fail or delay the client's answer: it was sent before `offer` ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from backends.base import Backend, UpstreamClientError, UpstreamError, Usage
from backends.config import TierConfig
from backends.usage import usage_cost
from policies.budgets.estimate import requested_max_tokens, worst_case
from policies.budgets.scopes import BudgetScope
from policies.budgets.store import BudgetExceeded, BudgetStore
from policies.config import BudgetLimit, BudgetsConfig
from policies.hashing import unit_uniform
from policies.keys import Identity
from policies.selection import Selection
from router.learning.config import SHADOW_SCOPE, EvaluationConfig
from router.learning.judges.base import Answer, Case, Judge
from router.learning.judges.registry import build_judges
from router.learning.metrics import EvaluationMetrics
from router.learning.shadow_log import ShadowLog
from trace_format.labels import LABELS_FILE, labels_path_for
from trace_format.request_text import request_text, stream_texts
from trace_format.shadow import SHADOW_SCHEMA_VERSION, shadow_path_for
from trace_format.tasks import stop_tasks

log = logging.getLogger(__name__)


class FinishedCall(Protocol):
    """What `offer` reads of a finished request (router.proxy.request_path.Call)."""

    id: str
    endpoint: str
    started: float
    status: int
    tier: str | None
    model: str | None
    usage: Usage | None
    cost_usd: float | None
    identity: Identity | None
    selection: Selection | None
    body: dict[str, Any] | None  # as sent upstream (max_tokens bounded)
    answer: Any  # the answer body, or a stream's raw content events

    @property
    def policy(self) -> str: ...


def answer_text(answer: Any) -> str:
    """The generated text of an answer body (chat or completions) or of a stream's events."""
    if isinstance(answer, list):
        return "".join(stream_texts(answer))
    if not isinstance(answer, dict):
        return ""
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message")
            if isinstance(message, dict):
                return str(message.get("content") or "")
            return str(choice.get("text") or "")
    return ""


class RateBucket:
    """At most `rate` takes per second on average, bursts up to max(1, rate)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate or 1.0)
        self.tokens = self.capacity
        self.at = time.monotonic()

    def take(self) -> bool:
        if self.rate is None:
            return True
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(slots=True)
class ShadowJob:
    request_id: str
    endpoint: str
    time: float
    team: str | None
    policy: str
    body: dict[str, Any]
    primary: dict[str, Any]  # tier, model, tokens, latency, cost
    primary_answer: Any
    shadow_tier: str


@dataclass(frozen=True)
class ShadowDeps:
    """What the shadow service works with besides its reloadable settings, built once at
    startup (none of it changes on a reload): the tiers and their backends, the budget store
    (for the cap), the budget settings that bound a reservation, the metrics registry, and the
    trace file its own files sit beside."""

    trace_path: str | None
    tiers: Mapping[str, TierConfig]
    backends: Mapping[str, Backend]
    store: BudgetStore
    registry: CollectorRegistry
    budgets: BudgetsConfig


class ShadowService:
    """Configured by the `evaluation:` section (`settings`) and the classifier's
    `context_turns`, both reloadable (`reconfigure`), over `deps`."""

    def __init__(
        self, settings: EvaluationConfig, deps: ShadowDeps, context_turns: int | None
    ) -> None:
        self.settings = settings
        self.tiers = deps.tiers
        self.backends = deps.backends
        self.store = deps.store
        self.judges: list[Judge] = build_judges(settings.judges, deps.tiers, deps.backends)
        shadow_file = (
            Path(settings.path) if settings.path else shadow_path_for(deps.trace_path or ".")
        )
        labels = (
            labels_path_for(deps.trace_path)
            if deps.trace_path
            else shadow_file.parent / LABELS_FILE
        )
        self.log = ShadowLog(shadow_file, labels)
        self.metrics = EvaluationMetrics(deps.registry)
        self.default_max_tokens = deps.budgets.default_max_tokens
        self.prompt_estimate = deps.budgets.prompt_estimate
        self.context_turns = context_turns
        self.scope = BudgetScope(
            SHADOW_SCOPE, None, BudgetLimit(limit_usd=settings.daily_cap_usd, period="daily")
        )
        self._queue: asyncio.Queue[ShadowJob] = asyncio.Queue(settings.queue_size)
        self._bucket = RateBucket(settings.rate_per_s)
        self._tasks: list[asyncio.Task[None]] = []
        self.in_flight = 0

    # --- the request path's side -------------------------------------------------------------
    def offer(self, call: FinishedCall) -> None:
        """Queue a shadow comparison of `call` if it is sampled; never waits, never raises."""
        s = self.settings
        if not s.enabled:  # turned off by a reload: the service stays, idle
            return
        if call.status != 200 or call.tier is None or call.body is None or call.usage is None:
            return
        team = call.identity.team if call.identity is not None else None
        if s.teams is not None and team not in s.teams:
            return
        if s.policies is not None and call.policy not in s.policies:
            return
        if s.sample_rate < 1 and unit_uniform(s.salt, call.id) >= s.sample_rate:
            return
        self.metrics.sampled.inc()
        target = self.counterpart(call)
        if target is None:
            self.metrics.dropped.labels("no_counterpart").inc()
            return
        if not self._bucket.take():
            self.metrics.dropped.labels("rate_limited").inc()
            return
        usage = call.usage
        primary = {
            "tier": call.tier,
            "model": call.model,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cost_usd": call.cost_usd,
            "latency_ms": round((time.perf_counter() - call.started) * 1000, 3),
        }
        job = ShadowJob(
            call.id,
            call.endpoint,
            time.time(),
            team,
            call.policy,
            call.body,
            primary,
            call.answer,
            target,
        )
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.metrics.dropped.labels("queue_full").inc()
            return
        self.metrics.queued.inc()

    def counterpart(self, call: FinishedCall) -> str | None:
        """The named shadow tier, else the policy's other end: its cheapest tier when its
        priciest answered, else its priciest. None when there is no other tier to ask."""
        if self.settings.shadow_tier is not None:
            return self.settings.shadow_tier if self.settings.shadow_tier != call.tier else None
        policy = call.selection.policy if call.selection is not None else None
        if policy is None:
            return None
        workflow = call.selection.workflow if call.selection is not None else None
        if workflow is not None:  # a workflow's answers are compared with its teacher's
            return workflow.teacher if workflow.teacher != call.tier else None
        tiers = [t for t in policy.tiers() if t in self.tiers]
        if len(tiers) < 2:
            return None
        other = tiers[0] if call.tier == tiers[-1] else tiers[-1]
        return other if other != call.tier else None

    # --- lifecycle ---------------------------------------------------------------------------
    def reconfigure(self, settings: EvaluationConfig, context_turns: int | None) -> None:
        """A reloaded `evaluation:` section (and the classifier's `context_turns`), for the
        next offers and jobs: sampling, filters, shadow tier, rate, cap, content storage,
        retention and judges. A job already queued keeps its shadow tier; one being judged
        finishes with the judges it started with. The file, the queue and the workers were
        made at start: a change of `path`, `queue_size` or `workers` needs a restart (logged).
        Raises ConfigError (nothing changed) when a judge cannot be built (its prompt file)."""
        judges = build_judges(settings.judges, self.tiers, self.backends)
        fixed = [
            k
            for k in ("path", "queue_size", "workers")
            if getattr(settings, k) != getattr(self.settings, k)
        ]
        if fixed:
            log.warning(
                "evaluation reload: changes to %s need a restart; applying the rest",
                ", ".join(f"evaluation.{k}" for k in fixed),
            )
            settings = settings.model_copy(update={k: getattr(self.settings, k) for k in fixed})
        if settings.rate_per_s != self.settings.rate_per_s:
            self._bucket = RateBucket(settings.rate_per_s)
        self.scope = BudgetScope(
            SHADOW_SCOPE, None, BudgetLimit(limit_usd=settings.daily_cap_usd, period="daily")
        )
        self.judges = judges
        self.settings = settings
        self.context_turns = context_turns

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._worker(), name=f"shadow-{i}")
            for i in range(self.settings.workers)
        ]
        self._tasks.append(loop.create_task(self._pruner(), name="shadow-prune"))

    async def stop(self) -> None:
        """Stop the workers (a call in flight is abandoned and its reservation released); jobs
        still queued are dropped and counted."""
        await stop_tasks(*self._tasks)
        self._tasks = []
        while not self._queue.empty():
            self._queue.get_nowait()
            self.metrics.queued.dec()
            self.metrics.dropped.labels("shutdown").inc()

    def idle(self) -> bool:
        """Nothing queued and nothing in flight (tests and shutdown wait on this)."""
        return self._queue.empty() and self.in_flight == 0

    async def _pruner(self) -> None:
        while True:
            retention_s = self.settings.retention_days * 86400  # read each time: reloadable
            try:
                pruned = await asyncio.to_thread(self.log.prune, retention_s)
                if pruned:
                    log.info(
                        "shadow: pruned %d records older than %s days",
                        pruned,
                        self.settings.retention_days,
                    )
            except OSError:
                log.exception("shadow: could not prune %s", self.log.path)
            await asyncio.sleep(self.settings.prune_interval_s)

    async def _worker(self) -> None:
        while True:
            job = await self._queue.get()
            self.metrics.queued.dec()
            self.in_flight += 1
            try:
                await self.run(job)
            except Exception:  # noqa: BLE001 - one bad job must not stop the worker
                log.exception("shadow comparison failed for %s", job.request_id)
            finally:
                self.in_flight -= 1

    # --- one job -----------------------------------------------------------------------------
    async def _reserve(self, reservation: str, usd: float, tokens: int) -> str | None:
        """None when reserved, else why not (the drop reason)."""
        try:
            await self.store.reserve(self.scope, reservation, usd, tokens)
        except BudgetExceeded:
            return "cap_reached"
        except Exception:  # noqa: BLE001 - store down: shadow work just stops (never fail-open)
            log.warning("shadow: budget store unavailable", exc_info=True)
            return "budget_unavailable"
        return None

    async def _settle(self, reservation: str, usd: float, tokens: int) -> None:
        try:
            await self.store.settle(reservation, usd, tokens)
        except Exception:  # noqa: BLE001 - the lease expires and frees it
            log.exception("shadow: settle failed for %s", reservation)

    async def _release(self, reservation: str) -> None:
        with contextlib.suppress(Exception):
            await self.store.release(reservation)

    def shadow_body(self, body: dict[str, Any], tier: TierConfig, endpoint: str) -> dict[str, Any]:
        """The client's request for another tier: its model, not streamed, and bounded so the
        reservation is a true upper bound."""
        out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        out["model"] = tier.model
        if requested_max_tokens(out, endpoint) is None:
            out["max_tokens"] = self.default_max_tokens
        return out

    async def run(self, job: ShadowJob) -> None:
        tier = self.tiers[job.shadow_tier]
        body = self.shadow_body(job.body, tier, job.endpoint)
        worst = worst_case(
            body, tier.price, self.default_max_tokens, self.prompt_estimate, job.endpoint
        )
        reservation = f"{job.request_id}:shadow"
        if (why := await self._reserve(reservation, worst.usd, worst.tokens)) is not None:
            self.metrics.dropped.labels(why).inc()
            return
        t0 = time.perf_counter()
        try:
            answer = await self.backends[tier.name].complete(job.endpoint, body)
        except (UpstreamError, UpstreamClientError) as exc:
            await self._release(reservation)
            log.info("shadow: tier %s failed for %s: %s", tier.name, job.request_id, exc)
            self.metrics.dropped.labels("upstream_error").inc()
            return
        except BaseException:
            await self._release(reservation)
            raise
        latency_ms = (time.perf_counter() - t0) * 1000
        usage = answer.usage
        cost = usage_cost(tier.price, usage)
        await self._settle(reservation, cost, usage.prompt_tokens + usage.completion_tokens)
        self.metrics.shadow_spend.labels(tier.name).inc(cost)
        model = answer.body.get("model")
        shadow = {
            "tier": tier.name,
            "model": model if isinstance(model, str) else tier.model,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "latency_ms": round(latency_ms, 3),
            "cost_usd": cost,
        }
        question = request_text(job.body, self.context_turns)
        primary_text, shadow_text = answer_text(job.primary_answer), answer_text(answer.body)
        record: dict[str, Any] = {
            "schema_version": SHADOW_SCHEMA_VERSION,
            "request_id": job.request_id,
            "time": job.time,
            "team": job.team,
            "policy": job.policy,
            "endpoint": job.endpoint,
            "primary": dict(job.primary),
            "shadow": shadow,
        }
        if self.settings.stores_content(job.team):
            record["prompt"] = question
            record["primary"]["text"] = primary_text
            record["shadow"]["text"] = shadow_text
        await asyncio.to_thread(self.log.append, record)
        self.metrics.completed.labels(tier.name).inc()
        case = Case(
            job.request_id,
            question,
            (Answer(job.primary["tier"], primary_text), Answer(tier.name, shadow_text)),
            body=job.body,
        )
        await self.judge(case)

    async def judge(self, case: Case) -> None:
        """Judges in order (cheapest first); the first label ends it, so a request with a
        reference answer is never also sent to the llm judge."""
        for judge in self.judges:
            bound = judge.bound_usd(case)
            reservation = f"{case.request_id}:judge:{judge.name}"
            if bound > 0 and (why := await self._reserve(reservation, bound, 0)) is not None:
                self.metrics.verdicts.labels(judge.name, why).inc()
                return
            try:
                result = await judge.judge(case)
            except BaseException:
                if bound > 0:
                    await self._release(reservation)
                raise
            if bound > 0:
                await self._settle(reservation, min(result.cost_usd, bound), 0)
            if result.cost_usd:
                self.metrics.judge_spend.labels(judge.name).inc(result.cost_usd)
            label = result.label(case.request_id, judge.name, judge.version)
            outcome = (
                "label"
                if label is not None
                else "unparseable"
                if result.unparseable
                else "error"
                if result.failed
                else "no_label"
            )
            self.metrics.verdicts.labels(judge.name, outcome).inc()
            if label is not None:
                await asyncio.to_thread(self.log.append_label, label)
                return


def build_shadow(
    settings: EvaluationConfig, deps: ShadowDeps, context_turns: int | None
) -> ShadowService | None:
    """The configured service, or None when shadow comparisons are off."""
    return ShadowService(settings, deps, context_turns) if settings.enabled else None


def reload_shadow(
    current: ShadowService | None,
    settings: EvaluationConfig,
    deps: ShadowDeps,
    context_turns: int | None,
) -> ShadowService | None:
    """The service after a config reload (called on the event loop): the running one
    reconfigured (turned off = kept, offering nothing), or a new one started when evaluation
    was off at start and is now on."""
    if current is not None:
        current.reconfigure(settings, context_turns)
        return current
    service = build_shadow(settings, deps, context_turns)
    if service is not None:
        service.start()
    return service
