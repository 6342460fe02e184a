"""What the request path asks of a client API that is not chat completions (router/apis/).

One object per request (it keeps the client's own body): `handle(..., api=...)` in
router/proxy/request_path.py runs the one request path on `to_chat`'s body, asks `upstream` per
tier whether to pass the client's request through (the tier speaks the API: `apis:` in its
config) or send the chat request, and hands the answer or stream to `answer` / `stream`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from backends.base import Usage
from backends.config import TierConfig

Parts = AsyncIterator[tuple[bytes, bool]]  # (client bytes, is the last part), as the relay's


class ClientApi(Protocol):
    name: str  # the endpoint under /v1 the client called ("messages"): the trace's `endpoint`

    def authorization(self, headers: Mapping[str, str]) -> str | None:
        """The `Authorization` value the key store authenticates (`Bearer <key>`)."""
        ...

    def error_body(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
        """The API's own error JSON for an error the request path answers."""
        ...

    def to_chat(self, body: Any) -> dict[str, Any]:
        """Check the client's body (a 400 RouterError naming what is wrong) and return the chat
        completions request it stands for: what is scored, budgeted and routed."""
        ...

    def upstream(
        self, tier: TierConfig, chat: dict[str, Any], stream: bool
    ) -> tuple[str, dict[str, Any]] | None:
        """(endpoint, body) to send `tier` when it takes the client's request as it is; `chat`
        is the chat request as it would be sent (model and completion bound set). None: send
        `chat` (translated)."""
        ...

    def answer(
        self, body: dict[str, Any], usage: Usage, cost_usd: float, native: bool
    ) -> dict[str, Any]:
        """The client's answer from the upstream's (`native`: in the client's API already),
        carrying the usage it is charged for."""
        ...

    def stream(self, parts: Parts, request_id: str) -> Parts:
        """The client's stream from the relay's chat stream (always with its usage chunk)."""
        ...
