"""Request validation for the OpenAI endpoints.

The models only *check* a body: the proxy forwards the client's original dict, so fields we don't
model (tools, response_format, logit_bias, vendor extensions...) pass through untouched. Strict
mode keeps what we check equal to what the upstream receives: ``"stream": "yes"`` is rejected
rather than silently read as true by us and as a string by the upstream.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.errors import RouterError, validation_message


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(_Open):
    include_usage: bool = False


Penalty = Annotated[float, Field(ge=-2, le=2)]


class _Common(_Open):
    model: str = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=128)
    stop: str | list[str] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    user: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]


SCHEMAS: dict[str, type[_Common]] = {
    "chat/completions": ChatCompletionRequest,
    "completions": CompletionRequest,
}


def validate_body(endpoint: str, body: Any) -> None:
    """Raise a 400/422 RouterError naming the first offending field; the body stays a dict."""
    if not isinstance(body, dict):
        raise RouterError(400, "invalid_request", "request body must be a JSON object")
    try:
        SCHEMAS[endpoint].model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors(include_url=False)))
        raise RouterError(422, "invalid_request", message, param) from None

