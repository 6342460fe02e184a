"""Anthropic Messages (`POST /v1/messages`) on the chat request path.

A Messages request is checked (router/apis/messages_schema.py), translated to the chat request
it stands for by litellm's adapter (`LiteLLMAnthropicMessagesAdapter.translate_anthropic_to_openai`:
system, content blocks, tool_use / tool_result, tools, tool_choice, stop_sequences, thinking,
images, documents), and routed, budgeted and traced as that chat request. A tier that speaks
Messages (`apis: [..., messages]`) is sent the client's request as it is (a stream
is relayed by router/proxy/messages_relay.py); any other gets the chat request, and its answer
comes back in Anthropic's shape.

Hand-written here: the answer's translation back (text and tool_use blocks, stop_reason, usage
with the cache split), and the stream's (router/apis/anthropic_stream.py). litellm has both,
but over its own `ModelResponse` objects: building one per answer measured ~0.65 ms of CPU on
the dev machine against a few microseconds for the dict built here.

litellm takes seconds to import: it is imported once, in a worker thread, by the first Messages
request (`load_adapter`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import ValidationError

from backends.base import Usage
from backends.config import TierConfig
from backends.usage import messages_usage_json
from router.apis.anthropic_stream import MessagesStream, reasoning_of, stop_reason, translate
from router.apis.base import Parts
from router.apis.messages_schema import MessagesRequest
from router.http.errors import RouterError, anthropic_error_body, validation_message
from router.http.schemas import write_back

log = logging.getLogger(__name__)

NAME = "messages"


_ADAPTER: Any = None


def _load() -> Any:
    # The litellm backend's loader: local price map, quiet loggers, no debug banner.
    from backends.litellm_backend import _litellm

    _litellm()
    from litellm.llms.anthropic.messages.adapters.transformation import (
        LiteLLMAnthropicMessagesAdapter,
    )

    return LiteLLMAnthropicMessagesAdapter()


async def load_adapter() -> Any:
    """litellm's Messages adapter, imported off the event loop the first time."""
    global _ADAPTER
    if _ADAPTER is None:
        _ADAPTER = await asyncio.to_thread(_load)
    return _ADAPTER


def _clean(message: Any) -> Any:
    # litellm's messages carry `thinking_blocks: None` and the like: keys an OpenAI-compatible
    # server may refuse, and that say nothing.
    if isinstance(message, dict):
        return {k: v for k, v in message.items() if v is not None or k == "content"}
    return message


def _tool_input(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str) and arguments:
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


class MessagesApi:
    """One Messages request (router/apis/base.py ClientApi)."""

    name = NAME

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.native: dict[str, Any] = {}
        self.tool_names: dict[str, str] = {}  # litellm's truncated tool name -> the client's

    def authorization(self, headers: Mapping[str, str]) -> str | None:
        # Anthropic clients send the key as x-api-key (ANTHROPIC_API_KEY), or as a bearer token
        # (ANTHROPIC_AUTH_TOKEN): either names the router key.
        auth = headers.get("authorization")
        if auth is not None:
            return auth
        key = headers.get("x-api-key")
        return f"Bearer {key}" if key is not None else None

    def error_body(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
        return anthropic_error_body(status, message)  # router/http/errors.py: the wire format

    def to_chat(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RouterError(400, "invalid_request", "request body must be a JSON object")
        try:
            validated = MessagesRequest.model_validate(body)
        except ValidationError as exc:
            message, param = validation_message(list(exc.errors(include_url=False)))
            raise RouterError(400, "invalid_request", message, param) from None
        write_back(body, validated)
        self.native = body
        try:
            # A deep copy: the adapter pops and rewrites fields of what it is given.
            chat, self.tool_names = self.adapter.translate_anthropic_to_openai(copy.deepcopy(body))
        except Exception as exc:  # noqa: BLE001 - a request litellm cannot read is the client's
            log.warning(
                "messages request not translatable: %s: %s", type(exc).__name__, exc, exc_info=True
            )
            raise RouterError(
                400, "invalid_request", "the request could not be translated to a chat request"
            ) from None
        chat = dict(chat)
        # Blocks chat has no counterpart for (a user turn of thinking blocks only, a block type
        # litellm does not know) translate to nothing: an empty user turn stands for them, so
        # a request the schema allows is answered, not refused by the chat check below.
        chat["messages"] = [_clean(m) for m in chat.get("messages") or ()] or [
            {"role": "user", "content": ""}
        ]
        metadata = body.get("metadata")
        if isinstance(metadata, dict):
            # As a chat request carries it: `metadata.session_id` names the session
            # (policies/sessions/identity.py); `user_id` became `user` above.
            chat["metadata"] = metadata
        return chat

    def upstream(
        self, tier: TierConfig, chat: dict[str, Any], stream: bool
    ) -> tuple[str, dict[str, Any]] | None:
        if not tier.speaks(NAME):
            return None
        # The client's own request, to the tier's model, with the completion bound reserved for
        # (streamed: router/proxy/messages_relay.py meters it).
        bound = chat.get("max_tokens", self.native.get("max_tokens"))
        return NAME, {**self.native, "model": tier.model, "max_tokens": bound}

    def answer(
        self, body: dict[str, Any], usage: Usage, cost_usd: float, native: bool
    ) -> dict[str, Any]:
        if native:
            if usage.reported:
                return body
            return {**body, "usage": messages_usage_json(usage)}  # what it is charged for
        choices = body.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        content: list[dict[str, Any]] = []
        thinking = reasoning_of(message)
        if thinking is not None:  # a reasoning model's thinking, first as Anthropic puts it
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
        text = message.get("content")
        if isinstance(text, str) and text:
            content.append({"type": "text", "text": text})
        for call in message.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            name = function.get("name") if isinstance(function.get("name"), str) else ""
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id") or f"toolu_{len(content)}",
                    "name": self.tool_names.get(name, name),
                    "input": _tool_input(function.get("arguments")),
                }
            )
        model = body.get("model")
        return {
            "id": _message_id(body.get("id")),
            "type": "message",
            "role": "assistant",
            "model": model if isinstance(model, str) else "",
            "content": content,
            "stop_reason": stop_reason(choice.get("finish_reason")),
            "stop_sequence": None,
            "usage": messages_usage_json(usage),
        }

    def stream(self, parts: Parts, request_id: str) -> Parts:
        return translate(parts, MessagesStream(f"msg_{request_id}", self.tool_names))


def _message_id(upstream_id: Any) -> str:
    return f"msg_{upstream_id}" if isinstance(upstream_id, str) and upstream_id else "msg_router"
