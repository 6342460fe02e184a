"""The text of a Messages request is the text of the chat request it is routed as: what the
classifier scores (`request_text`) and what our own token count reads (`upstream_text`) are the
same for `messages_as_chat(body)` as for litellm's translation of the body, which the proxy
sends and routes (router/apis/messages.py)."""

from __future__ import annotations

from typing import Any

import pytest

from router.apis.messages import _load
from trace_format.request_text import (
    messages_answer_text,
    messages_as_chat,
    request_text,
    upstream_text,
)

TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"q": "x"}}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}

BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Prove that sqrt(2) is irrational."}]},
    {
        "system": "You are a careful assistant.",
        "messages": [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "second"}, {"type": "text", "text": "part"}],
            },
        ],
    },
    {
        "system": [{"type": "text", "text": "block one"}, {"type": "text", "text": "block two"}],
        "messages": [
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": [{"type": "text", "text": "looking"}, TOOL_USE]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x is 4"}],
            },
        ],
    },
    {
        "messages": [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": [TOOL_USE]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                    {"type": "text", "text": "and now explain"},
                ],
            },
        ],
    },
    {"messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "what is this"}]}]},
    {"messages": [{"role": "user", "content": [IMAGE]}]},
]


@pytest.fixture(scope="module")
def adapter() -> Any:
    return _load()


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("context_turns", [0, 2, 5])
def test_the_scored_text_is_the_translated_chat_requests(
    adapter: Any, body: dict[str, Any], context_turns: int
) -> None:
    chat, _ = adapter.translate_anthropic_to_openai({"model": "m", "max_tokens": 8, **body})
    ours = messages_as_chat(body)
    assert request_text(ours, context_turns) == request_text(chat, context_turns)
    assert upstream_text(ours) == upstream_text(chat)


def test_an_answer_text_counts_its_text_and_tool_calls() -> None:
    answer = {"content": [{"type": "text", "text": "hi "}, TOOL_USE]}
    assert messages_answer_text(answer) == 'hi grep{"q":"x"}'
    assert messages_answer_text({"content": "not blocks"}) == ""
