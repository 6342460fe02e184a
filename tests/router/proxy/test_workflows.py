"""Routing a workflow to the student (issue 28): a policy's `workflows:` sends the requests its
selector matches (a `metadata` tag, as `distill export --tag`) to the student tier, unscored;
others go where the policy says; a tier the client names is never overridden; the reason and
the trace name the workflow. The real proxy in front of one echo upstream per tier, driven by the
official openai client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from router.config import RouterConfig, config_from_dict
from router.proxy.build import build_selector
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.topics import COOKING, MATH
from tests.support.waiting import wait_for
from trace_format.config_base import ConfigError

POLICIES = {
    "auto": {
        "type": "threshold",
        "small": "small",
        "large": "large",
        "threshold": 0.0,  # every scored request goes large: only the workflow sends one small
        "workflows": [{"name": "gsm8k", "tags": {"workflow": "gsm8k"}, "tier": "student"}],
    }
}


def tiers(urls: dict[str, str]) -> list[dict[str, Any]]:
    return [
        tier("student", urls["student"], price=(0.05, 0.05)),
        tier("small", urls["small"], price=(0.5, 0.5)),
        tier("large", urls["large"], price=(10.0, 30.0)),
    ]


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[ProxyThread, openai.OpenAI]]:
    with ExitStack() as stack:
        urls = {
            n: stack.enter_context(running_echo_upstream()) for n in ("student", "small", "large")
        }
        cfg = make_config(tiers(urls), tmp_path, policies=POLICIES, default_policy="auto")
        p = stack.enter_context(ProxyThread(cfg))
        yield p, openai.OpenAI(base_url=f"{p.url}/v1", api_key="unused", max_retries=0)


def test_the_workflow_goes_to_the_student_and_the_rest_where_the_policy_says(
    proxy: tuple[ProxyThread, openai.OpenAI],
) -> None:
    p, client = proxy
    msgs = [{"role": "user", "content": "What is 12 * 7?"}]
    sent = []
    for model, meta in (
        ("auto", {"workflow": "gsm8k"}),
        ("auto", None),
        ("auto", {"workflow": "other"}),
        ("large", {"workflow": "gsm8k"}),  # a named tier is never overridden
    ):
        extra = {"metadata": meta} if meta is not None else {}
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=msgs, max_tokens=8, **extra
        )
        assert raw.parse().choices[0].message.content
        sent.append(raw.headers["x-router-tier"])
    assert sent == ["student", "large", "large", "large"]
    traces = sorted(p.traces(expect=4), key=lambda t: t["time"])
    assert [t["tier"] for t in traces] == sent
    first, plain, other, named = traces
    assert first["reason"] == "workflow gsm8k -> student"
    assert first["workflow"] == "gsm8k" and first["policy"] == "auto"
    assert first["score"] is None  # a workflow's tier needs no classifier
    assert plain["score"] is not None and "workflow" not in plain
    assert "workflow" not in other
    assert named["reason"] == "explicit tier" and "workflow" not in named


def _router_config(policies: dict[str, Any]) -> RouterConfig:
    return config_from_dict(
        {
            "tiers": tiers({n: f"http://127.0.0.1:1/{n}" for n in ("student", "small", "large")}),
            "policies": policies,
            "default_policy": "auto",
        },
        environ={},
    )


def _config(policies: dict[str, Any]) -> None:
    _router_config(policies)


def test_config_errors_name_the_key() -> None:
    _config(POLICIES)  # the test's config is valid
    wf = POLICIES["auto"]["workflows"][0]
    for change, key in (
        ({"tier": "studnet"}, r"policies\.auto\.workflows\.0\.tier names unknown tier 'studnet'"),
        ({"teacher": "huge"}, r"policies\.auto\.workflows\.0\.teacher names unknown tier"),
        ({"tags": {}}, r"policies\.auto\.workflows\.0: .*needs teams, tags or clusters"),
        ({"colour": "red"}, r"policies\.auto\.workflows\.0\.colour"),
        ({"name": "a b"}, r"policies\.auto\.workflows\.0\.name"),
    ):
        bad = {"auto": {**POLICIES["auto"], "workflows": [{**wf, **change}]}}
        with pytest.raises(ConfigError, match=key):
            _config(bad)


def test_the_student_is_shadowed_by_its_teacher_and_the_export_selects_the_workflow(
    tmp_path: Path,
) -> None:
    """The loop closes: the workflow's answers are paired with the teacher's (the drift
    monitor's pairs), and `distill export --tag workflow=gsm8k` selects exactly its rows from
    the traces the proxy wrote (the trace keeps `metadata` with the content)."""
    from router.learning.distill.export import ExportOptions, Selector, export
    from trace_format.shadow import iter_shadow

    evaluation = {"enabled": True, "sample_rate": 1.0, "store_content_teams": ["*"]}
    with ExitStack() as stack:
        urls = {
            n: stack.enter_context(running_echo_upstream()) for n in ("student", "small", "large")
        }
        cfg = make_config(
            tiers(urls),
            tmp_path,
            policies=POLICIES,
            default_policy="auto",
            evaluation=evaluation,
            traces={"path": str(tmp_path / "requests.jsonl"), "include_prompt": True},
        )
        p = stack.enter_context(ProxyThread(cfg))
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key="unused", max_retries=0)
        for i in range(3):
            client.chat.completions.create(
                model="auto",
                messages=[{"role": "user", "content": f"What is {i} + 7?"}],
                max_tokens=8,
                metadata={"workflow": "gsm8k"},
            )
        client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
        )
        shadow = p.state.shadow
        assert shadow is not None
        wait_for(
            lambda: len(list(iter_shadow(shadow.log.path))) == 4 and shadow.idle(),
            20,
            "4 shadow records",
        )
        p.traces(expect=4)
        pairs = sorted(
            (r["primary"]["tier"], r["shadow"]["tier"]) for r in iter_shadow(shadow.log.path)
        )
    assert pairs == [("large", "small")] + [("student", "large")] * 3
    traces = p.traces(expect=4)
    assert sum(t.get("metadata") == {"workflow": "gsm8k"} for t in traces) == 3
    options = ExportOptions(
        teacher="large", selector=Selector(tags={"workflow": "gsm8k"}), heldout_share=0.34
    )
    result = export([tmp_path], tmp_path / "set", options)
    counts = result.card["counts"]
    assert counts["kept"] == 3 and counts["dropped"]["not selected"] == 1


def test_a_prompt_the_student_cannot_hold_moves_to_a_tier_of_the_policy(tmp_path: Path) -> None:
    """The workflow's choice composes with the context window as any decision does."""
    with ExitStack() as stack:
        urls = {
            n: stack.enter_context(running_echo_upstream()) for n in ("student", "small", "large")
        }
        specs = tiers(urls)
        specs[0]["context_window"] = 200
        cfg = make_config(specs, tmp_path, policies=POLICIES, default_policy="auto")
        p = stack.enter_context(ProxyThread(cfg))
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key="unused", max_retries=0)
        got = []
        for words in (5, 400):
            raw = client.chat.completions.with_raw_response.create(
                model="auto",
                messages=[{"role": "user", "content": "word " * words}],
                max_tokens=8,
                metadata={"workflow": "gsm8k"},
            )
            got.append(raw.headers["x-router-tier"])
        assert got == ["student", "small"]
        short, long = sorted(p.traces(expect=2), key=lambda t: t["time"])
    assert short["reason"] == "workflow gsm8k -> student"
    assert long["reason"].startswith("workflow gsm8k -> student; context_window")
    assert long["reason"].endswith("moved to small") and long["workflow"] == "gsm8k"


