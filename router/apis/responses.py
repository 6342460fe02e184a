"""The OpenAI Responses API (`POST /v1/responses`) on the routed chat path.

A request is validated (router/apis/responses_schema.py), translated to a chat request and
routed, budgeted and traced as one; a tier that speaks Responses itself (`apis: [responses]`) is
sent the client's own body instead (`upstream`; its stream is metered by
router/proxy/responses_relay.py). Otherwise the answer is translated back: a Response object, or
a stream of Responses events made from the chat stream as it arrives.

Which translation is whose:
- Request (input items, instructions, tools, tool_choice, text.format -> chat): litellm's
  `LiteLLMCompletionResponsesConfig.transform_responses_api_request_to_chat_completion_request`
  (0.1-0.2 ms a request). litellm is imported once, off the event loop (`ready`): it takes
  seconds.
- Answer and events: written here. litellm's answer translation took 2.2 ms a request (it
  builds litellm's pydantic objects twice over) and leaves out usage details the openai SDK
  requires (`input_tokens_details.cache_write_tokens`, `output_tokens_details`); its stream
  iterator reads litellm's own stream wrapper, not the chat SSE the relay meters and charges.

Stateless: `previous_response_id`, `conversation` and `background` need stored responses, so
they are refused (400, naming the field); `store: true` is accepted and not honoured, as vLLM
does without a store: the answer says `"store": false` and nothing can be fetched later.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from functools import lru_cache
from typing import Any

import orjson
from pydantic import ValidationError

from backends.base import Usage
from backends.config import TierConfig
from backends.usage import ESTIMATED_FIELD
from router.apis.responses_schema import (
    KNOWN_ITEMS,
    MESSAGE,
    ResponsesFunctionCall,
    ResponsesFunctionCallOutput,
    ResponsesInputMessage,
    ResponsesOtherItem,
    ResponsesRequest,
)
from router.http.errors import RouterError, error_body, validation_message
from router.http.schemas import write_back

NAME = "responses"
# What needs stored responses, and why the proxy refuses it.
STATEFUL = {
    "previous_response_id": "this proxy stores no responses, so it cannot continue one: send "
    "the whole conversation in `input` (earlier `output` items included)",
    "conversation": "this proxy keeps no conversations: send the whole conversation in `input`",
    "background": "background responses need stored responses, which this proxy does not keep",
}
# Request fields litellm's translation reads; the rest are the client's own (passthrough only).
TRANSLATED = (
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "temperature",
    "top_p",
    "user",
    "parallel_tool_calls",
    "max_output_tokens",
)
CHAT_FIELDS = (
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "user",
    "parallel_tool_calls",
    "max_tokens",
    "response_format",
)
# Echoed in the Response object as the client sent them (OpenAI's defaults otherwise).
ECHOED = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "temperature": None,
    "top_p": None,
    "tool_choice": "auto",
    "tools": [],
    "text": {"format": {"type": "text"}},
    "user": None,
    "reasoning": None,
    "truncation": "disabled",
}
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
ITEM_MODELS: dict[Any, type[Any]] = {
    None: ResponsesInputMessage,
    "message": ResponsesInputMessage,
    "function_call": ResponsesFunctionCall,
    "function_call_output": ResponsesFunctionCallOutput,
}


# --- litellm, imported once -------------------------------------------------------------------


@lru_cache(maxsize=1)
def _litellm_config() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price map download
    # Lazy: seconds to import; two first requests at once both wait on Python's import lock.
    from litellm.responses.litellm_completion_transformation.transformation import (
        LiteLLMCompletionResponsesConfig,
    )

    return LiteLLMCompletionResponsesConfig


def warm() -> None:
    """Import litellm's translation now (seconds)."""
    _litellm_config()


async def ready() -> None:
    """Before the request path translates: litellm imported, in a worker thread the first time
    (the event loop keeps serving; only the first Responses requests wait for it)."""
    if _litellm_config.cache_info().currsize == 0:
        await asyncio.to_thread(warm)


def _plain(obj: Any) -> Any:
    # litellm's messages may hold its pydantic objects (a replayed tool call).
    dump = getattr(obj, "model_dump", None)
    if dump is None:
        raise TypeError(f"cannot serialise {type(obj).__name__}")
    return dump(exclude_none=True)


# --- the request -------------------------------------------------------------------------------


def check(body: Any) -> ResponsesRequest:
    """The client's body, validated (a 400 naming the field otherwise); its whole floats in
    integer fields become integers in `body` itself, as chat's do."""
    if not isinstance(body, dict):
        raise RouterError(400, "invalid_request", "request body must be a JSON object")
    for name, why in STATEFUL.items():
        value = body.get(name)
        if value is not None and value is not False:
            raise RouterError(
                400, "unsupported_parameter", f"'{name}' is not supported: {why}", name
            )
    try:
        validated = ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        errors = list(exc.errors(include_url=False))
        if isinstance(body.get("input"), list) and any(e["loc"][:1] == ("input",) for e in errors):
            raise _input_error(body["input"]) from None
        message, param = validation_message(errors)
        raise RouterError(400, "invalid_request", message, param) from None
    write_back(body, validated)
    return validated


