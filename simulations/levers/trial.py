"""The run of a lever trial: every prompt on the reference tier, then on each candidate, then the
judge on each (reference, candidate) pair.

One tier at a time, with at most `concurrency` requests in flight: tiers that share a machine
(two llama.cpp servers on one CPU, two vLLM servers on one GPU) would otherwise slow each other
and the speed ratio would measure the contention. The judge runs after all measuring, for the
same reason. Every result is stored as it arrives (store.py), and what is stored is not redone.
A tier whose server cannot be reached stops the run with TierDownError naming it; what was
measured before stays on disk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from backends.metrics_scrape import ACCEPTED_TOKENS, DRAFT_TOKENS, parse_metrics
from simulations.levers.measure import check_up, client_for, measure
from simulations.levers.prompts import TrialPrompt
from simulations.levers.records import Measurement, TrialTier
from simulations.levers.store import JudgeRow, SpecCounts, TrialStore

# The judge of one pair: (prompt, reference answer, candidate answer) -> its row. Given by the
# caller (the judges live above this layer: router/learning/judges); never raises on odd text.
JudgePair = Callable[[TrialPrompt, Measurement, Measurement], Awaitable[JudgeRow]]
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TrialSpec:
    reference: TrialTier
    candidates: tuple[TrialTier, ...]
    max_tokens: int = 256
    temperature: float = 0.0  # 0: a lossless lever (speculative decoding) gives identical text
    concurrency: int = 4

    @property
    def tiers(self) -> tuple[TrialTier, ...]:
        return (self.reference, *self.candidates)

    def settings(self) -> dict[str, object]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature}


def pending_requests(spec: TrialSpec, prompts: Sequence[TrialPrompt], store: TrialStore) -> int:
    return sum(store.measured(p.id, t.name) is None for t in spec.tiers for p in prompts)


def pending_pairs(spec: TrialSpec, prompts: Sequence[TrialPrompt], store: TrialStore) -> int:
    return sum(not store.judged(p.id, c.name) for c in spec.candidates for p in prompts)


async def _spec_counters(tier: TrialTier) -> tuple[float, float] | None:
    """(draft, accepted) token counters of the tier's /metrics, None when it exposes none."""
    if tier.metrics_url is None:
        return None
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            resp = await http.get(tier.metrics_url)
        if resp.status_code != 200:
            return None
        counters = parse_metrics(resp.text).counters
    except (httpx.HTTPError, ValueError):
        return None
    if DRAFT_TOKENS not in counters:
        return None
    return counters[DRAFT_TOKENS], counters.get(ACCEPTED_TOKENS, 0.0)


async def _measure_tier(
    spec: TrialSpec, tier: TrialTier, todo: list[TrialPrompt], store: TrialStore, progress: Progress
) -> None:
    client = client_for(tier)
    try:
        await check_up(client, tier)
        before = await _spec_counters(tier)
        gate = asyncio.Semaphore(spec.concurrency)

        async def one(prompt: TrialPrompt) -> None:
            async with gate:
                m = await measure(client, tier, prompt, spec.max_tokens, spec.temperature)
            store.add_measurement(m)
            progress(f"{tier.name}: {'ok' if m.ok else m.error}")

        tasks = [asyncio.create_task(one(p)) for p in todo]
        try:
            await asyncio.gather(*tasks)
        finally:
            # The first TierDownError ends the tier; the others are cancelled, not left running.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        after = await _spec_counters(tier)
        if before is not None and after is not None:
            store.add_spec(SpecCounts(tier.name, after[0] - before[0], after[1] - before[1]))
    finally:
        await client.close()


async def measure_all(
    spec: TrialSpec, prompts: Sequence[TrialPrompt], store: TrialStore, progress: Progress
) -> None:
    for tier in spec.tiers:
        todo = [p for p in prompts if store.measured(p.id, tier.name) is None]
        if todo:
            await _measure_tier(spec, tier, todo, store, progress)


async def judge_all(
    spec: TrialSpec,
    prompts: Sequence[TrialPrompt],
    store: TrialStore,
    judge: JudgePair,
    progress: Progress,
) -> None:
    gate = asyncio.Semaphore(spec.concurrency)

    async def one(prompt: TrialPrompt, ref: Measurement, cand: Measurement) -> None:
        async with gate:
            row = await judge(prompt, ref, cand)
        store.add_judgement(row)
        progress(f"judged {cand.tier}: {row.status}")

    jobs = []
    for cand_tier in spec.candidates:
        for p in prompts:
            ref = store.measured(p.id, spec.reference.name)
            cand = store.measured(p.id, cand_tier.name)
            if ref is not None and cand is not None and not store.judged(p.id, cand_tier.name):
                jobs.append(one(p, ref, cand))
    await asyncio.gather(*jobs)
