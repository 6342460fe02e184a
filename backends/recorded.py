"""`kind: replay` tiers: answer from a trace's recorded outcomes and token counts, no model.

Running a trace through the live proxy with replay tiers checks the simulator against the real
request path: same classifier, same policy, same prices, and usage taken from the trace, so the
proxy's decisions and costs must equal the simulator's predictions (tests/simulations/
test_fidelity.py). A request is matched to its record by the text the classifier scores
(trace_format.request_text); a request that is not in the trace is a 400, never a guess.

`replay_trace` is a file or a folder, walked as the simulator walks it (trace_format.reader.
data_files: recursively, rotated traces oldest first, never the feedback or contamination file).
JSONL traces are read through trace_format/reader.py, the one trace reader, and RouteLLM CSV files
(`.csv`) through trace_format/routellm_csv.py, the one CSV reader, dropping contaminated prompts
(listed next to or above the CSV, up to the folder given) as the simulator does by default.
Parquet traces are for the simulator only: a `.parquet` replay_trace is refused.
Token counts a record lacks are filled as the simulator fills them (simulations/trace.py): prompt
tokens counted from the prompt text with backends/tokens.py, completion tokens from the tier's
recorded answer (a CSV's `<model>_response` column), else 1 (RouteLLM MMLU answers are one
token); run `cost-router simulate --completion-tokens 1` on such a trace for equal costs.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from backends.base import UpstreamClientError, UpstreamResponse, Usage
from backends.config import TierConfig
from backends.tokens import count_tokens
from trace_format.reader import TraceFormatError, data_files, is_csv_file, iter_records
from trace_format.request_text import request_text
from trace_format.routellm_csv import DEFAULT_LARGE, DEFAULT_SMALL, iter_rows

# Outcome keys of our traces: a replay tier answers as one of these roles.
ROLES = ("large", "small")  # checked in this order: a tier named `large` is large
# A RouteLLM CSV's outcome column of each role (the simulator's defaults, classifiers/dataset.py).
CSV_COLUMNS = {"small": DEFAULT_SMALL, "large": DEFAULT_LARGE}
DEFAULT_COMPLETION_TOKENS = 1


@dataclass(frozen=True, slots=True)
class _Recorded:
    where: str  # "<file>: line N", shown in the answer
    outcome: float  # this tier's recorded quality; NaN when the record has none
    usage: Usage


def _files(tier: TierConfig) -> list[Path]:
    """The files `replay_trace` names (the one walker); a Parquet trace is refused by name."""
    assert tier.replay_trace, "kind 'replay' tiers have replay_trace (checked by the config)"
    if Path(tier.replay_trace).suffix == ".parquet":
        raise TraceFormatError(
            f"tier {tier.name!r}: {tier.replay_trace}: Parquet traces are for the simulator "
            "(`cost-router simulate`); a replay tier reads a JSONL trace, a RouteLLM CSV or a "
            "folder of them"
        )
    return data_files(tier.replay_trace)


def _role(tier: TierConfig, csv: bool) -> str:
    """The outcome role the tier answers as: its model or name is the role, or (when the trace
    holds CSVs) the role's outcome column."""
    for role in ROLES:
        names = {role, CSV_COLUMNS[role]} if csv else {role}
        if names & {tier.model, tier.name}:
            return role
    outcome_names = " / ".join(repr(CSV_COLUMNS[r] if csv else r) for r in reversed(ROLES))
    raise ValueError(
        f"tier {tier.name!r}: kind 'replay' needs model (or name) to be one of the trace's "
        f"outcome names {outcome_names}" + (" (or 'small' / 'large')" if csv else "")
    )


def _completion(recorded: int | None, answer: str | None) -> int:
    # As simulations/trace.py: the recorded count, else the recorded answer's tokens, else 1.
    if recorded is not None:
        return recorded
    return count_tokens(answer) if answer else DEFAULT_COMPLETION_TOKENS


def _read_jsonl(path: Path, role: str, context_turns: int) -> Iterator[tuple[str, _Recorded]]:
    for where, record in iter_records(path):
        text = record.prompt
        if text is None:  # live traces record content only when configured
            text = request_text({"messages": record.messages or []}, context_turns)
        prompt = count_tokens(text) if record.prompt_tokens is None else record.prompt_tokens
        usage = Usage(prompt, _completion(record.completion_tokens, None), reported=True)
        yield text, _Recorded(where, (record.outcomes or {}).get(role, math.nan), usage)


def _read_csv(path: Path, root: Path, role: str) -> Iterator[tuple[str, _Recorded]]:
    # `root` (what replay_trace names) bounds the search for contamination files, as the
    # simulator's loader does (classifiers/dataset.py).
    for row in iter_rows(path, CSV_COLUMNS["small"], CSV_COLUMNS["large"], root=root):
        if row.contaminated:  # the simulator drops these by default
            continue
        large = role == "large"
        answer = row.large_response if large else row.small_response
        usage = Usage(count_tokens(row.prompt), _completion(None, answer), reported=True)
        yield row.prompt, _Recorded(row.where, row.large if large else row.small, usage)


def _load(
    tier: TierConfig, files: list[Path], role: str, context_turns: int
) -> tuple[dict[str, _Recorded], int]:
    """Records by request text (a duplicated prompt answers as its first record), and the count."""
    assert tier.replay_trace, "kind 'replay' tiers have replay_trace (checked by the config)"
    root = Path(tier.replay_trace)
    by_text: dict[str, _Recorded] = {}
    count = 0
    for path in files:
        records = (
            _read_csv(path, root, role)
            if is_csv_file(path)
            else _read_jsonl(path, role, context_turns)
        )
        for text, recorded in records:
            count += 1
            by_text.setdefault(text, recorded)
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
    def __init__(self, tier: TierConfig, context_turns: int = 2) -> None:
        self.tier = tier.name
        self.model = tier.model
        self._context_turns = context_turns
        files = _files(tier)
        role = _role(tier, any(is_csv_file(f) for f in files))
        self._by_text, self._count = _load(tier, files, role, context_turns)

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
                public=message,
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
