"""The ledger: one entry per charge (and per operator reset), oldest first; spend can be rebuilt
from it alone, which is what `cost-router budget audit` checks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class LedgerEntry:
    request_id: str
    team: str
    key_id: str | None
    nanos: int
    kind: str  # settle | direct (no live reservation) | reset (operator zeroed the windows)
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (scope, period id) touched
    time: float = 0.0
    # The actual cost past the reservation, not charged (a tokenizer mismatch: the upstream
    # counted more prompt tokens than the estimate allowed). Never part of `nanos` or spend.
    overage_nanos: int = 0

    @property
    def periods(self) -> dict[str, str]:
        return dict(self.pairs)


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """The stored `periods` field: ``scope=period-id`` joined by ``;``."""
    return [(a, b) for a, _, b in (p.partition("=") for p in text.split(";") if p)]


def spend_from_ledger(entries: list[LedgerEntry]) -> dict[tuple[str, str], int]:
    """Rebuild spend per (scope, period id) from the ledger alone: the audit of the spend hash."""
    spend: dict[tuple[str, str], int] = {}
    for e in entries:
        for pair in e.pairs:
            spend[pair] = 0 if e.kind == "reset" else spend.get(pair, 0) + e.nanos
    return {k: v for k, v in spend.items() if v}
