"""`session:`, the option every routing policy takes (policies/spec.py's PolicyParams)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Mode = Literal["per_request", "sticky", "escalate_only", "cache_aware"]
MODES: tuple[Mode, ...] = ("per_request", "sticky", "escalate_only", "cache_aware")


class SessionParams(BaseModel):
    """How the policy's decisions hold across a conversation's turns (docs/conversations.md)."""

    model_config = ConfigDict(extra="forbid")
    mode: Mode = Field(
        default="per_request",
        description="per_request: every request decided on its own (no store round trip "
        "unless it is in a tool loop); sticky: the session's first decision holds; "
        "escalate_only: a session may move to a pricier tier, never back; cache_aware: "
        "escalate_only, and moves to a cheaper tier only when this turn's saving exceeds "
        "the prompt cache it gives up",
    )
    ttl_s: float = Field(
        default=3600.0,
        gt=0,
        le=30 * 86400,
        description="a session's state is forgotten this long after its last request",
    )
    tool_loop: bool = Field(
        default=True,
        description="a request carrying a tool result goes to the tier that made the call, "
        "whatever the policy or mode says (one store round trip for requests with tools)",
    )


DEFAULT_SESSION = SessionParams()
