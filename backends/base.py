"""The contract between the request path and an upstream model server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.config import TierConfig


class UpstreamError(Exception):
    """The upstream could not be reached, timed out, or answered 5xx: the tier may fall back."""

    def __init__(self, tier: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{tier}: {message}")
        self.tier = tier
        self.status = status


class UpstreamClientError(Exception):
    """The upstream rejected the request (4xx): returned to the client as is, never retried."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"upstream {status}")
        self.status = status
        self.body = body


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reported: bool = False  # False: counted by us because the upstream sent none


@dataclass(slots=True)
class UpstreamResponse:
    body: dict[str, Any]
    usage: Usage = field(default_factory=Usage)


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

    async def ready(self) -> tuple[bool, str]:
        ...

    async def aclose(self) -> None: ...


class BackendClass(Protocol):
    """What backends/registry.py needs of a backend kind's class: a constructor from the tier's
    config."""

    def __call__(self, tier: TierConfig) -> Backend: ...
