"""Request text -> model input (`trace_format.request_text` turns a request body into that text).

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
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# Text budget: the head of a prompt carries the question, the tail carries the final ask, so a huge
# prompt keeps both. The longest prompt in the shared data is about 4,900 characters: nothing the
# model was trained on is cut.
HEAD_CHARS = 6000
TAIL_CHARS = 2000
TRUNCATION_MARK = " … "

# ASCII byte -> lowercase, any ASCII whitespace (str.split's, e.g. \x1c-\x1f too) -> space.
_ASCII_LOWER_SPACE = bytes(
    32 if chr(c).isspace() else ord(chr(c).lower()) if c < 128 else c for c in range(256)
)
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
# The graph classifiers.export writes takes the numeric features packed in one [rows,
# len(NUMERIC_INPUTS)] float32 input, columns in NUMERIC_INPUTS order: onnxruntime's cost per
# input (an OrtValue each, checks in its Python wrapper) was a quarter of a one-prompt run with 21
# one-column inputs. Models exported before take MODEL_INPUTS (one input per feature).
NUMERIC_INPUT = "numeric"
PACKED_INPUTS: tuple[str, ...] = (*TEXT_INPUTS, NUMERIC_INPUT)

# Text reaches the ONNX graph as integers, one per character, so the graph counts n-grams over
# int64 pools (string ops dominated batch time). Word characters (Python's `\w`: alphanumeric or
# "_") keep their code point; any other character c becomes -c - 3, so the graph can find word
# boundaries with one Max(x, SEP). PAD fills rows to the batch width and is in no character n-gram;
# it equals SEP because the end of a row is a word boundary too.
PAD_ID = -2
# Words: maximal runs of 2+ word characters. classifiers.ngram_pool reproduces exactly this
# pattern in the ONNX graph from character ids (word boundaries = non-word characters).
WORD_PATTERN = r"(?u)\w{2,}"
SEP_ID = -2
_TABLE_SIZE = 0x3000  # code points below this are looked up in a table, the rest computed
_WORD_TABLE = np.array([chr(c).isalnum() or c == 0x5F for c in range(_TABLE_SIZE)])
_ID_TABLE = np.where(_WORD_TABLE, np.arange(_TABLE_SIZE), -3 - np.arange(_TABLE_SIZE))

# numeric_matrix counts characters by class (each character in at most one class) and adds the
# multi-character markers; "runs" (numbers) is no character's class. A marker holding a rare
# "anchor" character is found from that character's positions (the class lookup finds them
# anyway), the others with str searches over all texts at once.
_CLASS_NAMES = ("other", "digit", "newline", "question", "math", "code", "runs", "anchor")
_DIGIT, _NEWLINE, _QUESTION, _MATH_CHAR, _CODE_CHAR, _RUNS, _ANCHOR = 1, 2, 3, 4, 5, 6, 7
_ANCHORS = "\\`#q"
_MARKERS = tuple(
    (marker, column)
    for markers, column in ((_MATH, _MATH_CHAR), (_CODE, _CODE_CHAR))
    for marker in markers
    if len(marker) > 1
)
# (marker, column, index of its anchor) for the anchored markers; the rest are searched.
_ANCHORED = tuple(
    (marker, column, min(marker.index(a) for a in _ANCHORS if a in marker))
    for marker, column in _MARKERS
    if set(marker) & set(_ANCHORS)
)
_SEARCHED = tuple((m, c) for m, c in _MARKERS if not set(m) & set(_ANCHORS))


def _char_class(char: str) -> int:
    if _NUMBER.match(char):
        return _DIGIT
    if char == "\n":
        return _NEWLINE
    if char == "?":
        return _QUESTION
    if char in _MATH:
        return _MATH_CHAR
    if char in _CODE:
        return _CODE_CHAR
    return _ANCHOR if char in _ANCHORS else 0


# ONNX metadata_props key set to "1" by graphs that accept a text input as one padding row meaning
# "empty in every row" (classifiers.export's lean graph broadcasts it; see model_feed).
BROADCAST_KEY = "cost_router.text_row_broadcast"
# One padding row: the text input of a batch whose rows leave it all empty (see model_feed).
_PAD_ROW = np.full((1, 1), PAD_ID, np.int64)
_PAD_ROW.flags.writeable = False
# Up to this many rows, numeric_inputs calls numeric_features row by row (one query at a time).
_FEW_ROWS = 6
# math.log1p of every count up to the longest cleaned text (HEAD_CHARS + TAIL_CHARS + mark).
_LOG1P = np.array([math.log1p(k) for k in range(HEAD_CHARS + TAIL_CHARS + 64)])
_CLASS_TABLE = np.array([_char_class(chr(c)) for c in range(_TABLE_SIZE)], np.uint8)


def _lookup(table: np.ndarray, codes: np.ndarray, of_char: Any) -> np.ndarray:
    """table[codes]; code points past the table (rare) are computed one distinct value at a time."""
    if not codes.size or codes.max() < len(table):
        return table[codes]
    out = table[np.minimum(codes, len(table) - 1)]
    high = codes >= len(table)
    rare = np.unique(codes[high])
    values = np.array([of_char(chr(c)) for c in rare.tolist()], table.dtype)
    out[high] = values[np.searchsorted(rare, codes[high])]
    return out


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
    if not clean.isascii():
        return " ".join(clean.lower().split())
    # ASCII (most prompts): the same result from C-speed byte passes, without a list of words.
    raw = clean.encode("ascii").translate(_ASCII_LOWER_SPACE)
    while b"  " in raw:
        raw = raw.replace(b"  ", b" ")
    return raw.strip(b" ").decode("ascii")


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
    # Lowercasing only the last 7 characters gives the same answer (only A-Z, a-z and ":" lower
    # to the characters of "answer:", one each) without copying the whole text.
    if clean.rstrip()[-7:].lower() == "answer:":
        return True
    return len(set(_OPTION.findall(clean[:HEAD_CHARS]))) >= 2


def model_inputs(texts: Iterable[str | bytes]) -> dict[str, Any]:
    """Raw texts -> the model's named inputs (column name -> list of str or float32 array).

    The text goes to `mc_text` or `open_text` (the other gets ""), and each numeric feature to
    `mc_<name>` or `open_<name>` (the other gets 0): one linear model, two regimes.
    """
    cleans = [clean_text(text) for text in texts]
    kinds = [is_multiple_choice(clean) for clean in cleans]
    normalized = [normalize_text(clean) for clean in cleans]
    numeric = numeric_inputs(cleans, normalized, kinds)
    columns: dict[str, Any] = {
        "mc_text": [n if mc else "" for n, mc in zip(normalized, kinds, strict=True)],
        "open_text": ["" if mc else n for n, mc in zip(normalized, kinds, strict=True)],
    }
    columns.update(zip(NUMERIC_INPUTS, numeric, strict=True))
    return columns


def model_feed(
    cleans: Sequence[str],
    kinds: Sequence[bool],
    ids: bool = True,
    one_row_if_empty: bool = False,
    packed: bool = False,
) -> dict[str, np.ndarray]:
    """Cleaned texts and their multiple-choice flags -> onnxruntime inputs.

    The same values as `model_inputs`: text as `char_ids` (or, with ids=False, as [rows, 1]
    strings for models exported before character ids), numbers as [rows, 1] float32, or with
    `packed` as one [rows, len(NUMERIC_INPUTS)] `numeric` input (PACKED_INPUTS). With
    `one_row_if_empty`, a text input that is empty in every row is fed as one padding row, for
    graphs that broadcast it (classifiers.export's lean graph): that side's n-gram work is skipped.
    """
    normalized = [normalize_text(clean) for clean in cleans]
    numeric = numeric_inputs(cleans, normalized, kinds, rows_first=packed)
    feed: dict[str, np.ndarray] = {}
    for name, side in (("mc_text", True), ("open_text", False)):
        texts = [n if mc == side else "" for n, mc in zip(normalized, kinds, strict=True)]
        if not ids:
            feed[name] = np.asarray(texts, dtype=object).reshape(-1, 1)
        elif not any(texts) and (one_row_if_empty or len(texts) == 1):
            feed[name] = _PAD_ROW
        else:
            feed[name] = char_ids(texts)
    if packed:
        feed[NUMERIC_INPUT] = numeric
    else:
        # Iterating [inputs, rows, 1] gives contiguous [rows, 1] views, one per input.
        feed.update(zip(NUMERIC_INPUTS, numeric[:, :, None], strict=True))
    return feed


def numeric_inputs(
    cleans: Sequence[str],
    normalized: Sequence[str],
    kinds: Sequence[bool],
    rows_first: bool = False,
) -> np.ndarray:
    """[len(NUMERIC_INPUTS), rows] float32 (one row per input): each text's features on its side
    (multiple-choice or open), zeros on the other, then the multiple-choice flag. With
    `rows_first`, the same values as a C-contiguous [rows, len(NUMERIC_INPUTS)] array."""
    width = len(NUMERIC_FEATURES)
    if len(cleans) <= _FEW_ROWS:  # one query at a time: plain lists beat numpy's call overhead
        zeros = [0.0] * width
        rows = [
            [*numeric_features(c, n), *zeros, 1.0] if mc else [*zeros, *numeric_features(c, n), 0.0]
            for c, n, mc in zip(cleans, normalized, kinds, strict=True)
        ]
        packed = np.array(rows, np.float32).reshape(len(cleans), len(NUMERIC_INPUTS))
        return packed if rows_first else packed.T.copy()
    if rows_first:
        return np.ascontiguousarray(numeric_inputs(cleans, normalized, kinds).T)
    values = numeric_matrix(cleans, normalized).T
    mc = np.asarray(kinds, dtype=bool).reshape(-1)
    out = np.zeros((len(NUMERIC_INPUTS), len(cleans)), np.float32)
    out[:width, mc] = values[:, mc]
    out[width : 2 * width, ~mc] = values[:, ~mc]
    out[-1] = mc
    return out


def _occurrences(text: str, marker: str) -> list[int]:
    """Start of each non-overlapping occurrence, left to right: what str.count counts."""
    found = []
    at = text.find(marker)
    while at >= 0:
        found.append(at)
        at = text.find(marker, at + len(marker))
    return found


def _anchored_occurrences(
    codes: np.ndarray, anchors: np.ndarray, marker: str, at: int
) -> list[int] | np.ndarray:
    """`_occurrences` of a marker whose character `at` is an anchor, from the anchors' positions."""
    begins = anchors[codes[anchors] == ord(marker[at])] - at
    begins = begins[(begins >= 0) & (begins + len(marker) <= len(codes))]
    for k, char in enumerate(marker):
        if begins.size and k != at:
            begins = begins[codes[begins + k] == ord(char)]
    if not any(marker[k:] == marker[: len(marker) - k] for k in range(1, len(marker))):
        return begins
    # A marker that can overlap itself ("```" in "````"): keep non-overlapping ones, left first.
    kept: list[int] = []
    for begin in begins.tolist():
        if not kept or begin >= kept[-1] + len(marker):
            kept.append(begin)
    return kept


def _row_counts(rows: np.ndarray, size: int) -> np.ndarray:
    return np.bincount(rows, minlength=size)[:size]


def _log1p(counts: np.ndarray) -> np.ndarray:
    # math.log1p's values (a table of them), not np.log1p's, which may differ in the last bit:
    # numeric_matrix then equals numeric_features exactly.
    if not counts.size or counts.max() < len(_LOG1P):
        return _LOG1P[counts]
    return np.array([math.log1p(c) for c in counts.tolist()])


def numeric_matrix(cleans: Sequence[str], normalized: Sequence[str]) -> np.ndarray:
    """`numeric_features` of many texts at once, [rows, len(NUMERIC_FEATURES)] float64.

    Vectorised over the code points of all texts joined (per-text Python was most of the batch
    preprocessing time); equal to `numeric_features`, the plain definition, row by row (tested).
    For a few rows numpy's per-call overhead dominates: numeric_inputs does those row by row.
    """
    size = len(cleans)
    n_chars = np.fromiter(map(len, cleans), np.int64, size)
    n_norm = np.fromiter(map(len, normalized), np.int64, size)
    n_words = np.fromiter((n.count(" ") + 1 if n else 0 for n in normalized), np.int64, size)
    # NUL separates the texts: no marker contains it, so no match spans two texts.
    joined = "\x00".join(cleans)
    starts = np.zeros(size, np.int64)
    np.cumsum(n_chars[:-1] + 1, out=starts[1:])
    counts = np.zeros((size, len(_CLASS_NAMES)), np.int64)
    biggest = np.zeros(size, np.int64)
    if joined:
        codes = np.frombuffer(joined.encode("utf-32-le"), np.uint32)
        classes = _lookup(_CLASS_TABLE, codes, _char_class)
        marked = np.flatnonzero(classes)  # most characters are in no class
        found = classes[marked]
        row_of = np.searchsorted(starts, marked, side="right") - 1
        counts = np.bincount(row_of * len(_CLASS_NAMES) + found, minlength=size * len(_CLASS_NAMES))
        counts = counts.reshape(size, len(_CLASS_NAMES))
        digits = marked[found == _DIGIT]
        if digits.size:
            # Runs of consecutive digit positions = the regex's numbers (NUL ends a run too).
            first = np.flatnonzero(np.diff(digits, prepend=-2) != 1)
            lengths = np.diff(first, append=digits.size)
            run_rows = np.searchsorted(starts, digits[first], side="right") - 1
            counts[:, _RUNS] = _row_counts(run_rows, size)
            np.maximum.at(biggest, run_rows, lengths)
        anchors = marked[found == _ANCHOR]
        for marker, column, at in _ANCHORED:
            found_at = _anchored_occurrences(codes, anchors, marker, at)
            if len(found_at):
                rows = np.searchsorted(starts, found_at, "right") - 1
                counts[:, column] += _row_counts(rows, size)
        for marker, column in _SEARCHED:
            found_at = _occurrences(joined, marker)
            if found_at:
                rows = np.searchsorted(starts, found_at, "right") - 1
                counts[:, column] += _row_counts(rows, size)
    with np.errstate(divide="ignore", invalid="ignore"):
        digit_frac = np.where(n_chars > 0, counts[:, _DIGIT] / n_chars, 0.0)
        word_len = np.where(n_words > 0, (n_norm - n_words + 1) / n_words, 0.0)
    return np.column_stack(
        [
            _log1p(n_chars),
            _log1p(n_words),
            _log1p(counts[:, _RUNS]),
            digit_frac,
            _log1p(counts[:, _MATH_CHAR]),
            _log1p(counts[:, _CODE_CHAR]),
            _log1p(counts[:, _QUESTION]),
            _log1p(counts[:, _NEWLINE]),
            _log1p(biggest),
            word_len,
        ]
    )


def char_id(char: str) -> int:
    """The integer the graph sees for one character (see PAD_ID)."""
    code = ord(char)
    return code if char.isalnum() or char == "_" else -code - 3


def char_ids(texts: Sequence[str]) -> np.ndarray:
    """Normalized texts -> [rows, longest] int64 character ids (char_id), padded with PAD_ID."""
    joined = "".join(texts)
    if not joined:
        return np.full((len(texts), 1), PAD_ID, np.int64)
    ids = _lookup(_ID_TABLE, np.frombuffer(joined.encode("utf-32-le"), np.uint32), char_id)
    if len(texts) == 1:  # one query at a time: the proxy's case, skip the padding work
        return ids.reshape(1, -1)
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    width = int(lengths.max())
    out = np.full((len(texts), width), PAD_ID, np.int64)
    out[np.arange(width) < lengths[:, None]] = ids
    return out
