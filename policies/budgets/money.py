"""Money inside the budget stores: integer nano-USD, so sums are exact and the Redis and in-process
stores agree to the last digit. Token prices become nanos in `backends.config.cost_nanos`."""

from __future__ import annotations

import math

from backends.config import NANOS_PER_USD

# The largest amount one value may carry (about $9M): Redis's Lua numbers are doubles, exact up to
# 2**53, and its counters are 64-bit, so even ~1000 such reservations at once cannot overflow.
# Request validation (router/http/schemas.py) keeps real worst cases far below; this is the
# backstop.
MAX_NANOS = 2**53


def usd_to_nanos(usd: float) -> int:
    """Nanos of `usd`, clamped to +-MAX_NANOS (NaN is refused: it is no amount at all)."""
    if math.isnan(usd):
        raise ValueError("amount is NaN")
    return int(round(min(max(usd * NANOS_PER_USD, -MAX_NANOS), MAX_NANOS)))


def nanos_to_usd(nanos: int) -> float:
    return nanos / NANOS_PER_USD
