"""request_text and preprocessing: what the model sees for each kind of request."""

from __future__ import annotations

import itertools
import re

import numpy as np

from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.features import (
    HEAD_CHARS,
    NUMERIC_INPUT,
    NUMERIC_INPUTS,
    PACKED_INPUTS,
    PAD_ID,
    TAIL_CHARS,
    TEXT_INPUTS,
    char_id,
    char_ids,
    clean_text,
    is_multiple_choice,
    model_feed,
    model_inputs,
    normalize_text,
    numeric_features,
    numeric_matrix,
)
from trace_format.request_text import CONTEXT_CHARS, request_text

# Texts that stress the numeric features: digits of other scripts and outside the BMP, markers
# at text edges and overlapping, NUL (numeric_matrix's separator) inside a text, case, lengths.
ODD = [
    "",
    "   ",
    "a",
    "7",
    "x1",
    "12 345 6789",
    "٣٤ ١٢ ０９",
    "𝟘𝟙𝟚 12 𝟗",
    "ΑΣ ΣΑ",
    "def \ndef\tdef def ",
    "```````",
    "\\frac{1}{2} sqrt SQRT \\fraclass ",
    "#includef x #include <x>",
    "a?b?\n\n",
    "\x00\x00 12\x0034\x00",
    "İstanbul 12",
    "x" * 8000 + " 123",
    "class  import  function return;{}$%^×÷<>=*/-+",
    "ok \ufffd bytes 12",
    " \t\n lead and trail \u3000",
    # Markers cut at text edges (texts are scored side by side in a batch) and repeated.
    "s",
    "qrt sqrt",
    "sqrtsqrt qq",
    "`",
    "``",
    "`` ``` ```` `````",
    "#",
    "#includ",
    "e #include#include",
    "\\",
    "\\fra",
    "c\\frac",
]


def _real_prompts(count: int) -> list[str]:
    prompts = load_dataset(routellm_data_dir(), require_outcomes=False).prompts
    rng = np.random.default_rng(1)
    return [prompts[i] for i in rng.choice(len(prompts), count, replace=False)]


def test_last_user_turn_with_bounded_context() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "x" * 5000},
            {"role": "user", "content": "final question"},
        ]
    }
    assert request_text(body, context_turns=0) == "final question"
    text = request_text(body, context_turns=2)
    assert text.startswith("first question\n")
    assert text.endswith("\nfinal question")
    # The long assistant turn contributes only its last CONTEXT_CHARS characters.
    assert text.count("x") == CONTEXT_CHARS
    assert "be brief" not in text


def test_content_parts_ignore_non_text() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:..."}},
                    {"type": "text", "text": "describe"},
                    {"type": "input_audio", "input_audio": {"data": "..."}},
                    {"type": "text", "text": "briefly"},
                    "garbage",
                ],
            }
        ]
    }
    assert request_text(body) == "describe\nbriefly"


def test_completions_prompt_forms() -> None:
    assert request_text({"prompt": "hello"}) == "hello"
    assert request_text({"prompt": ["a", "b"]}) == "a\nb"
    assert request_text({"prompt": [1, 2, 3]}) == ""
    assert request_text({}) == ""
    assert request_text({"messages": "not a list", "prompt": "p"}) == "p"
    assert request_text({"messages": [{"role": "system", "content": "only system"}]}) == (
        "only system"
    )


def test_huge_text_truncated_deterministically() -> None:
    huge = ("abc " * 300_000)[:1_000_000] + "THE END"
    out = clean_text(huge)
    assert len(out) <= HEAD_CHARS + TAIL_CHARS + 5
    assert out == clean_text(huge)
    assert out.endswith("THE END")


def test_invalid_utf8_and_surrogates_become_valid() -> None:
    assert clean_text(b"ok \xff\xfe bytes") == "ok \ufffd\ufffd bytes"
    cleaned = clean_text("lone \ud800 surrogate")
    cleaned.encode("utf-8")  # must not raise


def test_normalize_lowercases_and_collapses_whitespace() -> None:
    assert normalize_text("  Hello\n\tWORLD  Straße ") == "hello world straße"


def test_multiple_choice_gate() -> None:
    mc = "Which is a prime?\nA. 4\nB. 6\nC. 7\nD. 9\nAnswer:"
    assert is_multiple_choice(mc)
    assert not is_multiple_choice("Natalia sold 48 clips in April. How many in May?")
    cols = model_inputs([mc, "open question 12 + 30?"])
    assert cols["mc_text"][0] and not cols["open_text"][0]
    assert cols["open_text"][1] and not cols["mc_text"][1]
    assert cols["is_mc"].tolist() == [1.0, 0.0]
    assert cols["mc_log_numbers"][1] == 0.0 and cols["open_log_numbers"][1] > 0


