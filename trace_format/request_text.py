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


# --- Anthropic Messages (POST /v1/messages) --------------------------------------------------
# The proxy routes a Messages request as the chat request it translates to (litellm's adapter,
# router/apis/messages.py), so its text is read through the same turns: `messages_as_chat` is
# the text-only image of that translation (system first; a user message's tool results become
# tool turns before its own text; an assistant's text blocks joined, its tool_use blocks tool
# calls), and `request_text(messages_as_chat(body))` is what the classifier scores for the
# translated chat request (tests/trace_format/test_messages_text.py holds the two equal).


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def _tool_result_text(content: Any) -> Any:
    # As litellm's tool message: a string, one text part as its string, else the text parts.
    if isinstance(content, str):
        return content
    parts = [
        {"type": "text", "text": p}
        if isinstance(p, str)
        else {"type": "text", "text": p.get("text") if isinstance(p.get("text"), str) else ""}
        for p in (content if isinstance(content, list) else [])
        if isinstance(p, str) or (isinstance(p, Mapping) and p.get("type") == "text")
    ]
    if len(parts) == 1:
        return parts[0]["text"]
    return parts or ""


def messages_as_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages body as the chat body its text reads as (see above); unreadable parts give
    no text rather than failing."""
    turns: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        turns.append({"role": "system", "content": system})
    elif isinstance(system, list):
        texts = [
            {"type": "text", "text": b.get("text", "")}
            for b in _blocks(system)
            if b.get("type") == "text"
        ]
        if texts:
            turns.append({"role": "system", "content": texts})
    messages = body.get("messages")
    for m in messages if isinstance(messages, list) else ():
        if not isinstance(m, Mapping):
            continue
        role, content = m.get("role"), m.get("content")
        if role == "user":
            if isinstance(content, str):
                if content:
                    turns.append({"role": "user", "content": content})
                continue
            blocks = _blocks(content)
            for b in blocks:
                if b.get("type") == "tool_result":
                    turns.append({"role": "tool", "content": _tool_result_text(b.get("content"))})
            parts = [
                {"type": "text", "text": b.get("text", "")}
                if b.get("type") == "text"
                else {"type": b.get("type")}
                for b in blocks
                if b.get("type") in ("text", "image", "document")
            ]
            if parts:
                turns.append({"role": "user", "content": parts})
        elif role == "assistant":
            if isinstance(content, str):
                turns.append({"role": "assistant", "content": content})
                continue
            blocks = _blocks(content)
            text = "".join(
                b.get("text", "") if isinstance(b.get("text", ""), str) else ""
                for b in blocks
                if b.get("type") == "text"
            )
            if any(b.get("type") in ("text", "tool_use", "thinking") for b in blocks):
                turns.append({"role": "assistant", "content": text})
        elif role == "system":
            turns.append({"role": "system", "content": content})
    return {"messages": turns}


def messages_answer_text(answer: Mapping[str, Any]) -> str:
    """The text a Messages answer generated: its text blocks and its tool calls' input."""
    texts: list[str] = []
    for block in _blocks(answer.get("content")):
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            texts.append(block.get("name") or "")
            texts.append(orjson.dumps(block.get("input")).decode())
    return "".join(texts)


# --- OpenAI Responses (POST /v1/responses) -----------------------------------------------------
# Routed as the chat request litellm translates it to (router/apis/responses.py); like
# `messages_as_chat`, `responses_as_chat` is the text-only image of that translation
# (instructions a system turn; a string input one user turn; message items their turns, a
# function call an assistant turn, its output a tool turn; other items no text), so that
# `request_text(responses_as_chat(body))` scores the same text as the translated chat request
# (tests/router/apis/test_responses_api.py holds the two equal).


def _responses_content(content: Any) -> Any:
    # input_text / output_text parts read as chat's text parts; images carry no text.
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": p.get("text")}
        for p in _blocks(content)
        if p.get("type") in ("input_text", "output_text") and isinstance(p.get("text"), str)
    ]


def responses_as_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses body as the chat body its text reads as (see above)."""
    turns: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        turns.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        turns.append({"role": "user", "content": items})
        items = ()
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type", "message")
        if kind in ("message", None) and isinstance(item.get("role"), str):
            turns.append({"role": item["role"], "content": _responses_content(item.get("content"))})
        elif kind == "function_call":
            turns.append({"role": "assistant", "content": None})
        elif kind == "function_call_output":
            turns.append({"role": "tool", "content": _responses_content(item.get("output"))})
    return {"messages": turns}


def responses_answer_text(answer: Mapping[str, Any]) -> str:
    """The text a Response object generated: its output text and its function calls."""
    texts: list[str] = []
    for item in _blocks(answer.get("output")):
        if item.get("type") == "message":
            texts.extend(
                p["text"] for p in _blocks(item.get("content")) if isinstance(p.get("text"), str)
            )
        elif item.get("type") == "function_call":
            for key in ("name", "arguments"):
                if isinstance(item.get(key), str):
                    texts.append(item[key])
    return "".join(texts)
