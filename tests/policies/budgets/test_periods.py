"""Period boundaries (UTC and zones, DST, month ends) and the worst-case cost estimate."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.config import Price
from backends.tokens import _encoding
from policies.budgets.estimate import prompt_token_bound, worst_case
from policies.budgets.periods import minute_window, period_window
from policies.config import BudgetsConfig

UTC_ZONE = ZoneInfo("UTC")


def ts(*args: int, zone: ZoneInfo = UTC_ZONE) -> float:
    return datetime(*args, tzinfo=zone).timestamp()


def test_daily_window_in_utc() -> None:
    w = period_window("daily", ts(2026, 11, 30, 23, 59, 59), UTC_ZONE)
    assert w.id == "d20261130"
    assert w.start == ts(2026, 11, 30) and w.end == ts(2026, 12, 1)
    assert w.seconds_to_reset(ts(2026, 11, 30, 23, 59, 59)) == pytest.approx(1.0)
    assert period_window("daily", ts(2026, 12, 1), UTC_ZONE).id == "d20261201"


def test_monthly_window_rolls_over_the_year() -> None:
    w = period_window("monthly", ts(2026, 12, 31, 12), UTC_ZONE)
    assert w.id == "m202612" and w.end == ts(2027, 1, 1)
    assert w.elapsed_fraction(ts(2026, 12, 31, 12)) == pytest.approx(30.5 / 31)
    feb = period_window("monthly", ts(2028, 2, 29, 1), UTC_ZONE)  # leap year
    assert feb.end == ts(2028, 3, 1)


def test_total_never_resets() -> None:
    w = period_window("total", ts(2026, 11, 30), UTC_ZONE)
    assert w.id == "total" and w.end is None and w.seconds_to_reset(0) is None
    assert w.elapsed_fraction(ts(2026, 11, 30)) == 0.0


def test_configured_zone_sets_the_boundary() -> None:
    paris = ZoneInfo("Europe/Paris")
    # 23:30 UTC on Nov 30 is already Dec 1 in Paris (UTC+1).
    w = period_window("daily", ts(2026, 11, 30, 23, 30), paris)
    assert w.id == "d20261201"
    assert w.start == ts(2026, 12, 1, zone=paris)


def test_daylight_saving_days_are_23_and_25_hours() -> None:
    paris = ZoneInfo("Europe/Paris")
    spring = period_window("daily", ts(2026, 3, 29, 12, zone=paris), paris)
    autumn = period_window("daily", ts(2026, 10, 25, 12, zone=paris), paris)
    assert spring.end is not None and autumn.end is not None
    assert spring.end - spring.start == 23 * 3600
    assert autumn.end - autumn.start == 25 * 3600


def test_minute_window() -> None:
    minute, to_next = minute_window(ts(2026, 11, 30, 10, 0, 45))
    assert to_next == pytest.approx(15.0) and minute * 60 == ts(2026, 11, 30, 10)


def test_unknown_zone_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        BudgetsConfig(timezone="Mars/Olympus")


def test_worst_case_uses_max_tokens_default_and_choices() -> None:
    price = Price(input_per_mtok=10, output_per_mtok=30)
    body = {"messages": [{"role": "user", "content": "hello"}]}
    default = worst_case(body, price, 1024)
    assert default.completion_tokens == 1024
    assert default.nanos == price.cost_nanos(default.prompt_tokens, 1024)
    assert worst_case({**body, "max_tokens": 10}, price, 1024).completion_tokens == 10
    several = worst_case({**body, "max_completion_tokens": 7, "n": 3}, price, 1024)
    assert several.completion_tokens == 21
    assert worst_case(body, price, 1024, "tiktoken").prompt_tokens < default.prompt_tokens
    assert price.cost_nanos(1_000_000, 1_000_000) == 40 * 10**9


_text = st.text(st.characters(codec="utf-8"), max_size=400)


@settings(max_examples=150, deadline=None)
@given(st.lists(_text, min_size=1, max_size=4))
def test_byte_bound_never_undercounts_a_bpe_tokenizer(texts: list[str]) -> None:
    enc = _encoding()
    assert enc is not None, "tiktoken's cl100k_base must load offline (from litellm's copy)"
    body = {"messages": [{"role": "user", "content": t} for t in texts]}
    actual = sum(len(enc.encode_ordinary(t)) for t in texts)
    assert prompt_token_bound(body) >= actual + 4 * len(texts)  # room for role markers
