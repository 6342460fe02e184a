"""The router's own token count (issue 16): the same request is counted the same way streaming
and not, and usage the router counted itself is marked as an estimate in the answer's `usage`
(`x_router_estimated`) and the trace (`usage_estimated`). The real proxy in front of the
fault-injecting upstream, driven by the official openai client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from benchmarks.fault_upstream import running_fault_upstream
from tests.support.proxy import ProxyThread, make_config, tier

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Prove that sqrt(2) is irrational, in one line."},
]


def ask(client: openai.OpenAI, fault: str, stream: bool) -> dict[str, Any]:
    """The `usage` object the client got, as a dict (unknown fields included)."""
    kw: dict[str, Any] = {
        "model": "auto",
        "messages": MESSAGES,
        "max_tokens": 20,
        "metadata": {"fault": fault},
    }
    if not stream:
        return client.chat.completions.create(**kw).usage.model_dump()  # type: ignore[union-attr]
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1
    return usage[0].model_dump()


def test_own_counts_agree_streaming_or_not_and_are_marked(tmp_path: Path) -> None:
    with running_fault_upstream() as upstream:
        cfg = make_config([tier("small", upstream)], tmp_path)
        with ProxyThread(cfg) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
            # The upstream's usage is not a count either way: the router counts for itself.
            plain = ask(client, "nonnumeric_usage", stream=False)
            streamed = ask(client, "nonnumeric_usage", stream=True)
            reported = ask(client, "none", stream=False)
            reported_stream = ask(client, "none", stream=True)
            traces = proxy.traces(expect=4)
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [plain[k] for k in counts] == [streamed[k] for k in counts]
    assert plain["prompt_tokens"] > 0 and plain["completion_tokens"] > 0
    assert plain["x_router_estimated"] is True and streamed["x_router_estimated"] is True
    assert "x_router_estimated" not in reported and "x_router_estimated" not in reported_stream
    traces.sort(key=lambda t: t["time"])  # the order the requests were made in
    assert [t.get("usage_estimated") for t in traces] == [True, True, None, None]
    assert [t["prompt_tokens"] for t in traces[:2]] == [plain["prompt_tokens"]] * 2
