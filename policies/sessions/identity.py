"""Which conversation a request belongs to, and where in it the request is. Pure: no I/O.

The id, first match wins:
1. the `x-session-id` header,
2. the body's `metadata.session_id`,
3. derived from the conversation's stable prefix: sha256 over (team, every system/developer
   message before the first user message, the first user message). An unchanged client gets
   sessions too, because every request of a chat re-sends that prefix unchanged.

A derived id collides by construction: two conversations of one team that open with the same
system prompt and the same first user message are one session (docs/conversations.md says what
that costs). A given id is scoped by team in the store (`store_key`), so one team can neither
read nor steer another team's session by guessing its id.

The turn is the number of user messages in the request (the first request of a chat is turn 1;
a tool-result request stays on the turn of the user message it answers).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

HEADER = "x-session-id"
# What a given id may be: it is echoed in `x-router-session` and written to traces, so printable
# and short; wider than a UUID to take most clients' own conversation ids as they are.
ID_PATTERN = re.compile(r"[A-Za-z0-9._:@/+=\-]{1,128}")
DERIVED_PREFIX = "auto-"
_SYSTEM_ROLES = ("system", "developer")
_TOOL_ROLES = ("tool", "function")

Source = Literal["header", "metadata", "derived"]


class InvalidSessionId(ValueError):
    """A client sent a session id that cannot be used (a 400 naming `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class SessionKey:
    id: str  # as the client sent it, or `auto-<24 hex>` when derived
    source: Source
    turn: int  # user messages in the request
    team: str

    @property
    def store_key(self) -> str:
        """The store's name for the session: scoped by team, fixed length whatever the id (the
        header and metadata name one session alike)."""
        digest = hashlib.sha256(f"{self.team}\x00{self.id}".encode()).digest()
        return digest[:16].hex()


def _checked(value: Any, param: str) -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidSessionId(
            param,
            f"{param} must be 1 to 128 characters of letters, digits and ._:@/+=-",
        )
    return value


def _messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


def user_turns(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "user")


def _derived(team: str, messages: Sequence[Mapping[str, Any]]) -> str | None:
    prefix: list[Any] = []
    for m in messages:
        role = m.get("role")
        if role in _SYSTEM_ROLES:
            prefix.append([role, m.get("content")])
        elif role == "user":
            prefix.append(["user", m.get("content")])
            break
        else:
            break  # an agent's loop with no user turn: its system prompt alone names it
    if not prefix:
        return None
    # orjson: canonical enough (the client re-sends the same JSON values each turn) and fast.
    blob = orjson.dumps([team, prefix], option=orjson.OPT_SORT_KEYS)
    return DERIVED_PREFIX + hashlib.sha256(blob).hexdigest()[:24]


def session_of(header: str | None, body: Mapping[str, Any], team: str) -> SessionKey | None:
    """The request's session, or None when it names none and has no prefix to derive one from
    (a completions prompt without an id). Raises InvalidSessionId for an unusable given id."""
    messages = _messages(body)
    turn = user_turns(messages)
    if header is not None:
        return SessionKey(_checked(header, HEADER), "header", turn, team)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and "session_id" in metadata:
        sid = _checked(metadata["session_id"], "metadata.session_id")
        return SessionKey(sid, "metadata", turn, team)
    derived = _derived(team, messages)
    return None if derived is None else SessionKey(derived, "derived", turn, team)


def in_tool_loop(body: Mapping[str, Any]) -> bool:
    """The request carries the result of a tool call: its last message is a tool (or legacy
    function) result, or a user message of tool results (Anthropic's shape, `tool_result`
    parts) answering an assistant message that made tool calls."""
    messages = _messages(body)
    if not messages:
        return False
    last = messages[-1]
    if last.get("role") in _TOOL_ROLES:
        return True
    content = last.get("content")
    if last.get("role") != "user" or not isinstance(content, list) or len(messages) < 2:
        return False
    parts = [p for p in content if isinstance(p, dict)]
    answers = bool(parts) and all(p.get("type") == "tool_result" for p in parts)
    before = messages[-2]
    called = before.get("role") == "assistant" and bool(
        before.get("tool_calls") or _has_tool_use(before.get("content"))
    )
    return answers and called


def _has_tool_use(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "tool_use" for p in content
    )


def uses_tools(body: Mapping[str, Any]) -> bool:
    """The request may start or continue a tool loop: it offers tools or carries tool results."""
    return bool(body.get("tools") or body.get("functions")) or in_tool_loop(body)
