"""The `telemetry:` section (OpenTelemetry tracing, router/observability/telemetry.py) and what the
request path knows of a tracer. Kept apart from router/observability/telemetry.py so that loading a
config, and the proxy with tracing off, never imports OpenTelemetry (the optional `otel` extra)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import Field

from trace_format.config_base import StrictModel


class TelemetryConfig(StrictModel):
    enabled: bool = Field(
        default=False,
        description="export a span per request (OpenTelemetry GenAI conventions) over OTLP; "
        "needs the `otel` extra. Off: nothing is imported and requests do no tracing work",
    )
    endpoint: str | None = Field(
        default=None,
        description="the OTLP collector, e.g. http://127.0.0.1:4318/v1/traces (http/protobuf) "
        "or http://127.0.0.1:4317 (grpc); None = OpenTelemetry's own default and "
        "OTEL_EXPORTER_OTLP_* environment variables",
    )
    protocol: Literal["http/protobuf", "grpc"] = Field(
        default="http/protobuf",
        description="OTLP transport (grpc needs "
        "opentelemetry-exporter-otlp-proto-grpc, part of opentelemetry-exporter-otlp)",
    )
    service_name: str = Field(
        default="cost-router", min_length=1, description="the service.name resource attribute"
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="share of requests traced (a caller's sampled traceparent always is)",
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="extra headers to the collector (e.g. an API key)"
    )


EXPORTERS = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc",
}


def missing_packages(config: TelemetryConfig) -> str | None:
    """What tracing as configured needs and is not installed (None: nothing), found without
    importing OpenTelemetry, so `config check` can say it before a proxy starts."""
    if not config.enabled:
        return None
    for module in ("opentelemetry.sdk", EXPORTERS[config.protocol]):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            return module
    return None


class Marks:
    """Where a request's steps (route, budget, upstream, settle) started and ended, for the
    spans router/observability/telemetry.py builds after the response. This base notes nothing:
    every request that is not traced shares one (NO_MARKS), so with tracing off a step costs a
    call that returns at once, and no request allocates anything for it."""

    __slots__ = ()

    def start(self, step: str) -> None:
        """`step` starts now; a step started again (the next tier of a fallback) keeps its
        first start, so its span covers every try."""

    def end(self, step: str, then: str | None = None) -> None:
        """`step` ends now (its last end counts); `then`: the step that starts at that moment."""

    def span(self, step: str) -> tuple[float | None, float | None]:
        """The step's (start, end), perf_counter; None where it never started or ended."""
        return None, None


NO_MARKS = Marks()


class StepMarks(Marks):
    """The marks of a traced request."""

    __slots__ = ("started", "ended")

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}

    def start(self, step: str) -> None:
        self.started.setdefault(step, time.perf_counter())

    def end(self, step: str, then: str | None = None) -> None:
        now = self.ended[step] = time.perf_counter()
        if then is not None:
            self.started.setdefault(then, now)

    def span(self, step: str) -> tuple[float | None, float | None]:
        return self.started.get(step), self.ended.get(step)


class CallTracer(Protocol):
    """What the request path calls (router/observability/telemetry.py's Telemetry): one finished
    request."""

    def record(self, call: Any, tier: Any) -> None: ...

    def shutdown(self) -> None: ...


TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context


def caller_trace(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The caller's W3C trace context headers, if it sent any (its trace is the parent)."""
    found = {h: v for h in TRACE_HEADERS if (v := headers.get(h))}
    return found or None
