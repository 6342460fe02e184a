"""The signals snapshot file: every tier's `TierSignals` at one moment, as versioned JSON.

Written by `cost-router backends signals --save`, read by the what-if simulator
(simulations/signal_levers.py) to replace assumed latencies with measured ones.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from backends.tier_signals import TierSignals

SNAPSHOT_VERSION = 1


class SnapshotError(ValueError):
    """A signals snapshot file that cannot be read; the message names the file."""


def save_snapshot(path: str | Path, signals: Mapping[str, TierSignals]) -> None:
    doc = {
        "version": SNAPSHOT_VERSION,
        "time": time.time(),
        "tiers": {name: s.to_dict() for name, s in signals.items()},
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def load_snapshot(path: str | Path) -> dict[str, TierSignals]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SnapshotError(f"cannot read signals snapshot {p}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{p} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tiers"), dict):
        raise SnapshotError(f"{p}: expected an object with 'tiers'")
    if doc.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"{p}: unsupported snapshot version {doc.get('version')!r}")
    try:
        tiers = doc["tiers"].items()
        return {name: TierSignals.from_dict({**s, "tier": name}) for name, s in tiers}
    except TypeError as exc:
        raise SnapshotError(f"{p}: bad tier entry: {exc}") from None
