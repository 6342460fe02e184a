"""The fault upstream (benchmarks/fault_upstream.py) misbehaves exactly as documented, so that the
tests built on it test the proxy, not the harness. Talks to the real server over HTTP."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from benchmarks.fault_upstream import (
    CACHED_EXTRA,
    FAULTS,
    HUGE_TOKENS,
    INTERNAL_HOST,
    INTERNAL_IP,
    NEGATIVE_TOKENS,
    SECRET,
    STREAM_ONLY,
    TRACEBACK_MARK,
    FaultMix,
    running_fault_upstream,
)

HANG_S = 1.0


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_fault_upstream("--hang-s", str(HANG_S), "--huge-mb", "1") as url:
        yield url


def chat(fault: str, stream: bool = False, **metadata: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "two words"}],
        "metadata": {"fault": fault, **metadata},
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def events(raw: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]


def usage_of(raw: bytes) -> Any:
    return [orjson.loads(e) for e in events(raw) if e != b"[DONE]"][-1]["usage"]


@pytest.mark.parametrize("stream", [False, True])
def test_usage_faults(upstream: str, stream: bool) -> None:
    def usage(fault: str) -> Any:
        r = httpx.post(upstream + "/chat/completions", json=chat(fault, stream), timeout=10)
        assert r.status_code == 200
        return usage_of(r.content) if stream else r.json()["usage"]

    normal = usage("none")
    assert {k: normal[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": 2,
        "completion_tokens": 8,
        "total_tokens": 10,
    }
    assert normal["prompt_tokens_details"] == {"cached_tokens": 0}  # shorter than a cache block
    assert usage("huge_usage")["completion_tokens"] == HUGE_TOKENS
    negative = usage("negative_usage")
    assert negative["prompt_tokens"] == negative["completion_tokens"] == NEGATIVE_TOKENS
    assert usage("nonnumeric_usage")["prompt_tokens"] == "abc"
    over = usage("cached_over_prompt")
    assert over["prompt_tokens_details"]["cached_tokens"] == over["prompt_tokens"] + CACHED_EXTRA
    assert usage("negative_cached")["prompt_tokens_details"]["cached_tokens"] == NEGATIVE_TOKENS
    assert isinstance(usage("details_string")["prompt_tokens_details"], str)
    assert usage("details_list")["prompt_tokens_details"] == [2]


@pytest.mark.parametrize("stream", [False, True])
def test_error_faults_carry_internals(upstream: str, stream: bool) -> None:
    r = httpx.post(upstream + "/chat/completions", json=chat("error_500", stream), timeout=10)
    assert r.status_code == 500
    assert TRACEBACK_MARK in r.text and INTERNAL_HOST in r.text and INTERNAL_IP in r.text
    r = httpx.post(
        upstream + "/chat/completions", json=chat("error_4xx_secret", stream), timeout=10
    )
    assert r.status_code == 400 and SECRET in r.json()["error"]["message"]


def test_hang_outlasts_a_shorter_timeout_then_answers(upstream: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(upstream + "/chat/completions", json=chat("hang"), timeout=HANG_S / 4)
    t0 = time.monotonic()
    r = httpx.post(upstream + "/chat/completions", json=chat("hang"), timeout=10)
    assert r.status_code == 200 and time.monotonic() - t0 >= HANG_S


def test_stream_faults(upstream: str) -> None:
    def post(fault: str, **metadata: str) -> httpx.Response:
        return httpx.post(
            upstream + "/chat/completions", json=chat(fault, True, **metadata), timeout=10
        )

    with pytest.raises(httpx.RemoteProtocolError):  # the connection closes mid-body
        post("stream_cut")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            upstream + "/chat/completions", json=chat("stream_stall", True), timeout=HANG_S / 4
        )
    raw = post("stream_no_done").content
    assert b"[DONE]" not in raw and usage_of(raw)["completion_tokens"] == 8
    raw = post("stream_bad_usage").content
    assert events(raw)[-1] == b"[DONE]"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(events(raw)[-2])
    raw = post("stream_huge_no_usage", fault_mb="3").content
    assert len(raw) >= 3_000_000 and b'"usage"' not in raw and events(raw)[-1] == b"[DONE]"


def test_stream_only_faults_answer_a_plain_request_normally(upstream: str) -> None:
    for fault in STREAM_ONLY:
        r = httpx.post(upstream + "/chat/completions", json=chat(fault), timeout=10)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


def test_unknown_fault_is_a_400(upstream: str) -> None:
    r = httpx.post(upstream + "/chat/completions", json=chat("no_such_fault"), timeout=10)
    assert r.status_code == 400 and "no_such_fault" in r.json()["error"]["message"]


def test_seeded_mix_is_deterministic_and_near_its_rate() -> None:
    bodies = [
        {"messages": [{"role": "user", "content": f"q{i}"}], "stream": i % 2 == 0}
        for i in range(2000)
    ]
    mix = FaultMix(rate=0.2, seed=7)
    drawn = [mix.choose(b) for b in bodies]
    assert drawn == [FaultMix(rate=0.2, seed=7).choose(b) for b in reversed(bodies)][::-1]
    assert drawn != [FaultMix(rate=0.2, seed=8).choose(b) for b in bodies]
    counts = Counter(drawn)
    assert 0.17 < 1 - counts["none"] / len(bodies) < 0.23
    assert set(counts) == {"none", *FAULTS}
    assert not any(f in STREAM_ONLY for f, b in zip(drawn, bodies, strict=True) if not b["stream"])


def test_stats_count_answers_per_fault() -> None:
    with running_fault_upstream("--fault-rate", "1", "--faults", "huge_usage") as url:
        for _ in range(3):
            httpx.post(url + "/chat/completions", json={"model": "m", "messages": []}, timeout=10)
        stats = httpx.get(url.removesuffix("/v1") + "/stats", timeout=10).json()
    assert stats["faults"] == {"huge_usage": 3}
