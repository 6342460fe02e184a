"""OpenTelemetry tracing (router/observability/telemetry.py) on the real proxy: the spans of a
request checked with the SDK's InMemorySpanExporter, their export over OTLP/HTTP to a real (local)
receiver that parses the protobuf, sampling, and that with tracing off the tracing SDK is not even
imported."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from benchmarks.echo_upstream import running_echo_upstream
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.waiting import wait_for

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{CALLER_TRACE}-b7ad6b7169203331-01"


class Receiver:
    """A minimal OTLP/HTTP collector: keeps every ExportTraceServiceRequest POSTed to it."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/v1/traces":
                    received.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def span_names(self) -> list[str]:
        return [
            s.name
            for r in self.requests
            for rs in r.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


def traced_proxy(
    upstream: str, tmp: Path, receiver: Receiver, poor: bool = False, **telemetry: Any
) -> ProxyThread:
    """poor: callers without a key are the team whose budget fits no request."""
    config = make_config(
        [tier("small", upstream), tier("large", upstream, price=(10, 30))],
        tmp,
        default_policy="fixed",
        policies={"fixed": {"type": "fixed", "tier": "small"}},
        teams={"poor": {"budget": {"limit_usd": 0.000001, "period": "daily"}}},
        embeddings={"tier": "small"},
        auth={"default_team": "poor"} if poor else {},
        telemetry={
            "enabled": True,
            "endpoint": receiver.url,
            "service_name": "router-test",
            **telemetry,
        },
    )
    return ProxyThread(config)


def memory(proxy: ProxyThread) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    proxy.state.telemetry.provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def test_a_request_is_one_server_span_with_genai_children(upstream: str, tmp_path: Path) -> None:
    with Receiver() as receiver:
        with traced_proxy(upstream, tmp_path, receiver) as proxy:
            spans = memory(proxy)
            client = openai.OpenAI(
                base_url=f"{proxy.url}/v1",
                api_key="x",
                max_retries=0,
                default_headers={"traceparent": TRACEPARENT},
            )
            client.chat.completions.create(
                model="auto",
                max_tokens=16,
                temperature=0.5,
                messages=[{"role": "user", "content": "hi there"}],
            )
            wait_for(lambda: len(spans.get_finished_spans()) >= 5, 5, "the request's spans")
            got = by_name(spans.get_finished_spans())
            root = got["chat auto"]
            assert root.kind == SpanKind.SERVER and root.parent is not None
            assert format(root.context.trace_id, "032x") == CALLER_TRACE  # the caller's trace
            a = root.attributes or {}
            assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "auto"
            assert a["gen_ai.response.model"] == "echo" and a["router.tier"] == "small"
            assert a["router.policy"] == "fixed" and a["router.team"] == "default"
            assert a["gen_ai.usage.input_tokens"] == 2 and a["gen_ai.usage.output_tokens"] == 8
            assert a["router.cost_usd"] > 0 and a["gen_ai.request.max_tokens"] == 16
            assert a["gen_ai.request.temperature"] == 0.5
            assert a["http.response.status_code"] == 200
            upstream_span = got["chat small-model"]
            assert upstream_span.kind == SpanKind.CLIENT
            u = upstream_span.attributes or {}
            assert u["gen_ai.provider.name"] == "openai" and u["server.address"] == "127.0.0.1"
            assert u["gen_ai.request.model"] == "small-model"
            for name in (
                "router.route",
                "router.budget.reserve",
                "chat small-model",
                "router.budget.settle",
            ):
                span = got[name]
                assert span.parent is not None and span.parent.span_id == root.context.span_id
                assert root.start_time <= span.start_time <= span.end_time <= root.end_time
            order = [
                got[n].start_time
                for n in (
                    "router.route",
                    "router.budget.reserve",
                    "chat small-model",
                    "router.budget.settle",
                )
            ]
            assert order == sorted(order)
            # A stream: the upstream span lasts until the stream's end, usage included.
            spans.clear()
            stream = client.chat.completions.create(
                model="auto", stream=True, messages=[{"role": "user", "content": "one two"}]
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            wait_for(lambda: len(spans.get_finished_spans()) >= 5, 5, "the stream's spans")
            streamed = by_name(spans.get_finished_spans())["chat auto"].attributes or {}
            assert streamed["router.stream"] is True
            assert streamed["gen_ai.usage.output_tokens"] == 8
            # Embeddings: no routing step, the operation named as the conventions name it.
            spans.clear()
            client.embeddings.create(model="e5", input="a b")
            wait_for(lambda: len(spans.get_finished_spans()) >= 4, 5, "the embedding's spans")
            embedded = by_name(spans.get_finished_spans())
            assert "router.route" not in embedded and "embeddings small-model" in embedded
            e = embedded["embeddings e5"].attributes or {}
            assert e["gen_ai.operation.name"] == "embeddings"
            assert (e["gen_ai.usage.input_tokens"], e["gen_ai.usage.output_tokens"]) == (2, 0)
            # The upstream fails: its span and the request's are errors.
            spans.clear()
            failed = httpx.post(
                f"{proxy.url}/v1/chat/completions",
                timeout=10,
                json={
                    "model": "auto",
                    "messages": [{"role": "user", "content": "x"}],
                    "echo": {"fail_status": 500},
                },
            )
            assert failed.status_code == 502
            wait_for(lambda: len(spans.get_finished_spans()) >= 5, 5, "the failure's spans")
            broken = by_name(spans.get_finished_spans())
            assert broken["chat small-model"].status.status_code == StatusCode.ERROR
            assert (broken["chat auto"].attributes or {})["error.type"] == "upstream_error"
        # The proxy's shutdown flushed its batch to the OTLP receiver.
        assert receiver.span_names().count("chat auto") == 3
        assert receiver.span_names().count("embeddings e5") == 1
        resource = receiver.requests[0].resource_spans[0].resource.attributes
        assert {(kv.key, kv.value.string_value) for kv in resource} >= {
            ("service.name", "router-test")
        }


def test_a_refused_request_is_an_error_span_without_an_upstream_call(
    upstream: str, tmp_path: Path
) -> None:
    with Receiver() as receiver, traced_proxy(upstream, tmp_path, receiver, poor=True) as proxy:
        spans = memory(proxy)
        resp = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            timeout=10,
            json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert resp.status_code == 429
        wait_for(lambda: spans.get_finished_spans(), 5, "the refusal's span")
        got = by_name(spans.get_finished_spans())
        root = got["chat auto"]
        assert root.status.status_code == StatusCode.ERROR
        assert (root.attributes or {})["error.type"] == "budget_exceeded"
        assert "router.budget.reserve" in got and "chat small-model" not in got


def test_sampling_keeps_a_callers_sampled_trace(upstream: str, tmp_path: Path) -> None:
    with (
        Receiver() as receiver,
        traced_proxy(upstream, tmp_path, receiver, sample_ratio=0.0) as proxy,
    ):
        spans = memory(proxy)
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{proxy.url}/v1/chat/completions", json=body).status_code == 200
        assert (
            httpx.post(
                f"{proxy.url}/v1/chat/completions", json=body, headers={"traceparent": TRACEPARENT}
            ).status_code
            == 200
        )
        proxy.traces(2)  # both finished (the trace record is written after the spans)
        roots = [s for s in spans.get_finished_spans() if s.name == "chat auto"]
        assert [format(s.context.trace_id, "032x") for s in roots] == [CALLER_TRACE]


def test_with_tracing_off_our_tracing_is_not_imported(tmp_path: Path) -> None:
    # A fresh interpreter: this one has imported OpenTelemetry for the tests above.
    code = f"""
import asyncio, sys
from router.proxy.build import build_state, stop_state
from tests.support.proxy import make_config, tier
from pathlib import Path
state = build_state(make_config([tier("small", "http://127.0.0.1:9/v1")], Path({str(tmp_path)!r})))
assert state.telemetry is None
asyncio.run(stop_state(state))
# redis-py imports the OpenTelemetry API (and metrics SDK) itself when they are installed; ours,
# the tracing SDK and the exporters, stay out.
ours = ("opentelemetry.sdk.trace", "opentelemetry.exporter")
ours_too = "router.observability.telemetry"
loaded = sorted(m for m in sys.modules if m == ours_too or m.startswith(ours))
assert not loaded, loaded
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