def test_a_budget_that_cannot_pay_the_workflows_tier_downgrades_it(tmp_path: Path) -> None:
    """The workflow's choice composes with budgets as any decision does: downgraded to a
    cheaper tier of the policy, the reason saying both."""
    policies = {
        "auto": {
            "type": "threshold",
            "threshold": 1.0,  # scored requests go small; the workflow asks for large
            "workflows": [{"name": "hard", "teams": ["default"], "tier": "large"}],
        }
    }
    with ExitStack() as stack:
        urls = {
            n: stack.enter_context(running_echo_upstream()) for n in ("student", "small", "large")
        }
        cfg = make_config(
            tiers(urls)[1:],
            tmp_path,
            policies=policies,
            default_policy="auto",
            budgets={"store": "memory", "prompt_estimate": "bytes"},
            teams={"default": {"budget": {"limit_usd": 0.0002}}},
        )
        p = stack.enter_context(ProxyThread(cfg))
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key="unused", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
        assert raw.headers["x-router-tier"] == "small"
        assert raw.headers["x-router-downgraded"] == "true"
        (trace,) = p.traces(expect=1)
    assert trace["reason"] == "workflow hard -> large; downgraded to small: budget"
    assert trace["workflow"] == "hard"


def _fit_topics(path: Path) -> int:
    """A two-cluster model of the topic prompts; the arithmetic cluster's id."""
    from classifiers.cluster_fit import fit_clusters, write_clusters
    from classifiers.prompt_clusters import PromptClusters, cluster_text

    texts = [cluster_text({"messages": [{"role": "user", "content": t}]}) for t in MATH + COOKING]
    write_clusters(fit_clusters(texts, 2), path)
    return PromptClusters.load(path).assign(texts[:1])[0]


