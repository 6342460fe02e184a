"""request_text and preprocessing: what the model sees for each kind of request."""

from __future__ import annotations

import re

import numpy as np

from classifiers.features import (
    CONTEXT_CHARS,
    HEAD_CHARS,
    PAD_ID,
    TAIL_CHARS,
    char_id,
    char_ids,
    clean_text,
    is_multiple_choice,
    model_inputs,
    normalize_text,
    request_text,
)


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
