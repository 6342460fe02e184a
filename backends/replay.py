"""`kind: replay` tiers: answer from a trace's recorded outcomes and token counts, no model.

Running a trace through the live proxy with replay tiers checks the simulator against the real
request path: same classifier, same policy, same prices, and usage taken from the trace, so the
proxy's decisions and costs must equal the simulator's predictions (tests/test_sim_fidelity.py).
A request is matched to its record by the text the classifier scores (classifiers.features.
request_text); a request that is not in the trace is a 400, never a guess. Token counts the
trace lacks are filled as the simulator does (simulations.trace): prompt tokens counted with
tiktoken, completion tokens from the model's recorded answer, else 1 (RouteLLM MMLU answers are one
token); run `cost-router simulate --completion-tokens 1` on such a trace for equal costs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from backends.base import UpstreamClientError, UpstreamResponse, Usage
from classifiers.features import request_text
from router.config import TierConfig
from simulations.trace import LARGE, SMALL, load_trace


class ReplayBackend:
    def __init__(self, tier: TierConfig, context_turns: int = 2) -> None:
        assert tier.replay_trace, "kind 'replay' tiers have replay_trace (checked by the config)"
        self.tier = tier.name
        self.model = tier.model
        self._context_turns = context_turns
        trace = load_trace([tier.replay_trace], default_completion_tokens=1, require_outcomes=False)
        names = trace.role_names
        if tier.model in (names[LARGE], "large") or tier.name == names[LARGE]:
            self._role = LARGE
        elif tier.model in (names[SMALL], "small") or tier.name == names[SMALL]:
            self._role = SMALL
        else:
            raise ValueError(
                f"tier {tier.name!r}: kind 'replay' needs model (or name) to be one of the "
                f"trace's outcome names {names[SMALL]!r} / {names[LARGE]!r}"
            )
        self._by_text: dict[str, int] = {}
        for i, text in enumerate(trace.texts):
            self._by_text.setdefault(text, i)  # duplicated prompts answer as their first record
        self._trace = trace

    def _record(self, body: dict[str, Any]) -> int:
        text = request_text(body, self._context_turns)
        i = self._by_text.get(text)
        if i is None:
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
        return i

    def _answer(self, i: int) -> tuple[str, Usage]:
        quality = float(self._trace.quality[i, self._role])
        usage = Usage(
            int(self._trace.prompt_tokens[i]),
            int(self._trace.completion_tokens[i, self._role]),
            reported=True,
        )
        return f"[replay {self.tier}: {self._trace.record(i)}, outcome {quality:g}]", usage

    async def complete(self, endpoint: str, body: dict[str, Any]) -> UpstreamResponse:
        text, usage = self._answer(self._record(body))
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
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
        }
        return UpstreamResponse(answer, usage)

    async def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        text, usage = self._answer(self._record(body))
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
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                },
            },
        ]
        for event in events:
            yield b"data: " + orjson.dumps(event) + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def ready(self) -> tuple[bool, str]:
        return True, f"replaying {len(self._trace)} records"

    async def aclose(self) -> None:
        return None