def test_a_cluster_of_prompts_goes_to_the_student(tmp_path: Path) -> None:
    """A workflow of prompt clusters (the model `distill clusters` fits): the arithmetic
    prompts, new ones included, go to the student; the baking ones where the policy says."""
    model = tmp_path / "clusters.onnx"
    math_id = _fit_topics(model)
    wf = {"name": "sums", "clusters": {"file": str(model), "ids": [math_id]}, "tier": "student"}
    policies = {"auto": {**POLICIES["auto"], "workflows": [wf]}}
    with ExitStack() as stack:
        urls = {
            n: stack.enter_context(running_echo_upstream()) for n in ("student", "small", "large")
        }
        cfg = make_config(tiers(urls), tmp_path, policies=policies, default_policy="auto")
        p = stack.enter_context(ProxyThread(cfg))
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key="unused", max_retries=0)
        prompts = [
            "What is 101 plus 202? Add the numbers.",
            "How long do I bake rye bread in the oven?",
            MATH[3],
            COOKING[3],
        ]
        got = []
        for prompt in prompts:
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=8
            )
            got.append(raw.headers["x-router-tier"])
        traces = sorted(p.traces(expect=4), key=lambda t: t["time"])
    assert got == ["student", "large", "student", "large"]
    assert [t.get("workflow") for t in traces] == ["sums", None, "sums", None]
    assert traces[0]["reason"] == "workflow sums -> student"


def test_a_cluster_model_that_cannot_serve_is_a_config_error(tmp_path: Path) -> None:
    model = tmp_path / "clusters.onnx"
    _fit_topics(model)
    key = r"policies\.auto\.workflows\.0\.clusters"
    for clusters, says in (
        ({"file": str(tmp_path / "missing.onnx"), "ids": [0]}, f"{key}: .*cannot read"),
        ({"file": str(model), "ids": [2]}, f"{key}: .*has clusters 0..1, not \\[2\\]"),
        ({"file": str(model), "ids": []}, r"workflows\.0\.clusters\.ids"),
    ):
        wf = {"name": "sums", "clusters": clusters, "tier": "student"}
        with pytest.raises(ConfigError, match=says):
            build_selector(_router_config({"auto": {**POLICIES["auto"], "workflows": [wf]}}))
