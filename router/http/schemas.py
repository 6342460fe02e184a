"""Request validation for the OpenAI endpoints.

The models only *check* a body: the proxy forwards the client's original dict, so fields we don't
model (tools, response_format, logit_bias, vendor extensions...) pass through untouched. Strict
mode keeps what we check equal to what the upstream receives: ``"stream": "yes"`` is rejected
rather than silently read as true by us and as a string by the upstream.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from router.http.errors import RouterError, validation_message


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


# Past 2**53 a float no longer names one integer, and the JSON parser (orjson) reads integers
# past 64 bits as floats: a seed of -(2**63) - 1 arrives as -9.223372036854776e18, which must not
# pass as -(2**63). So only floats within it are taken as the integer they spell.
EXACT_FLOAT_INT = 2**53


def _whole(value: Any) -> Any:
    # 58.0 -> 58; 58.5, huge floats and non-numbers are left to the integer check (refused).
    if isinstance(value, float) and value.is_integer() and abs(value) <= EXACT_FLOAT_INT:
        return int(value)
    return value


Whole = BeforeValidator(_whole)
Penalty = Annotated[float, Field(ge=-2, le=2)]

# Token bounds: far above any model's context, far below what the budget arithmetic can hold
# (worst case = max_tokens x choices x price in integer nanos, summed in Redis's 64-bit counters).
MAX_TOKENS = 2**31 - 1
MAX_CHOICES = 128
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS), Whole]
Choices = Annotated[int, Field(ge=1, le=MAX_CHOICES), Whole]
# OpenAI's seed is a 64-bit signed integer; larger ones would reach the upstream unchecked.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1), Whole]
# A token id indexes a vocabulary: none comes near 2**31 (tokenizers store them as int32). The
# JSON parser reads integers past 64 bits as floats; bounded here, they are refused as the schema
# says, not by a type error the schema cannot state.
MAX_TOKEN_ID = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID), Whole]
TokenIds = list[TokenId]


class _Common(_Open):
    model: str = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: Choices | None = None
    stop: str | list[str] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    user: str | None = None


class ChatCompletionRequest(_Common):
    """An OpenAI chat completion request; fields not listed are forwarded unchecked."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: MaxTokens | None = None


class CompletionRequest(_Common):
    """An OpenAI (legacy) completion request; fields not listed are forwarded unchecked."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    best_of: Choices | None = None  # generates (and bills) this many choices, like n


SCHEMAS: dict[str, type[_Common]] = {
    "chat/completions": ChatCompletionRequest,
    "completions": CompletionRequest,
}


def validate_body(endpoint: str, body: Any) -> None:
    """Raise a 400 RouterError naming the first offending field; the body stays a dict (its whole
    floats in integer fields made integers: `write_back`)."""
    if not isinstance(body, dict):
        raise RouterError(400, "invalid_request", "request body must be a JSON object")
    try:
        validated = SCHEMAS[endpoint].model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors(include_url=False)))
        raise RouterError(400, "invalid_request", message, param) from None
    write_back(body, validated)


def write_back(body: dict[str, Any], validated: BaseModel) -> None:
    """Each modelled field of `body` that held a float where the model made an integer (58.0 in
    `max_tokens`, token ids) gets the integer: the budget and the upstream then read one value."""
    for name in type(validated).model_fields:
        if name in body and _has_float(body[name]):
            value = getattr(validated, name)
            if not _has_float(value):
                body[name] = value


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    return isinstance(value, list) and any(_has_float(v) for v in value)
