"""Budget periods (hourly, daily, weekly, monthly, total) in the configured zone, and the rpm/tpm
minute."""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

# Every period a limit may use (policies/config.py BudgetLimit.period lists the same names). The
# Redis scripts take the current window of each, in this order, from the Python side.
PERIODS = ("hourly", "daily", "weekly", "monthly", "total")


@dataclass(frozen=True, slots=True)
class PeriodWindow:
    id: str  # names the period in storage keys: h2026113009+0000, d20261130, w2026W49, m202611
    start: float  # UNIX seconds
    end: float | None  # None for 'total' (never resets)

    def elapsed_fraction(self, now: float) -> float:
        if self.end is None:
            return 0.0
        return min(1.0, max(0.0, (now - self.start) / (self.end - self.start)))

    def seconds_to_reset(self, now: float) -> float | None:
        return None if self.end is None else max(0.0, self.end - now)


def period_window(period: str, now: float, zone: ZoneInfo) -> PeriodWindow:
    """The period containing `now`, with boundaries at the local hour, midnight, Monday midnight
    or the 1st in `zone`."""
    if period == "total":
        return PeriodWindow("total", 0.0, None)
    local = datetime.fromtimestamp(now, zone)
    if period == "hourly":
        start = local.replace(minute=0, second=0, microsecond=0)
        # The UTC offset is in the id: the hour a DST change repeats is a new window, not the
        # same one twice. An hour is 3600 s even across DST changes.
        return PeriodWindow(f"h{start:%Y%m%d%H%z}", start.timestamp(), start.timestamp() + 3600)
    if period == "weekly":
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0).replace(tzinfo=None)
        start = (midnight - timedelta(days=local.weekday())).replace(tzinfo=zone)  # ISO: Monday
        nxt = (start.replace(tzinfo=None) + timedelta(days=7)).replace(tzinfo=zone)
        year, week, _ = start.isocalendar()
        return PeriodWindow(f"w{year}W{week:02d}", start.timestamp(), nxt.timestamp())
    if period == "daily":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        # Add a calendar day in local time; re-localise so DST days are 23 or 25 hours long.
        nxt = (start.replace(tzinfo=None) + timedelta(days=1)).replace(tzinfo=zone)
        return PeriodWindow(f"d{start:%Y%m%d}", start.timestamp(), nxt.timestamp())
    if period == "monthly":
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        days = calendar.monthrange(start.year, start.month)[1]
        nxt = (start.replace(tzinfo=None) + timedelta(days=days)).replace(tzinfo=zone)
        return PeriodWindow(f"m{start:%Y%m}", start.timestamp(), nxt.timestamp())
    raise ValueError(f"unknown budget period {period!r}")


class PeriodWindows:
    """The current window of every period in one zone, computed once per second."""

    def __init__(self, zone: ZoneInfo) -> None:
        self.zone = zone
        self._cached: tuple[int, dict[str, PeriodWindow]] | None = None

    def at(self, now: float) -> dict[str, PeriodWindow]:
        # Boundaries fall on whole seconds, so one computation serves a whole second of requests.
        second = int(now)
        cached = self._cached
        if cached is None or cached[0] != second:
            cached = (second, {p: period_window(p, now, self.zone) for p in PERIODS})
            self._cached = cached
        return cached[1]


def minute_window(now: float) -> tuple[int, float]:
    """rpm/tpm use fixed one-minute windows (UTC minutes): (minute number, seconds to the next)."""
    minute = int(now // 60)
    return minute, (minute + 1) * 60 - now
