"""Every backend kind of backends/registry.py against the contract of backends/base.py.

As scikit-learn's `parametrize_with_checks` runs the same checks over every estimator, each check
here runs over every kind in `BACKENDS`, each against a real fixture of its own: `openai` talks to
the echo upstream (benchmarks/echo_upstream.py), `litellm` reaches the same server through its
`openai/<model>` provider (offline: base_url is the echo server), `replay` answers from a small
recorded trace. A kind added to the registry without a fixture in `KIND_FIXTURES` fails here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from backends.base import Backend, UpstreamClientError, UpstreamError, UpstreamResponse
from backends.config import TierConfig
from backends.registry import BACKENDS, build_backend
from benchmarks.echo_upstream import running_echo_upstream
from router.config import config_from_dict
from tests.support.ports import free_port
from trace_format.config_base import ConfigError

PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
PROMPT = "What is the capital of France?"
KEY_ENV = "COST_ROUTER_CONFORMANCE_KEY"  # litellm's OpenAI client refuses to run without a key
ENDPOINTS = ("chat/completions", "completions")


@dataclass(frozen=True)
class KindFixture:
    """A working tier of one kind, and the ways to make it fail that the kind has."""

    tier: TierConfig
    # Extra body fields the upstream answers with a 4xx (None: the kind has no such answer).
    client_error: dict[str, Any] | None
    # The same tier pointed at a closed port (None: the kind has no upstream to lose).
    unreachable: TierConfig | None
    prompt: str = PROMPT


def _tier(**fields: Any) -> TierConfig:
    return TierConfig.model_validate({"name": "large", "model": "large", "price": PRICE, **fields})


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


def _openai(echo_url: str, tmp_path: Path) -> KindFixture:
    # connect_retries 0: an unreachable upstream fails at once instead of after backoffs.
    return KindFixture(
        tier=_tier(kind="openai", base_url=echo_url),
        client_error={"echo": {"fail_status": 422}},  # echo's per-request override
        unreachable=_tier(kind="openai", base_url=_dead_url(), connect_retries=0),
    )


def _litellm(echo_url: str, tmp_path: Path) -> KindFixture:
    return KindFixture(
        tier=_tier(kind="litellm", base_url=echo_url, model="openai/echo", api_key_env=KEY_ENV),
        client_error={"extra_body": {"echo": {"fail_status": 422}}},
        unreachable=_tier(
            kind="litellm",
            base_url=_dead_url(),
            model="openai/echo",
            api_key_env=KEY_ENV,
            timeout_s=5.0,
        ),
    )


def _replay(echo_url: str, tmp_path: Path) -> KindFixture:
    trace = tmp_path / "recorded.jsonl"
    records = [
        {
            "schema_version": 1,
            "id": "r1",
            "time": 1.0,
            "prompt": PROMPT,
            "prompt_tokens": 9,
            "completion_tokens": 3,
            "outcomes": {"small": 0.0, "large": 1.0},
        },
        {
            "schema_version": 1,
            "id": "r2",
            "time": 2.0,
            "prompt": "Name a prime number.",
            "outcomes": {"small": 1.0, "large": 1.0},
        },
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    # A prompt the trace never recorded is the replay tier's 4xx: a 400, never a guess.
    return KindFixture(
        tier=_tier(kind="replay", replay_trace=str(trace)),
        client_error={"messages": [{"role": "user", "content": "a prompt nobody recorded"}]},
        unreachable=None,
    )


KIND_FIXTURES: dict[str, Callable[[str, Path], KindFixture]] = {
    "openai": _openai,
    "litellm": _litellm,
    "replay": _replay,
}


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


@pytest.fixture(params=sorted(BACKENDS))
def kind(
    request: pytest.FixtureRequest, echo_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> KindFixture:
    make = KIND_FIXTURES.get(request.param)
    if make is None:
        pytest.fail(
            f"backend kind {request.param!r} has no conformance fixture: add one to "
            f"KIND_FIXTURES in {Path(__file__).name}"
        )
    monkeypatch.setenv(KEY_ENV, "unused-by-the-echo-server")
    return make(echo_url, tmp_path)


def _body(endpoint: str, prompt: str, **extra: Any) -> dict[str, Any]:
    if endpoint == "chat/completions":
        return {"model": "auto", "messages": [{"role": "user", "content": prompt}], **extra}
    return {"model": "auto", "prompt": prompt, **extra}


def _run(tier: TierConfig, use: Callable[[Backend], Any]) -> Any:
    """Builds the tier's backend through the registry, runs `use` on it, always closes it."""

    async def go() -> Any:
        backend = build_backend(tier)
        try:
            return await use(backend)
        finally:
            await backend.aclose()

    return asyncio.run(go())


async def _collect(backend: Backend, endpoint: str, body: dict[str, Any]) -> bytes:
    return b"".join([chunk async for chunk in backend.stream(endpoint, body)])


# --- the checks, for every kind --------------------------------------------------------------


