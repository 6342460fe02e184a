"""The judges on their own terms: the reference judge on GSM8K-style answers, the llm judge's
position-bias cancelling, grading and unparseable verdicts (against a scripted judge model over
real HTTP), the judge prompt as a replaceable, versioned file, and feedback turned into labels.
Through the proxy: shadow pairs judged by an `llm` judge tier, labels and metrics land."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from openai import OpenAI

from backends.config import TierConfig
from backends.registry import build_backend
from benchmarks.echo_upstream import running_echo_upstream
from router.learning.config import LlmJudgeConfig, ReferenceJudgeConfig
from router.learning.judges.base import Answer, Case, Judgement
from router.learning.judges.feedback import append_feedback_labels, feedback_labels
from router.learning.judges.llm import (
    LlmJudge,
    parse_grade,
    parse_pairwise,
    read_grade,
    read_pairwise,
)
from router.learning.judges.prompt import load_prompt
from router.learning.judges.reference import ReferenceJudge, last_number
from tests.router.learning.test_shadow import metric, shadow_records
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.verdict_upstream import VerdictServer
from tests.support.waiting import wait_for
from trace_format.config_base import ConfigError
from trace_format.feedback import feedback_line
from trace_format.labels import iter_labels


@pytest.fixture(scope="module")
def verdicts() -> Iterator[VerdictServer]:
    with VerdictServer() as server:
        yield server


def pair(small: str, large: str, reference: str | None = None) -> Case:
    body = {"model": "auto", "messages": [{"role": "user", "content": "q"}]}
    if reference is not None:
        body["metadata"] = {"reference_answer": reference}
    return Case("r", "q", (Answer("small", small), Answer("large", large)), body=body)


# --- reference ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("Janet sells 16 - 3 - 4 = 9 eggs, so she makes 9 * $2 = $18 every day.\n#### 18", 18),
        ("The answer is 1,234.", 1234),
        ("It drops to -3.5 degrees", -3.5),
        ("about .5 of it", 0.5),
        ("no digits here", None),
        ("", None),
        ("costs $1,000,000.00 total", 1e6),
    ],
)
def test_last_number_reads_gsm8k_answers(text: str, number: float | None) -> None:
    assert last_number(text) == number


def test_reference_judge_on_gsm8k_answers() -> None:
    judge = ReferenceJudge(ReferenceJudgeConfig())
    right = "Natalia sold 48/2 = 24 clips in May, so 48+24 = 72 altogether.\n#### 72"
    wrong = "She sold 48 clips in April and 24 in May, 48 in total? No: 96."
    result = asyncio.run(judge.judge(pair(wrong, right, reference="#### 72")))
    assert result.outcomes == {"small": 0.0, "large": 1.0}
    both = asyncio.run(judge.judge(pair("72", "The total is 72.0 clips", reference="72")))
    assert both.outcomes == {"small": 1.0, "large": 1.0}
    assert asyncio.run(judge.judge(pair("72", "72"))).outcomes is None  # no reference: no label
    exact = ReferenceJudge(ReferenceJudgeConfig(match="exact"))
    assert asyncio.run(exact.judge(pair(" Paris. ", "Lyon", reference="paris"))).outcomes == {
        "small": 1.0,
        "large": 0.0,
    }
    auto = asyncio.run(judge.judge(pair("Paris", "paris 2", reference="Paris")))
    assert auto.outcomes == {"small": 1.0, "large": 0.0}  # not a number: exact in auto mode


# --- llm ---------------------------------------------------------------------------------------


def test_verdict_parsing_never_guesses() -> None:
    assert parse_pairwise("so [[A]]") == "A" and parse_pairwise("[[ c ]]") == "C"
    assert parse_pairwise("[[A]] or maybe [[B]]") is None
    assert parse_pairwise("A is better") is None and parse_pairwise("") is None
    assert parse_grade("Rating: [[7]]") == 7 and parse_grade("[[10]]") == 10
    assert parse_grade("[[0]]") is None and parse_grade("[[11]]") is None
    assert parse_grade("[[3]] then [[4]]") is None


def judge_with(
    url: str,
    cases: list[Case],
    mode: str = "pairwise",
    prompt: str | None = None,
    constrain: str = "auto",
    judges: list[LlmJudge] | None = None,
) -> list[Judgement]:
    """The judgements of one LlmJudge; `judges` (a list) receives the judge, to look at after."""

    async def go() -> list[Judgement]:
        tier = TierConfig(
            name="judge",
            base_url=url,
            model="verdict",
            connect_retries=0,
            price={"input_per_mtok": 1.0, "output_per_mtok": 1.0},
        )
        backend = build_backend(tier)
        settings = LlmJudgeConfig(
            tier="judge",
            mode=mode,
            max_tokens=16,  # type: ignore[arg-type]
            constrain=constrain,
        )  # type: ignore[arg-type]
        judge = LlmJudge(settings, load_prompt(mode, prompt), backend, "verdict", tier.price)
        if judges is not None:
            judges.append(judge)
        try:
            return [await judge.judge(c) for c in cases]
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_pairwise_asks_both_orders_and_cancels_position_bias(verdicts: VerdictServer) -> None:
    verdicts.app.mode = "prefer"
    before = verdicts.app.served
    [better_large, better_small, neither] = judge_with(
        verdicts.url, [pair("meh", "GOOD answer"), pair("GOOD", "meh"), pair("meh", "meh")]
    )
    assert verdicts.app.served - before == 6  # two orders per pair
    assert better_large.outcomes == {"small": 0.0, "large": 1.0}
    assert better_large.verdict == "large" and better_large.cost_usd > 0
    assert better_small.outcomes == {"small": 1.0, "large": 0.0}
    assert neither.outcomes == {"small": 0.5, "large": 0.5} and neither.verdict == "tie"
    verdicts.app.mode = "first"  # always "[[A]]": the swap exposes it as no preference
    [biased] = judge_with(verdicts.url, [pair("meh", "GOOD")])
    assert biased.outcomes == {"small": 0.5, "large": 0.5}
    assert biased.detail == "order1=A order2=A"


def test_unparseable_verdicts_give_no_label(verdicts: VerdictServer) -> None:
    verdicts.app.mode = "garbage"
    [result] = judge_with(verdicts.url, [pair("meh", "GOOD")])
    assert result.outcomes is None and result.unparseable and result.cost_usd > 0
    assert result.label("r", "llm", "v") is None


def test_structured_verdicts_are_read_and_never_guessed() -> None:
    assert read_pairwise('{"verdict": "B"}') == "B" and read_pairwise(' {"verdict":"c"} ') == "C"
    assert read_pairwise('{"verdict": "D"}') is None and read_pairwise('{"verdict": 1}') is None
    assert read_pairwise('{"verdict": "A"') is None  # cut short (max_tokens): unparseable
    assert read_pairwise("[[B]]") == "B"  # a server that ignored the constraint
    assert read_grade('{"grade": 7}') == 7 and read_grade("[[7]]") == 7
    assert read_grade('{"grade": 11}') is None and read_grade('{"grade": true}') is None
    assert read_grade('{"grade": 7.5}') is None


@pytest.mark.parametrize("how", ["json_schema", "json_object", "grammar", "none"])
def test_each_constraint_asks_for_a_verdict_the_parser_reads(
    verdicts: VerdictServer, how: str
) -> None:
    verdicts.app.mode, verdicts.app.refuse = "prefer", set()
    before = len(verdicts.app.bodies)
    judges: list[LlmJudge] = []
    [result] = judge_with(verdicts.url, [pair("meh", "GOOD")], constrain=how, judges=judges)
    assert result.outcomes == {"small": 0.0, "large": 1.0}
    sent = verdicts.app.bodies[before:]
    fields = {
        "json_schema": "response_format",
        "json_object": "response_format",
        "grammar": "grammar",
    }
    for body in sent:
        assert {k for k in ("response_format", "grammar") if k in body} == (
            {fields[how]} if how in fields else set()
        )
    if how == "json_schema":
        schema = sent[0]["response_format"]["json_schema"]["schema"]
        assert schema["properties"]["verdict"]["enum"] == ["A", "B", "C"]
    assert judges[0].version.endswith("" if how == "none" else f"+{how}")
    [graded] = judge_with(verdicts.url, [pair("meh", "GOOD")], mode="single", constrain=how)
    assert graded.outcomes == {"small": pytest.approx(1 / 9), "large": pytest.approx(8 / 9)}


@pytest.mark.parametrize("status", [422, 500])  # 500: how llama-cpp-python 0.3 refuses
def test_auto_moves_on_when_the_server_refuses_a_constraint(
    verdicts: VerdictServer, status: int
) -> None:
    verdicts.app.mode, verdicts.app.refuse_status = "prefer", status
    verdicts.app.refuse = {"json_schema"}
    judges: list[LlmJudge] = []
    results = judge_with(verdicts.url, [pair("meh", "GOOD"), pair("GOOD", "meh")], judges=judges)
    assert [r.outcomes for r in results] == [
        {"small": 0.0, "large": 1.0},
        {"small": 1.0, "large": 0.0},
    ]
    assert judges[0].constraint == "grammar"  # remembered: the second pair asked grammar only
    assert sum("response_format" in b for b in verdicts.app.bodies[-6:]) == 2
    verdicts.app.refuse = {"json_schema", "grammar"}
    [free] = judge_with(verdicts.url, [pair("meh", "GOOD")], judges=judges)
    assert free.outcomes == {"small": 0.0, "large": 1.0} and judges[1].constraint == "none"
    # A fixed constraint the server refuses: the judge fails (counted as `error`), never guesses.
    [failed] = judge_with(verdicts.url, [pair("meh", "GOOD")], constrain="grammar")
    assert failed.outcomes is None and failed.failed and failed.cost_usd == 0
    verdicts.app.refuse, verdicts.app.refuse_status = set(), 422


def test_an_error_on_every_constraint_downgrades_nothing(verdicts: VerdictServer) -> None:
    # A request the server takes with no constraint at all (an over-long prompt, say): no label,
    # and auto keeps json_schema for the next one (None = a body without a constraint).
    verdicts.app.mode = "prefer"
    verdicts.app.refuse = {"json_schema", "grammar", None}
    judges: list[LlmJudge] = []
    try:
        [result] = judge_with(verdicts.url, [pair("meh", "GOOD")], judges=judges)
    finally:
        verdicts.app.refuse = set()
    assert result.outcomes is None and result.failed
    assert judges[0].constraint == "json_schema"


def test_single_answer_grading(verdicts: VerdictServer) -> None:
    verdicts.app.mode = "prefer"
    [result] = judge_with(verdicts.url, [pair("meh", "GOOD")], mode="single")
    assert result.outcomes == {"small": pytest.approx(1 / 9), "large": pytest.approx(8 / 9)}


def test_judge_prompt_is_a_replaceable_versioned_file(
    verdicts: VerdictServer, tmp_path: Path
) -> None:
    shipped = load_prompt("pairwise", None)
    assert shipped.version.startswith("pairwise_v1:") and len(shipped.version) == 12 + 12
    mine = tmp_path / "strict_judge.txt"
    mine.write_text(shipped.template.replace("impartial", "strict"))
    custom = load_prompt("pairwise", str(mine))
    assert custom.version.startswith("strict_judge:") and custom.version != shipped.version
    # A literal placeholder inside an answer is not substituted again.
    assert "{answer_b}" in shipped.render(question="q", answer_a="{answer_b}", answer_b="x")
    verdicts.app.mode = "prefer"
    [result] = judge_with(verdicts.url, [pair("meh", "GOOD")], prompt=str(mine))
    assert result.outcomes == {"small": 0.0, "large": 1.0}
    broken = tmp_path / "broken.txt"
    broken.write_text("Which is better? {question}")
    with pytest.raises(ConfigError, match=r"evaluation.judges.llm.prompt: .*\{answer_a\}"):
        load_prompt("pairwise", str(broken))
    with pytest.raises(ConfigError, match="evaluation.judges.llm.prompt: cannot read"):
        load_prompt("pairwise", str(tmp_path / "absent.txt"))


def test_shipped_prompts_are_package_data() -> None:
    text = Path("pyproject.toml").read_text()
    assert '"router.learning" = ["prompts/*.txt"]' in text


# --- feedback ----------------------------------------------------------------------------------


def test_feedback_becomes_a_label_for_the_tier_the_user_saw(tmp_path: Path) -> None:
    traces = tmp_path / "requests.jsonl"
    rows = [
        {"schema_version": 1, "id": "a", "time": 1.0, "tier": "small", "status": 200},
        {"schema_version": 1, "id": "b", "time": 2.0, "tier": "large", "status": 200},
    ]
    traces.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    feedback = tmp_path / "feedback.jsonl"
    lines = [
        feedback_line("a", 0.2, None)[1],
        feedback_line("a", 0.4, None)[1],
        feedback_line("b", 1.0, "great")[1],
        feedback_line("ghost", 1.0, None)[1],
    ]
    feedback.write_bytes(b"".join(lines))
    labels = {lb.request_id: lb for lb in feedback_labels(traces)}
    assert set(labels) == {"a", "b"}  # no trace, no tier: no label
    assert labels["a"].outcomes == {"small": pytest.approx(0.3)}
    assert labels["b"].outcomes == {"large": 1.0} and labels["b"].judge == "feedback"
    assert append_feedback_labels(traces) == 2
    assert append_feedback_labels(traces) == 0  # already labelled as it stands
    with feedback.open("ab") as fh:
        fh.write(feedback_line("b", 0.0, "changed my mind")[1])
    assert append_feedback_labels(traces) == 1
    assert [lb.outcomes for lb in iter_labels(tmp_path / "labels.jsonl")][-1] == {"large": 0.5}


# --- through the proxy -------------------------------------------------------------------------


def test_llm_judge_labels_shadow_pairs_through_the_proxy(
    verdicts: VerdictServer, tmp_path: Path
) -> None:
    with running_echo_upstream() as echo:
        tiers = [
            tier("small", echo, price=(0.6, 0.6)),
            tier("large", echo, price=(10, 30)),
            tier("judge", verdicts.url, price=(1, 1), model="verdict"),
        ]
        ev = {
            "enabled": True,
            "sample_rate": 1.0,
            "judges": {"llm": {"tier": "judge", "max_tokens": 16}},
        }
        config = make_config(
            tiers,
            tmp_path,
            evaluation=ev,
            policies={
                "p": {"type": "threshold", "small": "small", "large": "large", "threshold": 0.5}
            },
            default_policy="p",
        )
        with ProxyThread(config) as proxy:
            oa = OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
            verdicts.app.mode = "prefer"  # echo answers alike: ties
            for i in range(3):
                oa.chat.completions.create(
                    model="auto", max_tokens=8, messages=[{"role": "user", "content": f"q{i}"}]
                )
            wait_for(
                lambda: len(list(iter_labels(tmp_path / "labels.jsonl"))) == 3, 20, "3 llm labels"
            )
            labels = list(iter_labels(tmp_path / "labels.jsonl"))
            assert {lb.judge for lb in labels} == {"llm"}
            assert all(lb.outcomes == {"small": 0.5, "large": 0.5} for lb in labels)
            # The constraint is part of the version (auto: the default).
            version = load_prompt("pairwise", None).version + "+auto"
            assert all(lb.judge_version == version for lb in labels)
            assert all(lb.cost_usd > 0 for lb in labels)
            verdicts.app.mode = "garbage"
            oa.chat.completions.create(
                model="auto", max_tokens=8, messages=[{"role": "user", "content": "junk"}]
            )
            wait_for(
                lambda: (
                    metric(
                        proxy, "cost_router_judge_verdicts_total", judge="llm", result="unparseable"
                    )
                    == 1
                ),
                20,
                "the unparseable verdict",
            )
            assert len(list(iter_labels(tmp_path / "labels.jsonl"))) == 3
            assert len(shadow_records(proxy)) == 4
            spend = metric(proxy, "cost_router_judge_spend_usd_total", judge="llm")
            assert spend == pytest.approx(sum(lb.cost_usd for lb in labels), rel=0.5)
            assert spend > sum(lb.cost_usd for lb in labels)  # the unparseable one cost too
            # The judge tier is a tier like any other: its calls were never charged to a team.
            assert httpx.get(proxy.url + "/v1/budget").json()["scopes"][0]["spent_usd"] < 1e-3
