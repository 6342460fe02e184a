"""The judge contract.

A judge gets the answers a request received (`Case`: the request, the tier that answered the
client, and the shadow tier's answer when there is one) and returns a `Judgement`: outcomes per
tier in [0, 1] (the trace's `outcomes` meaning), or none when it cannot tell (no reference, an
unparseable verdict). A judge never guesses and never raises on odd answer text. What judging
may cost is bounded up front (`bound_usd`) so the caller can reserve it against the shadow cap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from trace_format.labels import LabelRecord


@dataclass(frozen=True, slots=True)
class Answer:
    tier: str
    text: str


@dataclass(frozen=True, slots=True)
class Case:
    request_id: str
    question: str  # the request's text (trace_format.request_text)
    answers: tuple[Answer, ...]  # the client's answer first, then the shadow answer (if any)
    body: dict[str, Any] = field(default_factory=dict)  # the request as the client sent it
    feedback: float | None = None  # a user's score of the first answer, in [0, 1]

    @property
    def metadata(self) -> dict[str, Any]:
        meta = self.body.get("metadata")
        return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True, slots=True)
class Judgement:
    outcomes: dict[str, float] | None  # None: no label
    verdict: str | None = None  # the judge's own words: A, B, tie, a grade, match, ...
    cost_usd: float = 0.0  # what judging this case cost (spent even when there is no label)
    unparseable: bool = False  # the judge answered but its verdict could not be read
    failed: bool = False  # the judge could not be asked (its model's server failed)
    detail: str | None = None

    def label(self, request_id: str, judge: str, version: str) -> LabelRecord | None:
        if not self.outcomes:
            return None
        return LabelRecord(
            request_id=request_id,
            judge=judge,
            judge_version=version,
            outcomes=self.outcomes,
            cost_usd=self.cost_usd,
            verdict=self.verdict,
            detail=self.detail,
        )


NO_LABEL = Judgement(None)


class Judge(Protocol):
    name: str  # its `judges/registry.py` kind: llm, reference, feedback
    version: str  # changes whenever its verdicts could (the llm judge: prompt name + hash)

    def bound_usd(self, case: Case) -> float:
        """An upper bound of what `judge(case)` may cost (0 for judges that call no model)."""
        ...

    async def judge(self, case: Case) -> Judgement: ...
