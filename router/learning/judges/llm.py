"""`llm`: a model judges the answers (MT-Bench, Zheng et al. 2023).

Pairwise: the judge sees both answers and names the better one, asked twice with the answers in
both orders to cancel position bias; the same winner both times wins (1 vs 0), anything else is
a tie (0.5 each). Single: each answer graded 1-10 on its own, outcome (grade - 1) / 9.
A verdict is read only in the prompt's own format (`[[A]]`, `[[B]]`, `[[C]]`; `[[7]]`), or as the
structured reply a `json_schema` constraint asks for (`{"verdict": "A"}`, `{"grade": 7}`): a judge
answer without exactly one of them is unparseable, counted, and gives no label. `constrain`
(judges/constrain.py) asks the judge's server to decode only such a verdict; `auto` tries
json_schema, then grammar, then none, and keeps the first the server does not answer with an
error.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from backends.base import Backend, UpstreamClientError, UpstreamError
from backends.config import Price
from backends.usage import usage_cost
from policies.budgets.estimate import worst_case
from router.learning.config import LlmJudgeConfig
from router.learning.judges.base import NO_LABEL, Case, Judgement
from router.learning.judges.constrain import (
    AUTO_ORDER,
    Constraint,
    constrained,
    json_grade,
    json_verdict,
)
from router.learning.judges.prompt import JudgePrompt

log = logging.getLogger(__name__)

PAIRWISE = re.compile(r"\[\[\s*([ABC])\s*\]\]", re.IGNORECASE)
GRADE = re.compile(r"\[\[\s*(10|[1-9])(?:\.0+)?\s*\]\]")


def parse_pairwise(text: str) -> str | None:
    """'A', 'B' or 'C' (tie) when the text names exactly one verdict, else None."""
    found = {m.upper() for m in PAIRWISE.findall(text)}
    return found.pop() if len(found) == 1 else None


def parse_grade(text: str) -> int | None:
    found = {int(m) for m in GRADE.findall(text)}
    return found.pop() if len(found) == 1 else None


def read_pairwise(text: str) -> str | None:
    """A structured verdict, else the prompt's `[[A]]` format (a server may ignore a constraint)."""
    return json_verdict(text) or parse_pairwise(text)


def read_grade(text: str) -> int | None:
    return json_grade(text) or parse_grade(text)


def _content(body: dict[str, Any]) -> str:
    for choice in body.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message")
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                return str(message["content"])
    return ""


