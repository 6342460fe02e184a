"""Request -> model input: the one place that turns a request body into the text the model sees.

Training, evaluation, the proxy and the simulator all go through `request_text` + `model_inputs`,
so a prompt is scored the same way everywhere. Imports only numpy and the standard library: this
module sits on the request path.

Preprocessing happens here, in Python, rather than inside the ONNX graph: lowercasing in the graph
needs a locale that is absent on minimal images, and collapsing whitespace here makes scikit-learn
and onnxruntime see the same characters (exact parity for character n-grams). The graph gets the
text as integer character ids (`char_ids`), not strings: onnxruntime's string ops were most of the
batch scoring time.
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

_NUMBER = re.compile(r"\d+")
_MATH = ("+", "-", "*", "/", "=", "^", "%", "×", "÷", "<", ">", "$", "\\frac", "sqrt")
_CODE = ("```", "def ", "return", "{", "}", ";", "function", "#include", "class ", "import ")
_OPTION = re.compile(r"(?m)^[ \t]*\(?([A-Ha-h])[.)][ \t]")

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
TEXT_INPUTS: tuple[str, ...] = ("mc_text", "open_text")
NUMERIC_INPUTS: tuple[str, ...] = (
    *(f"mc_{n}" for n in NUMERIC_FEATURES),
    *(f"open_{n}" for n in NUMERIC_FEATURES),
    "is_mc",
)
MODEL_INPUTS: tuple[str, ...] = (*TEXT_INPUTS, *NUMERIC_INPUTS)

# Text reaches the ONNX graph as integers, one per character, so the graph counts n-grams over
# int64 pools (string ops dominated batch time). Word characters (Python's `\w`: alphanumeric or
# "_") keep their code point; any other character c becomes -c - 3, so the graph can find word
# boundaries with one Max(x, SEP). PAD fills rows to the batch width and is in no character n-gram;
# it equals SEP because the end of a row is a word boundary too.
PAD_ID = -2
SEP_ID = -2
_TABLE_SIZE = 0x3000  # code points below this are looked up in a table, the rest computed
_WORD_TABLE = np.array([chr(c).isalnum() or c == 0x5F for c in range(_TABLE_SIZE)])


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
    return " ".join(clean.lower().split())


def _count(text: str, needles: tuple[str, ...]) -> int:
    # str.count runs in C: an order of magnitude faster than a regex alternation here.
    return sum(text.count(n) for n in needles)


def numeric_features(clean: str, normalized: str | None = None) -> list[float]:
    """Cheap shape features (length, numbers, math/code markers) of already-cleaned text."""
    if normalized is None:
        normalized = normalize_text(clean)
    n_chars = len(clean)
    # normalize_text joined the words with single spaces: count them without splitting again.
    n_words = normalized.count(" ") + 1 if normalized else 0
    numbers = _NUMBER.findall(clean)
    digits = sum(map(len, numbers))
    biggest = max(map(len, numbers), default=0)
    return [
        math.log1p(n_chars),
        math.log1p(n_words),
        math.log1p(len(numbers)),
        digits / n_chars if n_chars else 0.0,
        math.log1p(_count(clean, _MATH)),
        math.log1p(_count(clean, _CODE)),
        math.log1p(clean.count("?")),
        math.log1p(clean.count("\n")),
        math.log1p(biggest),
        (len(normalized) - n_words + 1) / n_words if n_words else 0.0,
    ]


def is_multiple_choice(clean: str) -> bool:
    """Options on their own lines ("A. ...", "B) ...") or a trailing "Answer:" prompt.

    Multiple-choice and open questions behave differently (what makes one hard for the small
    model says little about the other), so the model keeps a separate set of weights for each.
    """
    if clean.rstrip().lower().endswith("answer:"):
        return True
    return len(set(_OPTION.findall(clean[:HEAD_CHARS]))) >= 2


def model_inputs(texts: Iterable[str | bytes]) -> dict[str, Any]:
    """Raw texts -> the model's named inputs (column name -> list of str or float32 array).

    The text goes to `mc_text` or `open_text` (the other gets ""), and each numeric feature to
    `mc_<name>` or `open_<name>` (the other gets 0): one linear model, two regimes.
    """
    mc_texts: list[str] = []
    open_texts: list[str] = []
    rows: list[list[float]] = []
    zeros = [0.0] * len(NUMERIC_FEATURES)
    for text in texts:
        clean = clean_text(text)
        normalized = normalize_text(clean)
        values = numeric_features(clean, normalized)
        if is_multiple_choice(clean):
            mc_texts.append(normalized)
            open_texts.append("")
            rows.append([*values, *zeros, 1.0])
        else:
            mc_texts.append("")
            open_texts.append(normalized)
            rows.append([*zeros, *values, 0.0])
    numeric = np.asarray(rows, dtype=np.float32).reshape(len(rows), len(NUMERIC_INPUTS))
    columns: dict[str, Any] = {"mc_text": mc_texts, "open_text": open_texts}
    for i, name in enumerate(NUMERIC_INPUTS):
        columns[name] = numeric[:, i]
    return columns


def char_id(char: str) -> int:
    """The integer the graph sees for one character (see PAD_ID)."""
    code = ord(char)
    return code if char.isalnum() or char == "_" else -code - 3


def _word_mask(codes: np.ndarray) -> np.ndarray:
    if not codes.size or codes.max() < _TABLE_SIZE:
        return _WORD_TABLE[codes]
    mask = _WORD_TABLE[np.minimum(codes, _TABLE_SIZE - 1)]
    high = codes >= _TABLE_SIZE
    rare = np.unique(codes[high])
    is_word = np.array([chr(c).isalnum() or c == 0x5F for c in rare.tolist()])
    mask[high] = is_word[np.searchsorted(rare, codes[high])]
    return mask


def char_ids(texts: Sequence[str]) -> np.ndarray:
    """Normalized texts -> [rows, longest] int64 character ids (char_id), padded with PAD_ID."""
    joined = "".join(texts)
    if not joined:
        return np.full((len(texts), 1), PAD_ID, np.int64)
    codes = np.frombuffer(joined.encode("utf-32-le"), np.uint32).astype(np.int64)
    ids = np.where(_word_mask(codes), codes, -3 - codes)
    if len(texts) == 1:  # one query at a time: the proxy's case, skip the padding work
        return ids.reshape(1, -1)
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    width = int(lengths.max())
    out = np.full((len(texts), width), PAD_ID, np.int64)
    out[np.arange(width) < lengths[:, None]] = ids
    return out


def request_texts(bodies: Sequence[Mapping[str, Any]], context_turns: int = 2) -> list[str]:
    return [request_text(b, context_turns) for b in bodies]
