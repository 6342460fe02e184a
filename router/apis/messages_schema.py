"""The Anthropic Messages request as the proxy checks it (`POST /v1/messages`).

As router/http/schemas.py does for chat: the model only checks a body, strictly (`"stream":
"yes"` is refused, not read as true), and fields it does not model pass on untouched. The
bounds are the chat request's (max_tokens, lengths) so a Messages request is refused for what
a chat one would be, and Anthropic's own (temperature 0 to 1, max_tokens required).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from router.http.schemas import MaxTokens, Whole


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentBlock(_Open):
    """A content block (text, image, document, tool_use, tool_result, thinking, ...)."""

    type: str = Field(min_length=1, max_length=64)
    text: str | None = None  # a text block's (chat's content parts take a string only)


class TextBlock(_Open):
    type: Literal["text"]
    text: str


class MessageParam(_Open):
    role: Literal["user", "assistant"]
    # As Anthropic's API: a message says something (an empty one is refused there too).
    content: (
        Annotated[str, Field(min_length=1)] | Annotated[list[ContentBlock], Field(min_length=1)]
    )


class ToolParam(_Open):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    # Not null: a custom tool's parameters (a server tool, which has a `type`, may omit it).
    input_schema: dict[str, Any] = Field(default_factory=dict)


class ToolChoiceAuto(_Open):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Open):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Open):
    type: Literal["none"]


class ToolChoiceTool(_Open):
    type: Literal["tool"]
    name: str = Field(min_length=1, max_length=256)  # the tool the model must call
    disable_parallel_tool_use: bool | None = None


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceNone | ToolChoiceTool, Field(discriminator="type")
]


class Metadata(_Open):
    user_id: str | None = Field(default=None, max_length=512)


TopK = Annotated[int, Field(ge=0, le=2**31 - 1), Whole]


class MessagesRequest(_Open):
    """An Anthropic Messages request; fields not listed are passed on unchecked."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: MaxTokens
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: TopK | None = None
    stop_sequences: list[str] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    metadata: Metadata | None = None
