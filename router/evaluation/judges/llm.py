"""`llm`: a model judges the answers (MT-Bench, Zheng et al. 2023).

Pairwise: the judge sees both answers and names the better one, asked twice with the answers in
both orders to cancel position bias; the same winner both times wins (1 vs 0), anything else is
a tie (0.5 each). Single: each answer graded 1-10 on its own, outcome (grade - 1) / 9.
A verdict is read only in the prompt's own format (`[[A]]`, `[[B]]`, `[[C]]`; `[[7]]`): a judge
answer without exactly one of them is unparseable, counted, and gives no label.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from backends.base import Backend, UpstreamClientError, UpstreamError
from backends.config import Price
from policies.budgets.estimate import worst_case
from router.evaluation.config import LlmJudgeConfig
from router.evaluation.judges.base import NO_LABEL, Case, Judgement
from router.evaluation.judges.prompt import JudgePrompt

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


def _content(body: dict[str, Any]) -> str:
    for choice in body.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message")
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                return str(message["content"])
    return ""


class LlmJudge:
    name = "llm"

    def __init__(self, settings: LlmJudgeConfig, prompt: JudgePrompt, backend: Backend,
                 model: str, price: Price) -> None:  # fmt: skip
        self.settings = settings
        self.prompt = prompt
        self.backend = backend
        self.model = model
        self.price = price
        self.version = prompt.version

    def _bodies(self, case: Case) -> list[dict[str, Any]]:
        q = case.question
        if self.settings.mode == "pairwise":
            a, b = case.answers[0].text, case.answers[1].text
            texts = [self.prompt.render(question=q, answer_a=a, answer_b=b),
                     self.prompt.render(question=q, answer_a=b, answer_b=a)]  # fmt: skip
        else:
            texts = [self.prompt.render(question=q, answer=ans.text) for ans in case.answers]
        return [{"model": self.model, "messages": [{"role": "user", "content": t}],
                 "max_tokens": self.settings.max_tokens,
                 "temperature": self.settings.temperature} for t in texts]  # fmt: skip

    def _judgeable(self, case: Case) -> bool:
        return len(case.answers) >= (2 if self.settings.mode == "pairwise" else 1)

    def bound_usd(self, case: Case) -> float:
        if not self._judgeable(case):
            return 0.0
        return sum(worst_case(b, self.price, self.settings.max_tokens).usd
                   for b in self._bodies(case))  # fmt: skip

    async def _ask(self, body: dict[str, Any]) -> tuple[str | None, float]:
        """(the judge's text or None when the call failed, its cost)."""
        try:
            answer = await self.backend.complete("chat/completions", body)
        except (UpstreamError, UpstreamClientError) as exc:
            log.warning("llm judge call failed: %s", exc)
            return None, 0.0
        usage = answer.usage
        return _content(answer.body), self.price.cost(usage.prompt_tokens, usage.completion_tokens)

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
        first, second = (parse_pairwise(t) for t in texts)
        detail = f"order1={first} order2={second}"
        if first is None or second is None:
            return Judgement(None, cost_usd=cost, unparseable=True, detail=detail)
        x, y = case.answers[0].tier, case.answers[1].tier
        # In the second order the letters are swapped: B names the first answer.
        winners = ({"A": x, "B": y}.get(first), {"A": y, "B": x}.get(second))
        if winners[0] is not None and winners[0] == winners[1]:
            win = winners[0]
            return Judgement({x: float(win == x), y: float(win == y)}, verdict=win,
                             cost_usd=cost, detail=detail)  # fmt: skip
        return Judgement({x: 0.5, y: 0.5}, verdict="tie", cost_usd=cost, detail=detail)

    def _single(self, case: Case, texts: list[str], cost: float) -> Judgement:
        grades = [parse_grade(t) for t in texts]
        detail = " ".join(f"{a.tier}={g}" for a, g in zip(case.answers, grades, strict=True))
        if any(g is None for g in grades):
            return Judgement(None, cost_usd=cost, unparseable=True, detail=detail)
        outcomes = {a.tier: (g - 1) / 9 for a, g in zip(case.answers, grades, strict=True)
                    if g is not None}  # fmt: skip
        return Judgement(outcomes, verdict=detail, cost_usd=cost, detail=detail)
