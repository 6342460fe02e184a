"""The contract between the request path and an upstream model server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.config import TierConfig


class UpstreamError(Exception):
    """The upstream could not be reached, timed out, or answered 5xx: the tier may fall back."""

    def __init__(
        self, tier: str, message: str, status: int | None = None, public: str | None = None
    ) -> None:
        super().__init__(f"{tier}: {message}")
        self.tier = tier
        self.status = status
        # What a client may read: a fixed phrase, never the upstream's body, an exception's text
        # or an address (the message, with those, goes to the log and the trace).
        self.public = public or (f"answered {status}" if status is not None else "failed")


class UpstreamClientError(Exception):
    """The upstream rejected the request (4xx), never retried. The client gets the status and a
    generic error; `body` (the upstream's own, maybe with internals) is for the log only.
    `public` is a message the backend itself wrote and vouches for (an in-process backend such
    as replay): the client sees it instead of the generic one."""

    def __init__(self, status: int, body: dict[str, Any], public: str | None = None) -> None:
        super().__init__(f"upstream {status}")
        self.status = status
        self.body = body
        self.public = public


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reported: bool = False  # False: counted by us because the upstream sent none (or bad usage)
    # Why the upstream's usage was not trusted (backends/usage.py FAULTS, or the router's bound
    # checks); the counts are then our own.
    fault: str | None = None
    # Parts of prompt_tokens the provider read from (cached) or wrote to (cache_write) its prompt
    # cache, priced by Price.cached_input_per_mtok / cache_write_per_mtok; the rest is fresh
    # input. Part of completion_tokens: reasoning (priced as output, never charged twice). Our
    # own count knows none of them: 0, every prompt token fresh.
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(slots=True)
class UpstreamResponse:
    body: dict[str, Any]
    usage: Usage = field(default_factory=Usage)
    deployment: str | None = None  # which of the tier's deployments answered (when it lists some)


@dataclass(frozen=True, slots=True)
class TierLoad:
    """Live load of one tier's backend (from its /metrics, when it has one)."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    spec_acceptance: float | None = None


class Backend(Protocol):
    tier: str

    async def complete(self, endpoint: str, body: dict[str, Any]) -> UpstreamResponse:
        """endpoint: 'chat/completions' or 'completions'. Non-streaming."""
        ...

    def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Yields raw SSE bytes as they arrive (no buffering)."""
        ...

    async def ready(self) -> tuple[bool, str]: ...

    async def aclose(self) -> None: ...


class BackendClass(Protocol):
    """What backends/registry.py needs of a backend kind's class: a constructor from the tier's
    config."""

    def __call__(self, tier: TierConfig) -> Backend: ...
