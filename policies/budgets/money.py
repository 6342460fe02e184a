"""Money inside the budget stores: integer nano-USD, so sums are exact and the Redis and in-process
stores agree to the last digit. Token prices become nanos in `backends.config.cost_nanos`."""

from __future__ import annotations

from backends.config import NANOS_PER_USD


def usd_to_nanos(usd: float) -> int:
    return int(round(usd * NANOS_PER_USD))


def nanos_to_usd(nanos: int) -> float:
    return nanos / NANOS_PER_USD