def _input_error(items: list[Any]) -> RouterError:
    """The first bad item of an `input` list, checked as the item its `type` says it is (the
    union's error would list every kind it is not)."""
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            return RouterError(400, "invalid_request", f"'input.{i}': not an object", f"input.{i}")
        kind = item.get("type")
        hashable = isinstance(kind, str | None)
        model = ITEM_MODELS.get(kind, ResponsesOtherItem) if hashable else ResponsesOtherItem
        try:
            model.model_validate(item)
        except ValidationError as exc:
            errors = [{**e, "loc": ("input", i, *e["loc"])} for e in exc.errors(include_url=False)]
            message, param = validation_message(errors)
            return RouterError(400, "invalid_request", message, param)
    return RouterError(
        400,
        "invalid_request",
        "'input': needs at least one message, function_call or function_call_output item",
        "input",
    )


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request a translated tier is sent for the (checked) Responses `body`."""
    stream = body.get("stream") is True
    items: Any = body["input"]
    if isinstance(items, list):  # what chat has no equivalent for stays out of the prompt
        # A message item may say `"type": "message"`, null, or nothing; litellm reads the type
        # only when it is given.
        items = [
            {k: v for k, v in i.items() if k != "type"} if i.get("type") is None else i
            for i in items
            if (i.get("type") or MESSAGE) in KNOWN_ITEMS
        ]
    request = {k: body[k] for k in TRANSLATED if body.get(k) is not None}
    config = _litellm_config()
    try:
        chat = config.transform_responses_api_request_to_chat_completion_request(
            model=body["model"],
            input=items,
            responses_api_request=request,
            custom_llm_provider="openai",
            stream=stream,
        )
    except Exception as exc:  # noqa: BLE001 - litellm's BadRequestError, or a shape it rejects
        message = getattr(exc, "message", None) or str(exc)
        raise RouterError(400, "invalid_request", f"'input': {message}"[:500], "input") from None
    out: dict[str, Any] = {"model": body["model"]}
    out.update(
        orjson.loads(orjson.dumps({k: chat[k] for k in CHAT_FIELDS if k in chat}, default=_plain))
    )
    if not out.get("messages"):
        # Only items chat cannot read (the schema requires one it can): nothing to answer.
        raise RouterError(400, "invalid_request", "'input' has no message to answer", "input")
    if body.get("metadata") is not None:
        out["metadata"] = body["metadata"]
    if stream:
        # The translated stream's response.completed carries usage: always ask the relay for it.
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def native_body(body: dict[str, Any], tier: TierConfig, max_tokens: int | None) -> dict[str, Any]:
    """The client's own body for a tier that speaks Responses: its model, and the completion
    bound that was reserved for (`max_tokens`, from the chat body the budget saw)."""
    out = {**body, "model": tier.model}
    if max_tokens is not None:
        out["max_output_tokens"] = max_tokens
    return out


# --- usage -------------------------------------------------------------------------------------


def usage_object(usage: Usage, cost_usd: float | None = None) -> dict[str, Any]:
    """The Responses `usage` for what the request is charged: cache reads (and writes) within
    the input, reasoning within the output, as the openai SDK's ResponseUsage requires them."""
    out: dict[str, Any] = {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }
    if cost_usd is not None:
        out["cost_usd"] = round(cost_usd, 10)
    if not usage.reported:
        out[ESTIMATED_FIELD] = True
    return out


def usage_of_chat(obj: Mapping[str, Any]) -> Usage:
    """The charged usage the relay put in its final chat usage chunk (`usage_json`'s shape)."""
    u = obj.get("usage") or {}
    prompt_details = u.get("prompt_tokens_details") or {}
    completion_details = u.get("completion_tokens_details") or {}
    return Usage(
        u.get("prompt_tokens", 0),
        u.get("completion_tokens", 0),
        not u.get(ESTIMATED_FIELD, False),
        None,
        prompt_details.get("cached_tokens", 0),
        prompt_details.get("cache_write_tokens", 0),
        completion_details.get("reasoning_tokens", 0),
    )


# --- the answer --------------------------------------------------------------------------------


# Ids of responses and their items: unique per process run (its random part) and in it (the
# counter), without a uuid4's urandom call per id.
_RUN = uuid.uuid4().hex[:16]
_SEQ = itertools.count()


