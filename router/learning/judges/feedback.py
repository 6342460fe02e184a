"""`feedback`: a user's explicit score (POST /v1/feedback) of the answer they saw becomes that
tier's outcome. `feedback_labels` turns the feedback file beside the traces into label records
(the tier comes from the request's trace); `append_feedback_labels` writes the new ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from router.learning.judges.base import NO_LABEL, Case, Judgement
from trace_format.feedback import feedback_path_for, load_feedback
from trace_format.labels import LabelRecord, append_labels, iter_labels, labels_path_for
from trace_format.reader import iter_records, trace_files


class FeedbackJudge:
    name = "feedback"
    version = "v1"

    def bound_usd(self, case: Case) -> float:
        return 0.0

    async def judge(self, case: Case) -> Judgement:
        if case.feedback is None or not case.answers:
            return NO_LABEL
        score = _clip(case.feedback)
        return Judgement({case.answers[0].tier: score}, verdict=f"{score:g}")


def _clip(score: float) -> float:
    return min(1.0, max(0.0, float(score)))


def _answered_tiers(trace_dir: Path, wanted: set[str]) -> dict[str, str]:
    tiers: dict[str, str] = {}
    for path in trace_files([trace_dir]):
        for _, record in iter_records(path):
            if record.id in wanted and record.tier and record.status == 200:
                tiers[record.id] = record.tier
    return tiers


def feedback_labels(trace_path: str | Path) -> Iterator[LabelRecord]:
    """One label per request with feedback (its mean score, as the A/B report reads it), for
    the tier that answered it; feedback on a request without a trace gives none."""
    trace_path = Path(trace_path)
    scores = load_feedback(feedback_path_for(trace_path))
    if not scores:
        return
    tiers = _answered_tiers(trace_path.parent, set(scores))
    for request_id, score in scores.items():
        tier = tiers.get(request_id)
        if tier is not None:
            yield LabelRecord(
                request_id=request_id,
                judge=FeedbackJudge.name,
                judge_version=FeedbackJudge.version,
                outcomes={tier: _clip(score)},
                verdict=f"{_clip(score):g}",
            )


def append_feedback_labels(trace_path: str | Path) -> int:
    """Append a label for each request whose feedback is not yet labelled as it now stands
    (a later label of the same tier overrides an earlier one); returns how many."""
    path = labels_path_for(trace_path)
    current = {r.request_id: r.outcomes for r in iter_labels(path) if r.judge == "feedback"}
    new = [
        rec for rec in feedback_labels(trace_path) if current.get(rec.request_id) != rec.outcomes
    ]
    if new:
        append_labels(path, new)
    return len(new)
