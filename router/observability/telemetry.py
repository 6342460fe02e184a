"""OpenTelemetry tracing of requests (the optional `otel` extra), exported over OTLP.

One SERVER span per request, named like OpenTelemetry's GenAI conventions (`chat auto`), with
children for the routing decision (`router.route`), the budget reservation
(`router.budget.reserve`), the upstream call (a CLIENT span, `chat <upstream model>`) and the
settle (`router.budget.settle`). Attributes: the GenAI ones (`gen_ai.operation.name`,
`gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.usage.input_tokens`/`output_tokens`,
`gen_ai.provider.name`) and the router's (`router.tier`, `router.policy`, `router.score`,
`router.team`, `router.cost_usd`, ...).

The spans are built after the response has left, in the request's finish() work, from the
timestamps the request path noted on its `Call` (only while tracing is on): the hot path itself
creates no span objects and holds no context. A caller's W3C `traceparent` makes the request a
child of the caller's trace.

Only router/proxy/build.py imports this module, and only when `telemetry.enabled` is set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from backends.config import TierConfig
from router.observability.telemetry_config import Marks, TelemetryConfig

log = logging.getLogger(__name__)

# Our endpoint -> gen_ai.operation.name (OpenTelemetry GenAI semantic conventions).
OPERATIONS = {
    "chat/completions": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "responses": "chat",
}
PROPAGATOR = TraceContextTextMapPropagator()


def otlp_exporter(config: TelemetryConfig) -> SpanExporter:
    """The OTLP exporter of the configured transport (imported only for that one)."""
    kwargs: dict[str, Any] = {"headers": config.headers or None}
    if config.endpoint:
        kwargs["endpoint"] = config.endpoint
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # grpc: optional
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(**kwargs)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(**kwargs)


class Telemetry:
    """A tracer provider of its own (never the process-global one, so an embedding app's tracing
    and ours do not mix) with the OTLP exporter behind a batch processor, or, for tests,
    `exporter` behind a synchronous one."""

    def __init__(self, config: TelemetryConfig, exporter: SpanExporter | None = None) -> None:
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        )
        if exporter is None:
            self.provider.add_span_processor(BatchSpanProcessor(otlp_exporter(config)))
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("cost_router")

    def shutdown(self) -> None:
        self.provider.shutdown()  # flushes what the batch processor still holds

    def record(self, call: Any, tier: TierConfig | None) -> None:
        """The spans of one finished request (`call`: router.proxy.request_path.Call), `tier` the
        one that answered (or was chosen)."""
        try:
            self._record(call, tier)
        except Exception:  # noqa: BLE001 - tracing must never break a request's finish()
            log.exception("could not record the spans of request %s", call.id)

    def _record(self, call: Any, tier: TierConfig | None) -> None:
        marks: Marks = call.marks

        def wall_ns(perf: float) -> int:
            return int((call.time + (perf - call.started)) * 1e9)

        op = OPERATIONS.get(call.endpoint, call.endpoint)
        parent = PROPAGATOR.extract(call.trace_parent) if call.trace_parent else None
        root = self.tracer.start_span(
            f"{op} {call.requested_model or ''}".strip(),
            context=parent,
            kind=SpanKind.SERVER,
            start_time=int(call.time * 1e9),
            attributes=_request_attributes(call, op),
        )
        if not root.is_recording():  # not sampled: nothing more to build
            root.end()
            return
        ctx = set_span_in_context(root)
        route: dict[str, Any] = {"router.policy": call.policy, "router.reason": call.reason}
        if call.score is not None:
            route["router.score"] = call.score
        self._child(ctx, "router.route", marks, "route", wall_ns, route)
        self._child(
            ctx,
            "router.budget.reserve",
            marks,
            "budget",
            wall_ns,
            {
                "router.reserved_usd": call.reserved_nanos / 1e9,
                "router.downgraded": call.downgraded,
            },
        )
        if tier is not None:
            upstream = _upstream_attributes(call, op, tier)
            # The upstream's fault: a 5xx, or a call that never ended (cut by a failure).
            ended = marks.span("upstream")[1] is not None
            failed = call.error if call.status >= 500 or not ended else None
            self._child(
                ctx,
                f"{op} {tier.model}",
                marks,
                "upstream",
                wall_ns,
                upstream,
                SpanKind.CLIENT,
                error=failed,
            )
        self._child(
            ctx,
            "router.budget.settle",
            marks,
            "settle",
            wall_ns,
            {"router.cost_usd": call.cost_usd or 0.0},
        )
        if call.error:
            root.set_attribute("error.type", call.error)
            root.set_status(Status(StatusCode.ERROR, call.error))
        root.end(end_time=time.time_ns())

    def _child(
        self,
        ctx: Context,
        name: str,
        marks: Marks,
        step: str,
        wall_ns: Callable[[float], int],
        attributes: dict[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
        error: str | None = None,
    ) -> None:
        start, end = marks.span(step)
        if start is None:
            return  # the request never got to this step
        span = self.tracer.start_span(
            name, context=ctx, kind=kind, start_time=wall_ns(start), attributes=attributes
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=wall_ns(end) if end is not None else time.time_ns())


def _usage(call: Any) -> dict[str, Any]:
    if call.usage is None:
        return {}
    return {
        "gen_ai.usage.input_tokens": call.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": call.usage.completion_tokens,
    }


def _request_attributes(call: Any, op: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "router.request_id": call.id,
        # The client's API (messages, responses) when it ran as a chat request (router/apis/).
        "router.endpoint": call.api.name
        if getattr(call, "api", None) is not None
        else call.endpoint,
        "router.stream": call.stream,
        "http.response.status_code": call.status,
        **_usage(call),
    }
    optional = {
        "gen_ai.request.model": call.requested_model,
        "gen_ai.response.model": call.model,
        "router.tier": call.tier,
        "router.policy": call.policy or None,
        "router.score": call.score,
        "router.cost_usd": call.cost_usd,
        "router.team": call.identity.team if call.identity else None,
        "router.key_id": call.identity.key_id if call.identity else None,
        "router.experiment": call.selection.experiment if call.selection else None,
        "router.arm": call.selection.arm if call.selection else None,
        "router.upstream_endpoint": getattr(call, "upstream_endpoint", None),
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    body = call.body or {}
    for field, key in (
        ("max_tokens", "gen_ai.request.max_tokens"),
        ("temperature", "gen_ai.request.temperature"),
    ):
        value = body.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[key] = value
    return attrs


def _upstream_attributes(call: Any, op: str, tier: TierConfig) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "gen_ai.provider.name": tier.kind,
        "gen_ai.request.model": tier.model,
        "router.tier": tier.name,
        "router.tiers_tried": ",".join(call.tiers_tried),
        **_usage(call),
    }
    if call.model:
        attrs["gen_ai.response.model"] = call.model
    if call.deployment:  # the tier lists several servers: the one that answered
        attrs["router.deployment"] = call.deployment
    if tier.base_url:
        parts = urlsplit(tier.base_url)
        if parts.hostname:
            attrs["server.address"] = parts.hostname
        if parts.port:
            attrs["server.port"] = parts.port
    return attrs