def _new_id(prefix: str) -> str:
    return f"{prefix}_{_RUN}{next(_SEQ):016x}"


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [_text_part(text)],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class ResponseShell:
    """The Response object of one request: what it echoes of the request, then its output."""

    def __init__(self, body: Mapping[str, Any], response_id: str) -> None:
        self.id = response_id
        self.created_at = int(time.time())
        self.echo = {k: body.get(k) if body.get(k) is not None else v for k, v in ECHOED.items()}
        self.model = str(body.get("model", ""))

    def object(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        finish_reason: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        reason = INCOMPLETE.get(finish_reason or "")
        if reason is not None and status == "completed":
            status = "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "model": self.model,
            "output": output,
            "previous_response_id": None,
            "store": False,  # nothing is stored: no later GET can find it
            "background": False,
            "usage": usage,
            **self.echo,
        }


def answer(
    body: Mapping[str, Any],
    chat: Mapping[str, Any],
    usage: Usage,
    cost_usd: float | None,
    response_id: str,
) -> dict[str, Any]:
    """The Response object for a (non-streamed) chat answer; `usage` is what is charged."""
    shell = ResponseShell(body, response_id)
    if isinstance(chat.get("model"), str):
        shell.model = chat["model"]
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    output: list[dict[str, Any]] = []
    text = message.get("content")
    calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
    if (isinstance(text, str) and text) or not calls:
        output.append(
            _message_item(_new_id("msg"), text if isinstance(text, str) else "", "completed")
        )
    for call in calls:
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        call_id = str(call.get("id") or _new_id("call"))
        output.append(
            _call_item(
                _new_id("fc"),
                call_id,
                str(fn.get("name", "")),
                str(fn.get("arguments", "")),
                "completed",
            )
        )
    return shell.object(
        "completed", output, usage_object(usage, cost_usd), choice.get("finish_reason")
    )


# --- the stream --------------------------------------------------------------------------------


def _sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _chat_events(part: bytes, rest: bytes) -> tuple[list[bytes | None], bytes]:
    """The data of each complete SSE event in `rest + part` (None for [DONE]) and what is left."""
    buffer = rest + part
    if b"\r" in buffer:
        buffer = buffer.replace(b"\r\n", b"\n")
    *events, left = buffer.split(b"\n\n")
    out: list[bytes | None] = []
    for event in events:
        lines = [ln[5:].lstrip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
        if not lines:
            continue  # a comment or keep-alive
        data = b"\n".join(lines)
        out.append(None if data == b"[DONE]" else data)
    return out, left


class StreamTranslator:
    """Chat chunks in, Responses events out, one relay part at a time (never buffered past the
    part that completes an event): response.created, then per output item its added / delta /
    done events, then response.completed (or .incomplete) with the charged usage; a chat stream
    that broke off ends in response.failed instead, so no cut answer looks complete."""

    def __init__(self, body: Mapping[str, Any], response_id: str) -> None:
        self.shell = ResponseShell(body, response_id)
        self.seq = 0
        self.text_item: dict[str, Any] | None = None  # the message item, while text streams
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> function_call item
        self.args: dict[int, list[str]] = {}
        self.output: list[dict[str, Any]] = []  # items in output order (done ones final)
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.ended = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return _sse(event)

    def start(self) -> bytes:
        created = self.shell.object("in_progress", [])
        return self._event("response.created", response=created) + self._event(
            "response.in_progress", response=created
        )

    def feed(self, data: bytes | None) -> list[bytes]:
        """One chat event's data (None: [DONE]) -> the Responses events it makes."""
        if self.ended:
            return []
        if data is None:
            return self._finish()
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(obj, dict):
            return []
        if isinstance(obj.get("error"), dict):  # the relay's own error event: the stream broke
            return self._failed(obj["error"])
        if isinstance(obj.get("model"), str):
            self.shell.model = obj["model"]
        if isinstance(obj.get("usage"), dict):
            self.usage = usage_object(usage_of_chat(obj), obj["usage"].get("cost_usd"))
        out: list[bytes] = []
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.extend(self._text(text))
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out.extend(self._call(call))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def _text(self, text: str) -> list[bytes]:
        out = []
        if self.text_item is None:
            self.text_item = _message_item(_new_id("msg"), "", "in_progress")
            self.text_item["content"] = []
            self.output.append(self.text_item)
            index = len(self.output) - 1
            out.append(
                self._event("response.output_item.added", output_index=index, item=self.text_item)
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=self.text_item["id"],
                    output_index=index,
                    content_index=0,
                    part=_text_part(""),
                )
            )
        self.text.append(text)
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self.text_item["id"],
                output_index=self.output.index(self.text_item),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        out = []
        index = call.get("index", 0)
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        item = self.calls.get(index)
        if item is None:
            call_id = str(call.get("id") or _new_id("call"))
            item = _call_item(_new_id("fc"), call_id, str(fn.get("name") or ""), "", "in_progress")
            self.calls[index], self.args[index] = item, []
            self.output.append(item)
            out.append(
                self._event(
                    "response.output_item.added", output_index=len(self.output) - 1, item=item
                )
            )
        arguments = fn.get("arguments")
        if isinstance(arguments, str) and arguments:
            self.args[index].append(arguments)
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    delta=arguments,
                )
            )
        return out

    def _finish(self) -> list[bytes]:
        self.ended = True
        out = []
        if self.text_item is not None:
            index, text = self.output.index(self.text_item), "".join(self.text)
            item_id = self.text_item["id"]
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=_text_part(text),
                )
            )
            done = _message_item(item_id, text, "completed")
            self.output[index] = done
            out.append(self._event("response.output_item.done", output_index=index, item=done))
        for chat_index, item in self.calls.items():
            index, arguments = self.output.index(item), "".join(self.args[chat_index])
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=arguments,
                )
            )
            done = _call_item(item["id"], item["call_id"], item["name"], arguments, "completed")
            self.output[index] = done
            out.append(self._event("response.output_item.done", output_index=index, item=done))
        if not self.output:  # an empty answer is still one (empty) message
            empty = _message_item(_new_id("msg"), "", "completed")
            self.output.append(empty)
            out.append(self._event("response.output_item.added", output_index=0, item=empty))
            out.append(self._event("response.output_item.done", output_index=0, item=empty))
        final = self.shell.object("completed", self.output, self.usage, self.finish_reason)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=final))
        return out

    def _failed(self, error: dict[str, Any]) -> list[bytes]:
        self.ended = True
        message = str(error.get("message") or "the upstream failed mid-stream")
        failed = self.shell.object(
            "failed", self.output, self.usage, error={"code": "server_error", "message": message}
        )
        return [self._event("response.failed", response=failed)]

    def close(self) -> list[bytes]:
        """The relay ended without [DONE] or an error event (it always sends one of them; a
        client gone mid-way never reads this): end as failed rather than complete."""
        if self.ended:
            return []
        return self._failed({"message": "the answer ended before it was complete"})


