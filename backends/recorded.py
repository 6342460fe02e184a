"""`kind: replay` tiers: answer from a trace's recorded outcomes and token counts, no model.

Running a trace through the live proxy with replay tiers checks the simulator against the real
request path: same classifier, same policy, same prices, and usage taken from the trace, so the
proxy's decisions and costs must equal the simulator's predictions (tests/simulations/
test_fidelity.py). A request is matched to its record by the text the classifier scores
(trace_format.request_text); a request that is not in the trace is a 400, never a guess.

Reads JSONL traces (a file, or a folder of them) through trace_format/reader.py, the one trace
reader.
Token counts a record lacks are filled as the simulator fills them (simulations/trace.py): prompt
tokens counted from the prompt text with backends/tokens.py, completion tokens 1 (RouteLLM MMLU
answers are one token); run `cost-router simulate --completion-tokens 1` on such a trace for equal
costs.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from backends.base import UpstreamClientError, UpstreamResponse, Usage
from backends.config import TierConfig
from backends.tokens import count_tokens
from trace_format.reader import iter_records, trace_files
from trace_format.request_text import request_text

# Outcome keys of our traces: a replay tier answers as one of these roles.
ROLES = ("large", "small")  # checked in this order: a tier named `large` is large
DEFAULT_COMPLETION_TOKENS = 1


@dataclass(frozen=True, slots=True)
class _Recorded:
    where: str  # "<file>: line N", shown in the answer
    outcome: float  # this tier's recorded quality; NaN when the record has none
    usage: Usage


def _role(tier: TierConfig) -> str:
    for role in ROLES:
        if role in (tier.model, tier.name):
            return role
    raise ValueError(
        f"tier {tier.name!r}: kind 'replay' needs model (or name) to be one of the trace's "
        f"outcome names {' / '.join(repr(r) for r in reversed(ROLES))}"
    )


def _load(tier: TierConfig, role: str, context_turns: int) -> tuple[dict[str, _Recorded], int]:
    """Records by request text (a duplicated prompt answers as its first record), and the count."""
    assert tier.replay_trace, "kind 'replay' tiers have replay_trace (checked by the config)"
    if tier.replay_trace.endswith(".csv"):
        raise ValueError(f"tier {tier.name!r}: replay_trace {tier.replay_trace}: kind 'replay' "
                         "reads JSONL traces (docs/traces.md), not CSV")  # fmt: skip
    by_text: dict[str, _Recorded] = {}
    count = 0
    for path in trace_files([tier.replay_trace]):
        for where, record in iter_records(path):
            count += 1
            text = record.prompt
            if text is None:  # live traces record content only when configured
                text = request_text({"messages": record.messages or []}, context_turns)
            if text in by_text:
                continue
            prompt = count_tokens(text) if record.prompt_tokens is None else record.prompt_tokens
            completion = record.completion_tokens
            by_text[text] = _Recorded(
                where,
                (record.outcomes or {}).get(role, math.nan),
                Usage(prompt, DEFAULT_COMPLETION_TOKENS if completion is None else completion,
                      reported=True),  # fmt: skip
            )
    if not count:
        raise ValueError(f"tier {tier.name!r}: no trace records in {tier.replay_trace}")
    return by_text, count


def _usage_json(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class RecordedBackend:
    required_keys: ClassVar[tuple[str, ...]] = ("replay_trace",)

    def __init__(self, tier: TierConfig, context_turns: int = 2) -> None:
        self.tier = tier.name
        self.model = tier.model
        self._context_turns = context_turns
        self._by_text, self._count = _load(tier, _role(tier), context_turns)

    def _answer(self, body: dict[str, Any]) -> tuple[str, Usage]:
        text = request_text(body, self._context_turns)
        rec = self._by_text.get(text)
        if rec is None:
            message = f"replay tier {self.tier!r}: request not in trace ({text[:60]!r})"
            raise UpstreamClientError(
                400,
                {
                    "error": {
                        "message": message,
                        "type": "invalid_request_error",
                        "code": "replay_miss",
                    }
                },
            )
        return f"[replay {self.tier}: {rec.where}, outcome {rec.outcome:g}]", rec.usage

    async def complete(self, endpoint: str, body: dict[str, Any]) -> UpstreamResponse:
        text, usage = self._answer(body)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            if endpoint == "chat/completions"
            else {"index": 0, "text": text, "finish_reason": "stop"}
        )
        answer = {
            "id": f"replay-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion" if endpoint == "chat/completions" else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": _usage_json(usage),
        }
        return UpstreamResponse(answer, usage)

    async def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        text, usage = self._answer(body)
        chat = endpoint == "chat/completions"
        base = {
            "id": f"replay-{uuid.uuid4().hex[:12]}",
            "created": int(time.time()),
            "model": self.model,
            "object": "chat.completion.chunk" if chat else "text_completion",
        }
        delta = {"delta": {"role": "assistant", "content": text}} if chat else {"text": text}
        events: list[dict[str, Any]] = [
            {**base, "choices": [{"index": 0, **delta, "finish_reason": None}]},
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        **({"delta": {}} if chat else {"text": ""}),
                        "finish_reason": "stop",
                    }
                ],
            },
            {**base, "choices": [], "usage": _usage_json(usage)},
        ]
        for event in events:
            yield b"data: " + orjson.dumps(event) + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def ready(self) -> tuple[bool, str]:
        return True, f"replaying {self._count} records"

    async def aclose(self) -> None:
        return None
