"""Deterministic unit -> [0, 1) mapping shared by experiments and the random policy.

sha256 (not Python's ``hash()``, which is salted per process) so every replica and every restart
maps the same unit to the same number.
"""

from __future__ import annotations

import hashlib

_SCALE = float(2**64)


def unit_uniform(salt: str, unit: str) -> float:
    """A uniform number in [0, 1) fixed by (salt, unit)."""
    digest = hashlib.sha256(f"{salt}\x00{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE
