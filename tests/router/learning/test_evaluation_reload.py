"""The `evaluation:` section hot-reloads (router/proxy/reload.py, router/learning/shadow.py
`reload_shadow`): the real proxy (uvicorn, real HTTP) in front of an echo upstream, its config
file edited and reloaded while it runs. Turning evaluation on starts the shadow service, a
changed sampling rate and judge apply to the next requests, the shadow prompt follows a changed
`classifier.context_turns`, and a judge prompt file that cannot be read rejects the file."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from benchmarks.echo_upstream import running_echo_upstream
from router.config import load_config
from tests.router.learning.test_shadow import metric, shadow_records
from tests.support.proxy import ProxyThread, tier
from tests.support.waiting import wait_for

TURNS = [
    {"role": "user", "content": "EARLIER question"},
    {"role": "assistant", "content": "EARLIER answer"},
    {"role": "user", "content": "the last turn"},
]


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


def write(path: Path, echo: str, evaluation: dict[str, Any] | None, context_turns: int = 0) -> None:
    doc: dict[str, Any] = {
        "tiers": [tier("small", echo, price=(0.6, 0.6)), tier("large", echo, price=(10, 30))],
        "traces": {"path": str(path.parent / "traces" / "requests.jsonl")},
        "signals": {"enabled": False},
        "classifier": {"context_turns": context_turns},
    }
    if evaluation is not None:
        doc["evaluation"] = evaluation
    path.write_text(yaml.safe_dump(doc))


def test_evaluation_section_reloads_without_a_restart(
    echo: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "router.yaml"
    write(path, echo, None)
    with ProxyThread(load_config(path), config_path=path) as proxy:
        reloader = proxy.app.state.reloader
        oa = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0, timeout=30)

        def send() -> None:
            before = metric(proxy, "cost_router_requests_total")
            oa.chat.completions.create(model="auto", max_tokens=8, messages=TURNS)
            # Counted in the same step that offers it to the shadow service (request_path.py):
            # once the count is seen, the offer has been made.
            wait_for(
                lambda: metric(proxy, "cost_router_requests_total") == before + 1,
                10,
                "the request to be finished",
            )

        def reload() -> bool:
            return bool(reloader.request_reload("test").result(timeout=30))

        send()
        assert proxy.state.shadow is None  # evaluation off at start

        on = {"enabled": True, "sample_rate": 1.0, "store_content_teams": ["*"]}
        write(path, echo, on)
        assert reload()
        service = proxy.state.shadow
        assert service is not None and service.settings.sample_rate == 1.0
        send()
        wait_for(lambda: len(shadow_records(proxy)) == 1 and service.idle(), 20, "1 record")
        assert shadow_records(proxy)[0]["prompt"] == "the last turn"  # context_turns 0

        # The classifier's context_turns changes what the shadow record (and a judge) reads.
        write(path, echo, {**on, "daily_cap_usd": 3.0}, context_turns=2)
        assert reload()
        assert proxy.state.shadow is service and service.context_turns == 2
        assert service.settings.daily_cap_usd == 3.0
        send()
        wait_for(lambda: len(shadow_records(proxy)) == 2 and service.idle(), 20, "2 records")
        assert shadow_records(proxy)[1]["prompt"] == (
            "EARLIER question\nEARLIER answer\nthe last turn"
        )

        # Sampling off: nothing more is sampled. Queue size needs a restart: kept, and said.
        with caplog.at_level(logging.WARNING, logger="router.learning.shadow"):
            write(path, echo, {**on, "sample_rate": 0.0, "queue_size": 7}, context_turns=2)
            assert reload()
        assert "evaluation.queue_size need a restart" in caplog.text
        assert service.settings.queue_size == 256 and service.settings.sample_rate == 0.0
        sampled = metric(proxy, "cost_router_shadow_sampled_total")
        send()
        assert metric(proxy, "cost_router_shadow_sampled_total") == sampled

        # An llm judge whose prompt file is missing: the file is rejected, nothing changes.
        judged = {**on, "judges": {"llm": {"tier": "large", "prompt": str(tmp_path / "no.txt")}}}
        write(path, echo, judged, context_turns=2)
        assert not reload()
        assert service.settings.sample_rate == 0.0 and service.settings.judges.llm is None
        # A readable one applies: the next pair goes to the llm judge too.
        (tmp_path / "no.txt").write_text("{question} {answer_a} {answer_b} [[A]] [[B]] [[C]]")
        assert reload()
        assert [j.name for j in service.judges] == ["reference", "llm"]
        assert service.settings.sample_rate == 1.0

        # Turned off again: the service stays, offering nothing.
        write(path, echo, {**on, "enabled": False}, context_turns=2)
        assert reload()
        assert proxy.state.shadow is service
        sampled = metric(proxy, "cost_router_shadow_sampled_total")
        send()
        assert metric(proxy, "cost_router_shadow_sampled_total") == sampled
