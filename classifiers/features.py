"""Request -> model input: the one place that turns a request body into the text the model sees.

Training, evaluation, the proxy and the simulator all go through `request_text` + `model_inputs`,
so a prompt is scored the same way everywhere. Imports only numpy and the standard library: this
module sits on the request path.

Preprocessing happens here, in Python, rather than inside the ONNX graph: lowercasing in the graph
needs a locale that is absent on minimal images, and collapsing whitespace here makes scikit-learn
and onnxruntime see byte-identical strings (exact parity for character n-grams).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

# Text budget: the head of a prompt carries the question, the tail carries the final ask, so a huge
# prompt keeps both. The longest prompt in the shared data is about 4,900 characters: nothing the
# model was trained on is cut.
HEAD_CHARS = 6000
TAIL_CHARS = 2000
# Earlier turns only give context; each contributes at most this many characters (its end).
CONTEXT_CHARS = 1000
TRUNCATION_MARK = " … "

_WHITESPACE = re.compile(r"\s+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_MATH = re.compile(r"[+\-*/=^%×÷<>]|\\frac|\\sqrt|\bsqrt\b|\$")
_CODE = re.compile(r"```|\bdef |\breturn\b|[{};]|\bfunction\b|#include|\bclass ")
_WORD = re.compile(r"\w+")

NUMERIC_FEATURES: tuple[str, ...] = (
    "log_chars",
    "log_words",
    "log_numbers",
    "digit_frac",
    "log_math",
    "log_code",
    "log_questions",
    "log_lines",
    "log_max_number",
    "mean_word_len",
)


def text_of_content(content: Any) -> str:
    """Text of an OpenAI message `content`: a string, or a list of parts (non-text parts ignored)."""
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


def _prompt_field(prompt: Any) -> str:
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
        return _prompt_field(body.get("prompt"))
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


def clean_text(text: str | bytes) -> str:
    """Valid UTF-8, bounded length: invalid bytes and lone surrogates become U+FFFD / '?'."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        text = "" if text is None else str(text)
    if len(text) > HEAD_CHARS + TAIL_CHARS:
        text = text[:HEAD_CHARS] + TRUNCATION_MARK + text[-TAIL_CHARS:]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. from JSON "\ud800") are not encodable; onnxruntime needs UTF-8.
        text = text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def normalize_text(clean: str) -> str:
    """What the vectorizers see: lowercased, whitespace runs collapsed to one space."""
    return _WHITESPACE.sub(" ", clean.lower()).strip()


def numeric_features(clean: str) -> list[float]:
    """Cheap shape features (length, numbers, math/code markers) of already-cleaned text."""
    numbers = _NUMBER.findall(clean)
    n_chars = len(clean)
    # Characters inside numbers (incl. separators): a digit share without a per-char Python loop.
    digits = sum(map(len, numbers))
    words = _WORD.findall(clean)
    biggest = max((len(n) for n in numbers), default=0)
    return [
        math.log1p(n_chars),
        math.log1p(len(words)),
        math.log1p(len(numbers)),
        digits / n_chars if n_chars else 0.0,
        math.log1p(len(_MATH.findall(clean))),
        math.log1p(len(_CODE.findall(clean))),
        math.log1p(clean.count("?")),
        math.log1p(clean.count("\n")),
        math.log1p(biggest),
        (sum(len(w) for w in words) / len(words)) if words else 0.0,
    ]


def model_inputs(texts: Iterable[str | bytes]) -> tuple[list[str], np.ndarray]:
    """Raw texts -> (normalized texts, float32 numeric matrix), the inputs of every model."""
    normalized: list[str] = []
    rows: list[list[float]] = []
    for text in texts:
        clean = clean_text(text)
        normalized.append(normalize_text(clean))
        rows.append(numeric_features(clean))
    numeric = np.asarray(rows, dtype=np.float32).reshape(len(rows), len(NUMERIC_FEATURES))
    return normalized, numeric


def request_texts(bodies: Sequence[Mapping[str, Any]], context_turns: int = 2) -> list[str]:
    return [request_text(b, context_turns) for b in bodies]