async def translate_stream(
    parts: AsyncIterator[tuple[bytes, bool]], translator: StreamTranslator
) -> AsyncIterator[tuple[bytes, bool]]:
    """The relay's chat parts, each as soon as it comes, as Responses events (same flags)."""
    first, rest = True, b""
    async for part, last in parts:
        data, rest = _chat_events(part, rest)
        out = [translator.start()] if first else []
        first = False
        for d in data:
            out.extend(translator.feed(d))
        if last:
            out.extend(translator.close())
        if out or last:
            yield b"".join(out), last


def events_of(raw: bytes) -> Iterator[dict[str, Any]]:
    """The data objects of a Responses SSE body, in order (tests and benchmarks read it)."""
    for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                yield orjson.loads(line[5:])


def error_shape(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """Responses errors are OpenAI's error object, as chat's."""
    return error_body(status, code, message, param)


class ResponsesApi:
    """One request's adapter to the request path (the ClientApi of router/apis/base.py)."""

    name = NAME

    def __init__(self) -> None:
        self.body: dict[str, Any] = {}  # the client's own, checked
        self.response_id = _new_id("resp")
        self.native = False

    def authorization(self, headers: Mapping[str, str]) -> str | None:
        return headers.get("authorization")

    def error_body(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
        return error_shape(status, code, message, param)

    def to_chat(self, body: Any) -> dict[str, Any]:
        check(body)
        self.body = body
        return to_chat(body)

    def upstream(
        self, tier: TierConfig, chat_body: dict[str, Any], stream: bool
    ) -> tuple[str, dict[str, Any]] | None:
        # Streamed or not: a tier's own Responses stream is metered by
        # router/proxy/responses_relay.py.
        self.native = tier.speaks(NAME)
        if not self.native:
            return None
        bound = chat_body.get("max_completion_tokens") or chat_body.get("max_tokens")
        return NAME, native_body(self.body, tier, bound)

    def answer(
        self, body: dict[str, Any], usage: Usage, cost_usd: float | None, native: bool
    ) -> dict[str, Any]:
        if native:  # the tier's own Response: the usage it is charged for, as chat's is
            out = {**body}
            if not usage.reported or cost_usd is not None:
                out["usage"] = {**(body.get("usage") or {}), **usage_object(usage, cost_usd)}
            return out
        return answer(self.body, body, usage, cost_usd, self.response_id)

    def stream(self, parts: AsyncIterator[tuple[bytes, bool]], request_id: str = "") -> Any:
        """The client's events: a tier's own Responses stream as it is, else the chat stream
        translated as it comes."""
        if self.native:
            return parts
        return translate_stream(parts, StreamTranslator(self.body, self.response_id))
