"""policies/names.py: the one rule for team, user and key names, and its two spellings (the
Python check and the JSON-schema pattern the OpenAPI schema publishes) agreeing."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError

from policies.names import (
    KEY_ID_PATTERN,
    NAME_MAX_LEN,
    NAME_PATTERN,
    check_key_id,
    check_name,
    name_problem,
)
from router.learning.config import SHADOW_SCOPE


@pytest.mark.parametrize(
    "name", ["search", "default", "team-1.eu", "org:ml", "ann+ci@example.com", "A" * NAME_MAX_LEN]
)
def test_names_in_use_pass(name: str) -> None:
    assert check_name("team", name) == name


@pytest.mark.parametrize(
    ("name", "words"),
    [
        (SHADOW_SCOPE, "team name '__shadow__': must not start with '__' (reserved for internal"),
        ("__x", "reserved"),
        ("", "must not be empty"),
        ("a\x00b", r"team name 'a\x00b': must start with a letter or digit"),
        ("x}y{z", "team name 'x}y{z': must start with a letter or digit and contain only"),
        ("a|b", "contain only letters"),  # the store's field separator
        ("a b", "contain only letters"),
        ("abc\n", r"'abc\n'"),  # `$` alone would let a trailing newline through
        ("\x1b[31mred", r"'\x1b[31mred'"),  # a terminal escape, shown escaped
        ("é", r"'\xe9'"),
        ("-lead", "must start with a letter or digit"),
        ("t" * (NAME_MAX_LEN + 1), f"must be at most {NAME_MAX_LEN} characters"),
    ],
)
def test_refused_names_say_which_rule_and_show_the_value_safely(name: str, words: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_name("team", name)
    message = str(refused.value)
    assert words in message
    assert message.isprintable() and message.isascii()


def test_a_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(ValueError) as refused:
        check_name("user", "u" * 10_000)
    message = str(refused.value)
    assert message.startswith("user name 'uuuu") and "(10000 characters)" in message
    assert len(message) < 200


class _Schema(BaseModel):
    """The rule as the published schema states it (pattern + maxLength), checked by pydantic's
    own (Rust, ECMA-like) regex engine: the schema promises what the server enforces."""

    name: str = Field(max_length=NAME_MAX_LEN, pattern=NAME_PATTERN)


def _schema_accepts(value: str) -> bool:
    try:
        _Schema(name=value)
    except ValidationError:
        return False
    return True


@given(
    st.one_of(
        st.text(max_size=NAME_MAX_LEN + 2),
        st.text(alphabet="aZ09._@:+-_{}| \n\x00", max_size=12),
        st.from_regex(NAME_PATTERN, fullmatch=True),
    )
)
def test_the_schema_pattern_and_the_check_agree(value: str) -> None:
    assert _schema_accepts(value) == (name_problem(value) is None), ascii(value)


def test_key_ids() -> None:
    assert check_key_id("0123456789ABCDEF") == "0123456789abcdef"
    for bad in ["abc", "0123456z", "0" * 65, "01234567\n"]:
        with pytest.raises(ValueError, match="hex digits"):
            check_key_id(bad)
    assert re.fullmatch(KEY_ID_PATTERN, "0" * 64)
