"""Property tests of the request schema against the running proxy: any JSON gets a 2xx or an
OpenAI-style 4xx, never a 500; any body valid by the schema is answered 200."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.echo_upstream import running_echo_upstream
from policies.budgets.estimate import choices_requested, requested_max_tokens
from router.http.schemas import validate_body
from tests.support.proxy import ProxyThread, make_config, tier

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
roles = st.sampled_from(["system", "user", "assistant", "developer"])
message = st.fixed_dictionaries({"role": roles, "content": st.text(max_size=200)})
valid_chat = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["auto", "small", "router:balanced"]),
        "messages": st.lists(message, min_size=1, max_size=4),
    },
    optional={
        "max_tokens": st.integers(min_value=1, max_value=4096),
        "temperature": st.floats(min_value=0, max_value=2),
        "top_p": st.floats(min_value=0, max_value=1),
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3),
        "user": st.text(max_size=20),
        "seed": st.integers(min_value=0, max_value=2**31),
        "stream": st.just(False),
    },
)
# Near-valid bodies: one valid key replaced by an arbitrary JSON value.
mutated = st.tuples(
    valid_chat,
    st.sampled_from(["model", "messages", "max_tokens", "stream", "temperature", "stop"]),
    json_values,
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    with running_echo_upstream() as echo:
        config = make_config([tier("small", echo)], tmp_path_factory.mktemp("t"))
        with ProxyThread(config) as p:
            yield p


@pytest.fixture(scope="module")
def http(proxy: ProxyThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        yield client


def _post(http: httpx.Client, body: Any) -> httpx.Response:
    # stdlib json: it writes integers of any size (and NaN-free floats), like a real client.
    return http.post(
        "/v1/chat/completions",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
    )


def _assert_openai_error(r: httpx.Response) -> None:
    assert r.status_code in (400, 404, 413), (r.status_code, r.text)
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["type"] and err["code"]


@FUZZ
@given(body=json_values)
def test_arbitrary_json_never_500(http: httpx.Client, body: Any) -> None:
    r = _post(http, body)
    if r.status_code != 200:
        _assert_openai_error(r)


@FUZZ
@given(body=valid_chat)
def test_valid_bodies_are_answered(http: httpx.Client, body: dict[str, Any]) -> None:
    r = _post(http, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"]


@FUZZ
@given(case=mutated)
def test_mutated_bodies_answered_or_rejected_cleanly(
    http: httpx.Client, case: tuple[dict[str, Any], str, Any]
) -> None:
    body, key, value = case
    r = _post(http, {**body, key: value})
    if r.status_code != 200:
        _assert_openai_error(r)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_never_500(http: httpx.Client, raw: bytes) -> None:
    r = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    if r.status_code != 200:
        _assert_openai_error(r)


@settings(max_examples=100, deadline=None)
@given(
    tokens=st.integers(min_value=1, max_value=2**31 - 1),
    n=st.integers(min_value=1, max_value=128),
    ids=st.lists(st.integers(min_value=0, max_value=2**31 - 1), min_size=1, max_size=5),
)
def test_whole_floats_are_the_integers_the_budget_reads(
    tokens: int, n: int, ids: list[int]
) -> None:
    """JSON Schema (and so the published schema) calls 8.0 an integer: the proxy takes it, and
    forwards the integer, so the reservation (policies/budgets/estimate.py, which reads ints
    only) and the upstream read the same bound, not "no bound" and 8."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    body = {**chat, "max_completion_tokens": float(tokens), "n": float(n)}
    validate_body("chat/completions", body)
    assert type(body["max_completion_tokens"]) is int and type(body["n"]) is int
    assert requested_max_tokens(body) == tokens and choices_requested(body) == n
    completion = {"model": "m", "prompt": [[float(i) for i in ids]], "best_of": float(n)}
    validate_body("completions", completion)
    assert completion["prompt"] == [ids] and all(type(i) is int for i in completion["prompt"][0])
    assert choices_requested(completion) == n


def test_trace_file_lines_validate(proxy: ProxyThread) -> None:
    from trace_format.schema import TraceRecord

    for record in proxy.traces(1):
        TraceRecord.model_validate(record)
    assert Path(proxy.config.traces.path or "").exists()
