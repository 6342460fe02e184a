"""`POST /v1/embeddings`: passed through to the tier `embeddings.tier` names, unrouted.

No classifier and no policy: an embedding model is its own tier. The request still goes through
the budget gate like every other: it reserves its worst case (every input token at the tier's
prompt price, policies/budgets/estimate.py; no completion), is charged from the usage the
upstream reports (prompt tokens only, checked like any usage; our own count when there is none or
it is implausible), and is traced. `handle(state, request, "embeddings", embed)` runs these steps
inside the request path's error handling and finish().
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from backends.base import Usage
from backends.tokens import count_tokens
from backends.usage import read_usage, usage_json
from router.http.body_limits import require_json
from router.http.errors import RouterError, json_response, validation_message
from router.http.schemas import MAX_TOKEN_ID, TokenIds, Whole, write_back
from router.proxy.disconnect import until_disconnect
from router.proxy.request_path import (
    Call,
    ClientGone,
    call_tiers,
    finish_once,
    identify,
    parse_body,
    read_body,
)
from router.proxy.state import RouterState
from router.proxy.usage_guard import checked_usage, priced

ENDPOINT = "embeddings"
MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request


Inputs = Field(min_length=1, max_length=MAX_INPUTS)


class EmbeddingRequest(BaseModel):
    """An OpenAI embeddings request; fields not listed are forwarded unchecked (but `stream`:
    embeddings do not stream)."""

    # The schema states `_checked`'s rules: 1 to MAX_INPUTS inputs, no `stream`.
    model_config = ConfigDict(
        extra="allow", strict=True, json_schema_extra={"not": {"required": ["stream"]}}
    )
    model: str = Field(min_length=1, max_length=256)
    input: (
        str
        | Annotated[list[str], Inputs]
        | Annotated[TokenIds, Inputs]
        | Annotated[list[TokenIds], Inputs]
    ) = Field(description="text, texts, or token ids to embed")
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1, le=65536), Whole] | None = None
    user: str | None = None


def _checked(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RouterError(400, "invalid_request", "request body must be a JSON object")
    try:
        request = EmbeddingRequest.model_validate(body)
        write_back(body, request)  # 58.0 -> 58 where an integer is due: the upstream reads that
    except ValidationError as exc:
        problems = list(exc.errors(include_url=False))
        if problems and problems[0]["loc"][:1] == ("input",):  # one sentence for the union
            raise RouterError(
                400,
                "invalid_request",
                f"'input': expected a string, or 1 to {MAX_INPUTS} strings or token "
                f"ids (a list of integers from 0 to {MAX_TOKEN_ID}, or of lists of them)",
                "input",
            ) from None
        message, param = validation_message(problems)
        raise RouterError(400, "invalid_request", message, param) from None
    if isinstance(request.input, list) and not 1 <= len(request.input) <= MAX_INPUTS:
        raise RouterError(
            400, "invalid_request", f"'input': give 1 to {MAX_INPUTS} inputs", "input"
        )
    if "stream" in body:
        raise RouterError(400, "invalid_request", "'stream': embeddings do not stream", "stream")
    return body


def counted(body: dict[str, Any]) -> Usage:
    """Our own count of the input tokens (token ids count as themselves)."""
    raw = body.get("input")
    items = raw if isinstance(raw, list) and raw and not isinstance(raw[0], int) else [raw]
    total = sum(len(i) if isinstance(i, list) else count_tokens(str(i)) for i in items)
    return Usage(total, 0, reported=False)


def reported(body: dict[str, Any], answer: dict[str, Any]) -> Usage:
    """The upstream's usage: embeddings report prompt tokens only (`completion_tokens` absent
    is no fault here); absent or broken usage is our own count, keeping its fault."""
    raw = answer.get("usage")
    if isinstance(raw, dict) and "completion_tokens" not in raw:
        raw = {**raw, "completion_tokens": 0}
    usage = read_usage(raw)
    if usage is not None and usage.fault is None:
        return usage
    own = counted(body)
    own.fault = usage.fault if usage is not None else None
    return own


async def embed(state: RouterState, request: Request, call: Call) -> Response:
    """The steps of one embeddings request (the request path's `handle` runs them)."""
    call.identity = await identify(state, request)
    name = state.config.embeddings.tier
    if name is None:
        raise RouterError(
            404,
            "not_found",
            "this proxy serves no embeddings: set "
            "embeddings.tier in its config to the tier of an embedding model",
        )
    require_json(request.scope)
    body = _checked(parse_body(await read_body(request, state.limits.max_body_bytes)))
    tier = state.tiers[name]
    call.requested_model, call.tier, call.reason = body["model"], tier.name, "embeddings.tier"
    call.body = body
    # --- budget: reserve (settled or released in finish(), whatever happens next) ------------
    call.marks.start("budget")
    admitted = await state.budgets.reserve(call.id, call.identity, body, [tier], endpoint=ENDPOINT)
    call.hold(admitted.reserved_nanos)
    call.marks.end("budget")
    # -----------------------------------------------------------------------------------------
    _, answer = await until_disconnect(request, call_tiers(state, call, body, [tier]), ClientGone)
    bound = state.budgets.usage_bound(body, ENDPOINT, tier, call.reserved_nanos)
    usage = checked_usage(reported(body, answer.body), bound, lambda: counted(body))
    out = answer.body
    if not usage.reported:  # the client sees what it is charged for, marked as our count
        out = {**out, "usage": usage_json(usage)}
    model = answer.body.get("model")
    model = model if isinstance(model, str) else tier.model
    call.charge(usage, priced(usage, tier.price, bound), model, None)  # vectors: none to compare
    finish_once(state, call)
    return json_response(200, out, call.headers())
