"""The contract between the request path and an upstream model server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


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
