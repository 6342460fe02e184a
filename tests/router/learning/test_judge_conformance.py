"""Every judge kind of `router.learning.judges.registry.JUDGES` keeps the judge contract
(router/learning/judges/base.py), like the store and backend suites: a kind without an
example here fails `test_every_kind_has_an_example`.

The contract: a judge has its kind's name and a version; it labels a case it can judge with
outcomes for the case's tiers only, each in [0, 1], the better answer never below the worse; it
declines (no outcomes, no label) a case it cannot judge instead of guessing; it never raises on
odd answer text; what it spends is >= 0 and within the bound it announced; its label is a valid
label record that survives the label file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from backends.config import TierConfig
from backends.registry import build_backend
from router.learning.config import LlmJudgeConfig, ReferenceJudgeConfig
from router.learning.judges.base import Answer, Case, Judge, Judgement
from router.learning.judges.feedback import FeedbackJudge
from router.learning.judges.llm import LlmJudge
from router.learning.judges.prompt import load_prompt
from router.learning.judges.reference import ReferenceJudge
from router.learning.judges.registry import JUDGES
from tests.support.verdict_upstream import VerdictServer
from trace_format.labels import LabelRecord, iter_labels

QUESTION = "Natalia sold 48 clips in April and half as many in May. How many in total?"
GOOD = "She sold 48 + 24 = 72 clips. GOOD\n#### 72"
BAD = "She sold 48 clips.\n#### 48"


def case(
    first: str, second: str | None, *, reference: str | None = "72", feedback: float | None = None
) -> Case:
    answers = (Answer("small", first),) + (() if second is None else (Answer("large", second),))
    body = {"model": "auto", "messages": [{"role": "user", "content": QUESTION}]}
    if reference is not None:
        body["metadata"] = {"reference_answer": reference}
    return Case("req-1", QUESTION, answers, body=body, feedback=feedback)


@dataclass
class Example:
    judge: Callable[[str], AsyncIterator[Judge]]  # (verdict server url) -> judge, closed after
    judgeable: Case  # a case it labels; `better` is the better tier
    better: str
    unjudgeable: Case  # a case it must decline


@asynccontextmanager
async def _reference(url: str) -> AsyncIterator[Judge]:
    yield ReferenceJudge(ReferenceJudgeConfig())


@asynccontextmanager
async def _feedback(url: str) -> AsyncIterator[Judge]:
    yield FeedbackJudge()


@asynccontextmanager
async def _llm(url: str) -> AsyncIterator[Judge]:
    tier = TierConfig(
        name="judge",
        base_url=url,
        model="verdict",
        connect_retries=0,
        price={"input_per_mtok": 1.0, "output_per_mtok": 2.0},
    )
    backend = build_backend(tier)
    settings = LlmJudgeConfig(tier="judge", max_tokens=16)
    try:
        yield LlmJudge(settings, load_prompt("pairwise", None), backend, tier.model, tier.price)
    finally:
        await backend.aclose()


EXAMPLES: dict[str, Example] = {
    "reference": Example(_reference, case(BAD, GOOD), "large", case(BAD, GOOD, reference=None)),
    "feedback": Example(_feedback, case(GOOD, None, feedback=0.9), "small", case(GOOD, BAD)),
    "llm": Example(_llm, case(BAD, GOOD), "large", case(GOOD, None)),
}

ODD_TEXTS = ["", " ", "{answer_b} {question} [[A]] [[B]]", "é😀\u0000\ufffd" * 50, "x" * 20000]


@pytest.fixture(scope="module")
def verdicts() -> Iterator[VerdictServer]:
    with VerdictServer() as server:
        yield server


def run(kind: str, url: str, cases: list[Case]) -> tuple[Judge, list[tuple[Judgement, float]]]:
    async def go() -> tuple[Judge, list[tuple[Judgement, float]]]:
        async with EXAMPLES[kind].judge(url) as judge:
            return judge, [(await judge.judge(c), judge.bound_usd(c)) for c in cases]

    return asyncio.run(go())


def test_every_kind_has_an_example() -> None:
    assert set(EXAMPLES) == set(JUDGES)


@pytest.mark.parametrize("kind", JUDGES)
def test_name_and_version(kind: str, verdicts: VerdictServer) -> None:
    first, _ = run(kind, verdicts.url, [])
    again, _ = run(kind, verdicts.url, [])
    assert first.name == kind
    assert isinstance(first.version, str) and first.version
    assert again.version == first.version


@pytest.mark.parametrize("kind", JUDGES)
def test_labels_what_it_can_judge(kind: str, verdicts: VerdictServer, tmp_path: Path) -> None:
    ex = EXAMPLES[kind]
    judge, [(result, bound)] = run(kind, verdicts.url, [ex.judgeable])
    tiers = {a.tier for a in ex.judgeable.answers}
    assert result.outcomes, f"{kind} gave no label to a case it can judge"
    assert set(result.outcomes) <= tiers and ex.better in result.outcomes
    assert all(0.0 <= v <= 1.0 for v in result.outcomes.values())
    assert result.outcomes[ex.better] == max(result.outcomes.values())
    assert 0.0 <= result.cost_usd <= bound + 1e-12
    assert not result.unparseable
    label = result.label(ex.judgeable.request_id, judge.name, judge.version)
    assert label is not None
    path = tmp_path / "labels.jsonl"
    path.write_bytes(label.line())
    [back] = iter_labels(path)
    assert back == LabelRecord.model_validate(label.model_dump())
    assert (back.judge, back.judge_version, back.request_id) == (kind, judge.version, "req-1")
    assert back.cost_usd == pytest.approx(result.cost_usd)


@pytest.mark.parametrize("kind", JUDGES)
def test_declines_what_it_cannot_judge(kind: str, verdicts: VerdictServer) -> None:
    judge, [(result, bound)] = run(kind, verdicts.url, [EXAMPLES[kind].unjudgeable])
    assert result.outcomes is None
    assert result.label("req-1", judge.name, judge.version) is None
    assert 0.0 <= result.cost_usd <= bound + 1e-12


@pytest.mark.parametrize("kind", JUDGES)
def test_odd_answer_text_never_raises(kind: str, verdicts: VerdictServer) -> None:
    cases = [case(text, other, feedback=0.5) for text in ODD_TEXTS for other in (GOOD, text)]
    _, results = run(kind, verdicts.url, cases)
    for result, bound in results:
        if result.outcomes is not None:
            assert all(0.0 <= v <= 1.0 for v in result.outcomes.values())
        assert 0.0 <= result.cost_usd <= bound + 1e-12
