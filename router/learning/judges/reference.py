"""`reference`: each answer is right (1) or wrong (0) against a reference answer carried in the
request's metadata (`metadata.reference_answer`), for eval suites with known answers.

Numeric match reads the last number of the answer, as GSM8K graders do ("... so she has 18
eggs." and "#### 18" both answer 18); thousands separators and a leading currency sign are
allowed. Exact match compares trimmed, case-folded text without a trailing full stop.
"""

from __future__ import annotations

import math
import re

from router.learning.config import ReferenceJudgeConfig
from router.learning.judges.base import NO_LABEL, Case, Judgement

NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\$?\.\d+")
# A reference that is only a number (GSM8K's "#### 18" included): auto mode matches it numerically.
PLAIN_NUMBER = re.compile(r"^\s*(?:####\s*)?-?\$?(?:\d[\d,]*(?:\.\d+)?|\.\d+)\s*$")


def last_number(text: str) -> float | None:
    for token in reversed(NUMBER.findall(text)):
        cleaned = token.replace(",", "").replace("$", "")
        try:
            value = float(cleaned)
        except ValueError:
            continue
        if math.isfinite(value):
            return value
    return None


def _normal(text: str) -> str:
    return " ".join(text.strip().casefold().split()).rstrip(".")


class ReferenceJudge:
    name = "reference"

    def __init__(self, settings: ReferenceJudgeConfig) -> None:
        self.settings = settings
        self.version = f"v1:{settings.match}"

    def bound_usd(self, case: Case) -> float:
        return 0.0

    def _reference(self, case: Case) -> str | None:
        ref = case.metadata.get(self.settings.metadata_key)
        if isinstance(ref, bool) or not isinstance(ref, str | int | float):
            return None
        ref = str(ref).strip()
        return ref or None

    def matches(self, answer: str, reference: str) -> bool:
        mode = self.settings.match
        if mode == "numeric" or (mode == "auto" and PLAIN_NUMBER.match(reference)):
            want, got = last_number(reference), last_number(answer)
            return (
                want is not None and got is not None and abs(got - want) <= self.settings.tolerance
            )
        return _normal(answer) == _normal(reference)

    async def judge(self, case: Case) -> Judgement:
        reference = self._reference(case)
        if reference is None or not case.answers:
            return NO_LABEL
        outcomes = {a.tier: 1.0 if self.matches(a.text, reference) else 0.0 for a in case.answers}
        verdict = ",".join(f"{t}={'match' if v else 'miss'}" for t, v in outcomes.items())
        return Judgement(outcomes, verdict=verdict)