class LlmJudge:
    name = "llm"

    def __init__(
        self,
        settings: LlmJudgeConfig,
        prompt: JudgePrompt,
        backend: Backend,
        model: str,
        price: Price,
    ) -> None:
        self.settings = settings
        self.prompt = prompt
        self.backend = backend
        self.model = model
        self.price = price
        # The constraint changes what the judge can answer, so it is part of the version.
        how = settings.constrain
        self.version = prompt.version if how == "none" else f"{prompt.version}+{how}"
        self._order: tuple[Constraint, ...] = AUTO_ORDER if how == "auto" else (how,)
        self._start = 0  # auto: index of the first constraint the server has not refused

    def _bodies(self, case: Case) -> list[dict[str, Any]]:
        q = case.question
        if self.settings.mode == "pairwise":
            a, b = case.answers[0].text, case.answers[1].text
            texts = [
                self.prompt.render(question=q, answer_a=a, answer_b=b),
                self.prompt.render(question=q, answer_a=b, answer_b=a),
            ]
        else:
            texts = [self.prompt.render(question=q, answer=ans.text) for ans in case.answers]
        return [
            {
                "model": self.model,
                "messages": [{"role": "user", "content": t}],
                "max_tokens": self.settings.max_tokens,
                "temperature": self.settings.temperature,
            }
            for t in texts
        ]

    def _judgeable(self, case: Case) -> bool:
        return len(case.answers) >= (2 if self.settings.mode == "pairwise" else 1)

    @property
    def constraint(self) -> Constraint:
        """What the next judge call asks of the server (auto: what it last accepted)."""
        return self._order[self._start]

    def bound_usd(self, case: Case) -> float:
        if not self._judgeable(case):
            return 0.0
        # A call answered with an error is not billed: only the one that answers costs, at most
        # the dearest of the variants that may be sent.
        mode = self.settings.mode
        return sum(
            max(
                worst_case(constrained(b, mode, how), self.price, self.settings.max_tokens).usd
                for how in self._order
            )
            for b in self._bodies(case)
        )

    async def _ask(self, body: dict[str, Any]) -> tuple[str | None, float]:
        """(the judge's text or None when the call failed, its cost). A server that answers a
        constraint with an error (a 4xx; llama-cpp-python answers an unknown response_format
        with a 500) is asked again with the next one. auto remembers the first accepted one
        only once a call with it succeeded, so one over-long prompt's error never downgrades
        the judge for good; a server that cannot be reached at all is not asked again."""
        for i in range(self._start, len(self._order)):
            how = self._order[i]
            try:
                answer = await self.backend.complete(
                    "chat/completions", constrained(body, self.settings.mode, how)
                )
            except (UpstreamError, UpstreamClientError) as exc:
                answered = isinstance(exc, UpstreamClientError) or exc.status is not None
                if answered and i + 1 < len(self._order):
                    log.info(
                        "llm judge: constrain=%s answered with an error (%s); trying %s",
                        how,
                        exc,
                        self._order[i + 1],
                    )
                    continue
                log.warning("llm judge call failed: %s", exc)
                return None, 0.0
            if i > self._start:
                log.warning(
                    "llm judge: the judge's server refuses constrain=%s; using %s",
                    self._order[self._start],
                    how,
                )
                self._start = i
            usage = answer.usage
            cost = usage_cost(self.price, usage)
            return _content(answer.body), cost
        return None, 0.0

    async def judge(self, case: Case) -> Judgement:
        if not self._judgeable(case):
            return NO_LABEL
        replies = await asyncio.gather(*(self._ask(b) for b in self._bodies(case)))
        cost = sum(c for _, c in replies)
        texts = [t for t, _ in replies]
        if any(t is None for t in texts):
            return Judgement(None, cost_usd=cost, failed=True, detail="judge call failed")
        if self.settings.mode == "pairwise":
            return self._pairwise(case, [t or "" for t in texts], cost)
        return self._single(case, [t or "" for t in texts], cost)

    def _pairwise(self, case: Case, texts: list[str], cost: float) -> Judgement:
        first, second = (read_pairwise(t) for t in texts)
        detail = f"order1={first} order2={second}"
        if first is None or second is None:
            return Judgement(None, cost_usd=cost, unparseable=True, detail=detail)
        x, y = case.answers[0].tier, case.answers[1].tier
        # In the second order the letters are swapped: B names the first answer.
        winners = ({"A": x, "B": y}.get(first), {"A": y, "B": x}.get(second))
        if winners[0] is not None and winners[0] == winners[1]:
            win = winners[0]
            return Judgement(
                {x: float(win == x), y: float(win == y)}, verdict=win, cost_usd=cost, detail=detail
            )
        return Judgement({x: 0.5, y: 0.5}, verdict="tie", cost_usd=cost, detail=detail)

    def _single(self, case: Case, texts: list[str], cost: float) -> Judgement:
        grades = [read_grade(t) for t in texts]
        detail = " ".join(f"{a.tier}={g}" for a, g in zip(case.answers, grades, strict=True))
        if any(g is None for g in grades):
            return Judgement(None, cost_usd=cost, unparseable=True, detail=detail)
        outcomes = {
            a.tier: (g - 1) / 9 for a, g in zip(case.answers, grades, strict=True) if g is not None
        }
        return Judgement(outcomes, verdict=detail, cost_usd=cost, detail=detail)
