"""POST /v1/messages in the proxy's OpenTelemetry spans and Prometheus metrics: the request's
server span names the client's API and what the tier was sent; /metrics counts it per API."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from tests.router.observability.test_telemetry import Receiver, memory, traced_proxy
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


def test_a_messages_request_is_traced_and_counted(upstream: str, tmp_path: Path) -> None:
    with Receiver() as receiver, traced_proxy(upstream, tmp_path, receiver) as proxy:
        spans = memory(proxy)
        client = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
        message = client.messages.create(
            model="auto", max_tokens=16, messages=[{"role": "user", "content": "hi there"}]
        )
        assert message.content
        wait_for(lambda: len(spans.get_finished_spans()) >= 5, 5, "the request's spans")
        (root,) = [s for s in spans.get_finished_spans() if s.name == "chat auto"]
        a = root.attributes or {}
        assert a["router.endpoint"] == "messages"
        assert a["router.upstream_endpoint"] == "chat/completions"
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.usage.output_tokens"] == 8
        names = {s.name for s in spans.get_finished_spans()}
        assert {"router.route", "router.budget.reserve", "router.budget.settle"} <= names

        def counted() -> bool:
            text = httpx.get(proxy.url + "/metrics").text
            pattern = (
                r'^cost_router_api_requests_total\{api="messages",status="200",'
                r'upstream="chat/completions"\} 1\.0$'
            )
            return re.search(pattern, text, re.M) is not None

        wait_for(counted, 5, "cost_router_api_requests_total for the request")
