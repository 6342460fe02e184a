"""The batched scoring step (router/proxy/score_batch.py) on the shipped classifier: requests
that reach it in one loop turn share one onnxruntime call and get the scores they get alone."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from classifiers.inference import DifficultyScorer
from router.proxy.score_batch import ScoreBatcher

PROMPTS = [
    "What is 2+2?",
    "Explain general relativity to a physics graduate, with the field equations.",
    "Which is a prime? A) 4 B) 6 C) 7 D) 9",
    "hello",
    "Write a Python function that merges k sorted lists in O(n log k).",
]


def body(text: str) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}]}


class Counting:
    """The shipped scorer, counting its calls (what the batcher asked of it)."""

    def __init__(self, scorer: DifficultyScorer) -> None:
        self.scorer = scorer
        self.batches: list[int] = []
        self.singles = 0

    def score_request(self, body: Mapping[str, Any], context_turns: int | None = None) -> float:
        self.singles += 1
        return self.scorer.score_request(body, context_turns)

    def score_requests(
        self, bodies: Sequence[Mapping[str, Any]], context_turns: int | None = None
    ) -> Sequence[float]:
        self.batches.append(len(bodies))
        return self.scorer.score_requests(bodies, context_turns)


@pytest.fixture(scope="module")
def scorer() -> DifficultyScorer:
    return DifficultyScorer.load(None)


def test_concurrent_requests_share_one_call_and_score_as_alone(scorer: DifficultyScorer) -> None:
    counting = Counting(scorer)
    batcher = ScoreBatcher()

    async def main() -> list[float]:
        return list(await asyncio.gather(*(batcher.score(counting, body(p), 2) for p in PROMPTS)))

    scores = asyncio.run(main())
    assert counting.batches == [len(PROMPTS)] and counting.singles == 0
    assert scores == [scorer.score_request(body(p), 2) for p in PROMPTS]  # exactly


def test_a_request_alone_is_scored_alone(scorer: DifficultyScorer) -> None:
    counting = Counting(scorer)
    batcher = ScoreBatcher()

    async def main() -> list[float]:
        return [await batcher.score(counting, body(p), 2) for p in PROMPTS[:2]]

    assert asyncio.run(main()) == [scorer.score_request(body(p), 2) for p in PROMPTS[:2]]
    assert counting.batches == [] and counting.singles == 2


def test_different_context_turns_are_not_mixed(scorer: DifficultyScorer) -> None:
    counting = Counting(scorer)
    batcher = ScoreBatcher()
    chat = {
        "model": "auto",
        "messages": [
            {"role": "user", "content": PROMPTS[1]},
            {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": PROMPTS[0]},
        ],
    }

    async def main() -> list[float]:
        jobs = [batcher.score(counting, chat, t) for t in (1, 2, 1, 2)]
        return list(await asyncio.gather(*jobs))

    scores = asyncio.run(main())
    assert sorted(counting.batches) == [2, 2]
    assert scores == [scorer.score_request(chat, t) for t in (1, 2, 1, 2)]


def test_a_cancelled_waiter_is_skipped_and_the_others_scored(scorer: DifficultyScorer) -> None:
    counting = Counting(scorer)
    batcher = ScoreBatcher()

    async def main() -> list[Any]:
        tasks = [asyncio.ensure_future(batcher.score(counting, body(p), 2)) for p in PROMPTS[:3]]
        await asyncio.sleep(0)  # every task is waiting in the batch
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(main())
    assert isinstance(results[1], asyncio.CancelledError)
    assert results[0] == scorer.score_request(body(PROMPTS[0]), 2)
    assert results[2] == scorer.score_request(body(PROMPTS[2]), 2)
    assert counting.batches == [2]


def test_a_failing_batch_fails_each_of_its_requests(scorer: DifficultyScorer) -> None:
    class Broken(Counting):
        def score_requests(self, bodies: Any, context_turns: int | None = None) -> Any:
            raise ValueError("model gives 2 classes, metadata names 3 class values")

    batcher = ScoreBatcher()

    async def main() -> list[Any]:
        broken = Broken(scorer)
        jobs = [batcher.score(broken, body(p), 2) for p in PROMPTS[:3]]
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, ValueError) for r in results)


def test_a_scorer_without_a_batch_path_scores_each_request(scorer: DifficultyScorer) -> None:
    class Single:
        calls = 0

        def score_request(self, body: Mapping[str, Any], context_turns: int | None = None) -> float:
            Single.calls += 1
            return scorer.score_request(body, context_turns)

    batcher = ScoreBatcher()

    async def main() -> list[float]:
        return list(await asyncio.gather(*(batcher.score(Single(), body(p), 2) for p in PROMPTS)))

    assert asyncio.run(main()) == [scorer.score_request(body(p), 2) for p in PROMPTS]
    assert Single.calls == len(PROMPTS)
