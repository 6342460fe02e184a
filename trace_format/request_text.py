"""The text a request carries: the one place that reads OpenAI chat and completions bodies.

`request_text` is what the classifier scores and what a trace records as `prompt`;
`upstream_text` is everything the upstream reads (for token counts when it reports none);
`stream_texts` is the text an answer streamed (chat or completions chunks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

CONTEXT_CHARS = 1000  # each earlier turn contributes at most its last this many characters


def text_of_content(content: Any) -> str:
    """Text of a message `content`: a string, or a list of parts (non-text parts ignored)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    return ""


def prompt_field(prompt: Any) -> str:
    # Completions accept a string, a list of strings, or token ids (which we cannot read).
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[-limit:]


def request_text(body: Mapping[str, Any], context_turns: int = 2) -> str:
    """The text to score: the last user turn, preceded by at most `context_turns` earlier turns.

    Works for chat bodies (`messages`) and completions bodies (`prompt`); anything unreadable
    contributes no text rather than failing, so a scorer never rejects a request.
    """
    if not isinstance(body, Mapping):
        return ""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return prompt_field(body.get("prompt"))
    turns = [m for m in messages if isinstance(m, Mapping)]
    last_user = next(
        (i for i in range(len(turns) - 1, -1, -1) if turns[i].get("role") == "user"), None
    )
    if last_user is None:
        # No user turn (e.g. only a system prompt): score whatever the last message says.
        return text_of_content(turns[-1].get("content")) if turns else ""
    current = text_of_content(turns[last_user].get("content"))
    if context_turns <= 0:
        return current
    earlier = turns[max(0, last_user - context_turns) : last_user]
    context = [_tail(text_of_content(m.get("content")), CONTEXT_CHARS) for m in earlier]
    return "\n".join([*(c for c in context if c), current])


def upstream_text(body: Mapping[str, Any]) -> str:
    """All text the upstream reads: every message's text, or the completion prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return "\n".join(
            text_of_content(m.get("content")) for m in messages if isinstance(m, Mapping)
        )
    return prompt_field(body.get("prompt"))


def _event_object(data: bytes | None) -> dict[str, Any]:
    try:
        obj = orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        return {}
    return obj if isinstance(obj, dict) else {}


def stream_texts(contents: list[bytes]) -> list[str]:
    """The generated text of chat (delta.content) or completions (text) chunks, in order."""
    texts: list[str] = []
    for data in contents:
        for choice in _event_object(data).get("choices") or ():
            if isinstance(choice, dict):
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if isinstance(text, str):
                    texts.append(text)
    return texts
