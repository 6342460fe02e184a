"""The OpenAI Responses request the proxy accepts (`POST /v1/responses`), as published.

It states every rule the endpoint checks, as router/http/schemas.py does for chat: a body it
allows is translated and routed, never refused as malformed. What a translated tier cannot do
is left out of the schema rather than accepted and dropped: `previous_response_id`,
`conversation` and `background` need response storage the proxy does not have (only null is
allowed; router/apis/responses.py refuses a value with a message saying so), and a tool is a
`function` tool (hosted tools run inside OpenAI). Input items the chat path has no equivalent
for (reasoning, hosted tool calls) are allowed and not sent to a translated tier. Fields not
listed are allowed and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from router.http.schemas import MaxTokens

MESSAGE, FUNCTION_CALL, FUNCTION_CALL_OUTPUT = "message", "function_call", "function_call_output"
KNOWN_ITEMS = (MESSAGE, FUNCTION_CALL, FUNCTION_CALL_OUTPUT)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ResponsesInputText(_Open):
    type: Literal["input_text", "output_text"]
    text: str


class ResponsesInputImage(_Open):
    type: Literal["input_image"]
    image_url: str = Field(min_length=1)
    detail: Literal["low", "high", "auto"] | None = None


Part = ResponsesInputText | ResponsesInputImage


class ResponsesInputMessage(_Open):
    """A message: `{"role", "content"}`, with or without `"type": "message"`."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class ResponsesFunctionCall(_Open):
    """A call the model made earlier (from a previous answer's `output`)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    arguments: str


class ResponsesFunctionCallOutput(_Open):
    """The client's result of a function call, answering `call_id`."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[ResponsesInputText]


def _other_type(value: str) -> str:
    if value in KNOWN_ITEMS:
        raise ValueError(f"an item of type {value!r} has its own fields")
    return value


# Any other item type (reasoning, a hosted tool's call): allowed, not sent to a translated tier.
OtherType = Annotated[
    str,
    AfterValidator(_other_type),
    WithJsonSchema({"type": "string", "not": {"enum": list(KNOWN_ITEMS)}}),
]


class ResponsesOtherItem(_Open):
    type: OtherType


InputItem = (
    ResponsesInputMessage | ResponsesFunctionCall | ResponsesFunctionCallOutput | ResponsesOtherItem
)


class ResponsesFunctionTool(_Open):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesNamedFunction(_Open):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)


class ResponsesTextFormat(_Open):
    type: Literal["text", "json_object"]


class ResponsesJsonSchemaFormat(_Open):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponsesTextConfig(_Open):
    format: ResponsesTextFormat | ResponsesJsonSchemaFormat | None = None


Stored = Annotated[None, Field(description="not supported: the proxy stores no responses")]


def _readable(items: list[Any]) -> list[Any]:
    if not any(not isinstance(i, ResponsesOtherItem) for i in items):
        raise ValueError("needs at least one message, function_call or function_call_output item")
    return items


def _contains_readable(schema: dict[str, Any]) -> None:
    # The published rule `_readable` checks: an input list holds an item chat can read.
    for branch in schema["properties"]["input"]["anyOf"]:
        if branch.get("type") == "array":
            # The union's branches in order: every one but the last (ResponsesOtherItem).
            branch["contains"] = {"anyOf": [dict(b) for b in branch["items"]["anyOf"][:-1]]}


class ResponsesRequest(_Open):
    """An OpenAI Responses request (stateless: the whole conversation is in `input`)."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_contains_readable)
    model: str = Field(min_length=1, max_length=256)
    input: str | Annotated[list[InputItem], AfterValidator(_readable)]
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool = False
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ResponsesNamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: ResponsesTextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Accepted, never honoured: the answer says `"store": false` (router/apis/responses.py).
    store: bool | None = None
    previous_response_id: Stored = None
    conversation: Stored = None
    background: Literal[False] | None = None
