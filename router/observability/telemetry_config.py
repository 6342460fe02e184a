"""The `telemetry:` section (OpenTelemetry tracing, router/observability/telemetry.py) and what the
request path knows of a tracer. Kept apart from router/observability/telemetry.py so that loading a
config, and the proxy with tracing off, never imports OpenTelemetry (the optional `otel` extra)."""

from __future__ import annotations

import importlib.util
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
