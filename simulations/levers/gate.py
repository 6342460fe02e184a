"""The release gate: a verdict per candidate (and per combination) against the user's tolerance.

Quality: the candidate may lose at most `max_quality_loss` (0.02 = 2 points of the judge's
outcome scale) against the reference *at the stated confidence*: the lower end of the interval
of the paired difference must stay above -max_quality_loss, so a small trial whose interval is
wide does not pass on luck. That interval is the wider of a paired bootstrap and a score bound
(simulations/levers/summary.py score_bound) that stays wide at small n and when every pair ties:
8 tied pairs give a lower end of -0.39, not 0. A gate also needs evidence the judge could tell the
answers apart: at least `min_informative_pairs` pairs that are not ties (a win or a loss). A
candidate with no judged pair, too few informative ones or an interval that cannot be computed
fails, each with its reason.
Latency: its p95 end-to-end latency at most `max_p95_latency_s`, when given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulations.levers.summary import Row

# Pairs that are not ties a quality gate needs (`levers trial --min-informative-pairs`).
DEFAULT_MIN_INFORMATIVE_PAIRS = 10


@dataclass(frozen=True, slots=True)
class Tolerance:
    max_quality_loss: float | None = None
    max_p95_latency_s: float | None = None
    confidence: float = 0.95
    min_informative_pairs: int = DEFAULT_MIN_INFORMATIVE_PAIRS

    @property
    def active(self) -> bool:
        return self.max_quality_loss is not None or self.max_p95_latency_s is not None


@dataclass(frozen=True, slots=True)
class Verdict:
    row: str
    passed: bool
    reasons: tuple[str, ...]


def verdict(row: Row, tol: Tolerance) -> Verdict:
    reasons: list[str] = []
    passed = True
    if tol.max_quality_loss is not None:
        q = row.quality
        if q is None or q.labelled == 0:
            passed = False
            unparsed = f", {q.unparsed} unparsed" if q is not None and q.unparsed else ""
            reasons.append(f"quality unknown: no judged pair{unparsed}")
        elif not np.isfinite(q.delta.low):
            passed = False  # never the point estimate in its place: one pair is no interval
            reasons.append(
                f"quality delta {q.delta.value:+.3f}: no interval can be computed from "
                f"{q.labelled} judged pair{'s' * (q.labelled != 1)}"
            )
        else:
            low = q.delta.low
            ok = low >= -tol.max_quality_loss - 1e-12
            passed &= ok
            reasons.append(
                f"quality delta {q.delta.value:+.3f}, lower bound {low:+.3f} at "
                f"{tol.confidence:.0%} {'>=' if ok else '<'} -{tol.max_quality_loss:g} "
                f"({q.labelled} judged pairs, {q.informative} not ties)"
            )
            if q.informative < tol.min_informative_pairs:
                passed = False
                reasons.append(
                    f"too little evidence: {q.informative} of {q.labelled} judged pairs are not "
                    f"ties, at least {tol.min_informative_pairs} needed "
                    "(--min-informative-pairs): ties alone cannot show the judge tells "
                    "the answers apart"
                )
    if tol.max_p95_latency_s is not None:
        p95 = row.e2e_p95_s
        ok = bool(np.isfinite(p95)) and p95 <= tol.max_p95_latency_s
        passed &= ok
        reasons.append(f"p95 latency {p95:.3f} s {'<=' if ok else '>'} {tol.max_p95_latency_s:g} s")
    if row.errors:
        reasons.append(f"{row.errors} failed requests")
    return Verdict(row.name, passed, tuple(reasons))


def verdicts(rows: Sequence[Row], tol: Tolerance) -> list[Verdict]:
    """One verdict per row except the reference's."""
    return [verdict(r, tol) for r in rows if r.kind != "reference"]