def test_char_ids_mark_word_characters_as_python_re_does() -> None:
    # The graph finds word boundaries from the sign of a character id; scikit-learn's token
    # pattern uses Python's `\w`. They must agree on every kind of character, BMP or not.
    sample = "aZ_09 ,.!?-\t½²é中ـ\u0301\u200b𝐀𠀀😀\x00"
    for char in sample:
        assert (char_id(char) >= 0) == bool(re.match(r"\w", char)), repr(char)
    ids = char_ids(["ab c", "", "𝐀!"])
    assert ids.shape == (3, 4) and ids.dtype == np.int64
    assert ids[0].tolist() == [97, 98, char_id(" "), 99]
    assert (ids[1] == PAD_ID).all()
    assert ids[2].tolist() == [ord("𝐀"), char_id("!"), PAD_ID, PAD_ID]
    # PAD is no character: every non-word character maps below it.
    assert char_id("\x00") < PAD_ID
    assert char_ids(["", ""]).shape == (2, 1)


def test_numeric_matrix_equals_numeric_features() -> None:
    # The vectorised batch version must give exactly the plain per-text definition, whatever the
    # batch size and the neighbours of a text.
    cleans = [clean_text(t) for t in [*_real_prompts(1500), *ODD]]
    normalized = [normalize_text(c) for c in cleans]
    expected = np.array([numeric_features(c, n) for c, n in zip(cleans, normalized, strict=True)])
    for size in (1, 2, 7, 64, len(cleans)):
        got = np.vstack(
            [
                numeric_matrix(cleans[i : i + size], normalized[i : i + size])
                for i in range(0, len(cleans), size)
            ]
        )
        assert np.array_equal(got, expected), size
    reversed_rows = numeric_matrix(cleans[::-1], normalized[::-1])
    assert np.array_equal(reversed_rows, expected[::-1])
    assert numeric_matrix([], []).shape == (0, expected.shape[1])


def test_model_feed_matches_model_inputs() -> None:
    texts = [*_real_prompts(300), *ODD]
    columns = model_inputs(texts)
    cleans = [clean_text(t) for t in texts]
    kinds = [is_multiple_choice(c) for c in cleans]
    feed = model_feed(cleans, kinds)
    for name in TEXT_INPUTS:
        assert np.array_equal(feed[name], char_ids(columns[name]))
    for name in NUMERIC_INPUTS:
        assert feed[name].shape == (len(texts), 1) and feed[name].dtype == np.float32
        assert np.array_equal(feed[name][:, 0], columns[name])
    # One kind only: the other text input may shrink to one padding row.
    mc_only = [c for c, k in zip(cleans, kinds, strict=True) if k]
    narrow = model_feed(mc_only, [True] * len(mc_only), one_row_if_empty=True)
    assert narrow["open_text"].tolist() == [[PAD_ID]]
    assert narrow["mc_text"].shape[0] == len(mc_only)
    strings = model_feed(cleans[:3], kinds[:3], ids=False)
    assert strings["mc_text"].shape == (3, 1) and strings["mc_text"].dtype == object
    # Packed (current exports): the same values as one [rows, features] input, for a batch and
    # for one row (each built its own way).
    for rows in (slice(None), slice(0, 1), slice(-1, None)):
        packed = model_feed(cleans[rows], kinds[rows], packed=True)
        per_input = model_feed(cleans[rows], kinds[rows])
        assert set(packed) == set(PACKED_INPUTS)
        numeric = packed[NUMERIC_INPUT]
        assert numeric.dtype == np.float32 and numeric.flags.c_contiguous
        expected = np.hstack([per_input[name] for name in NUMERIC_INPUTS])
        assert np.array_equal(numeric, expected)


def test_answer_suffix_check_equals_lowercasing_everything() -> None:
    # is_multiple_choice lowercases only the last 7 characters: valid because only these lower to
    # a character of "answer:" (and none expands to several characters there).
    sources = {
        chr(c)
        for c in range(0x110000)
        if not 0xD800 <= c < 0xE000 and set(chr(c).lower()) & set("answer:")
    }
    assert sources == set("ANSWERanswer:")
    cases = ["Answer:", "ANSWER: \n", "x answer:", "İanswer:", "ΣANSWER:", "answer", ": answer:"]
    for text in cases:
        expected = text.rstrip().lower().endswith("answer:")
        assert is_multiple_choice(text) == expected, text


def test_normalize_ascii_fast_path_equals_split_join() -> None:
    # Every string up to 4 characters over ASCII whitespace of each kind, case, NUL and non-ASCII.
    alphabet = ["a", "B", " ", "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\x1f", "\x00"]
    alphabet += ["\x85", "İ"]
    for length in range(5):
        for chars in itertools.product(alphabet, repeat=length):
            text = "".join(chars)
            assert normalize_text(text) == " ".join(text.lower().split()), repr(text)