def test_every_kind_has_a_fixture() -> None:
    assert set(KIND_FIXTURES) == set(BACKENDS)


def test_registry_builds_the_kinds_class(kind: KindFixture) -> None:
    backend = _run(kind.tier, lambda b: asyncio.sleep(0, b))
    assert type(backend) is BACKENDS[kind.tier.kind].load()
    assert backend.tier == kind.tier.name


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_complete_returns_choices_and_usage(kind: KindFixture, endpoint: str) -> None:
    body = _body(endpoint, kind.prompt)
    resp: UpstreamResponse = _run(kind.tier, lambda b: b.complete(endpoint, body))
    assert isinstance(resp.body["choices"], list) and resp.body["choices"]
    usage = resp.body["usage"]
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_stream_yields_sse_ending_in_done(kind: KindFixture, endpoint: str) -> None:
    body = _body(endpoint, kind.prompt, stream=True, stream_options={"include_usage": True})
    raw = _run(kind.tier, lambda b: _collect(b, endpoint, body))
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert all(e.startswith(b"data: ") for e in events), raw[:300]
    assert events[-1] == b"data: [DONE]"
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert chunks and all("choices" in c for c in chunks)
    assert any(c["choices"] for c in chunks)  # some content came, not only a usage chunk


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_upstream_4xx_is_a_client_error(kind: KindFixture, stream: bool) -> None:
    if kind.client_error is None:
        pytest.skip(f"kind {kind.tier.kind!r} has no upstream answer that is a 4xx")
    body = {**_body("chat/completions", kind.prompt, stream=stream), **kind.client_error}

    async def call(b: Backend) -> object:
        return await (
            _collect(b, "chat/completions", body)
            if stream
            else b.complete("chat/completions", body)
        )

    with pytest.raises(UpstreamClientError) as info:
        _run(kind.tier, call)
    assert 400 <= info.value.status < 500
    assert "error" in info.value.body  # OpenAI's error shape, returned to the client as is


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_unreachable_upstream_is_an_upstream_error(kind: KindFixture, stream: bool) -> None:
    if kind.unreachable is None:
        pytest.skip(f"kind {kind.tier.kind!r} has no upstream")
    body = _body("chat/completions", kind.prompt, stream=stream)

    async def call(b: Backend) -> object:
        return await (
            _collect(b, "chat/completions", body)
            if stream
            else b.complete("chat/completions", body)
        )

    with pytest.raises(UpstreamError) as info:
        _run(kind.unreachable, call)
    assert info.value.tier == kind.unreachable.name  # the tier may fall back: it is named


def test_ready_answers_a_bool_and_a_reason(kind: KindFixture) -> None:
    ok, why = _run(kind.tier, lambda b: b.ready())
    assert ok is True and isinstance(why, str) and why
    if kind.unreachable is not None:
        ok, why = _run(kind.unreachable, lambda b: b.ready())
        assert ok is False and isinstance(why, str) and why


def test_aclose_after_use_and_twice(kind: KindFixture) -> None:
    async def go() -> None:
        backend = build_backend(kind.tier)
        await backend.complete("chat/completions", _body("chat/completions", kind.prompt))
        assert await backend.aclose() is None
        await backend.aclose()  # closing a closed backend is harmless (shutdown after a reload)

    asyncio.run(go())


# --- the config accepts exactly the registry's kinds -----------------------------------------


def _config_error(tier: dict[str, Any]) -> str:
    ok = {"name": "small", "base_url": "http://h:1/v1", "model": "s", "price": PRICE}
    with pytest.raises(ConfigError) as info:
        config_from_dict({"tiers": [ok, {"price": PRICE, **tier}]}, environ={})
    return str(info.value)


def test_unknown_kind_is_rejected_naming_the_key() -> None:
    message = _config_error({"name": "big", "kind": "carrier_pigeon", "model": "m"})
    assert "tiers.1.kind" in message and "carrier_pigeon" in message
    assert all(k in message for k in BACKENDS)  # the error lists the kinds there are


REQUIRED = [(name, key) for name, kind in sorted(BACKENDS.items()) for key in kind.required_keys]


def test_kinds_name_their_required_keys() -> None:
    assert ("openai", "base_url") in REQUIRED and ("replay", "replay_trace") in REQUIRED


def test_validating_a_config_imports_no_backend_class() -> None:
    """`config check`, `--help` and every other command validate tier kinds from the registry's
    entries alone: httpx, aiohttp and the backend modules load only when a tier is built."""
    code = (
        "import sys, router.config; "
        "print(sorted(m for m in ('httpx', 'aiohttp', 'backends.openai_http', "
        "'backends.litellm_backend', 'backends.recorded') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("kind_name", "key"), REQUIRED)
def test_missing_required_key_is_rejected_naming_it(kind_name: str, key: str) -> None:
    message = _config_error({"name": "big", "kind": kind_name, "model": "m"})
    assert f"tiers.1.{key}" in message and repr(kind_name) in message
