"""`JUDGES`: the one list of judge kinds, and building the configured ones."""

from __future__ import annotations

from collections.abc import Mapping

from backends.base import Backend
from backends.config import TierConfig
from router.evaluation.config import JudgesConfig
from router.evaluation.judges.base import Judge
from router.evaluation.judges.feedback import FeedbackJudge
from router.evaluation.judges.llm import LlmJudge
from router.evaluation.judges.prompt import load_prompt
from router.evaluation.judges.reference import ReferenceJudge

JUDGES = ("llm", "reference", "feedback")


def build_judges(settings: JudgesConfig, tiers: Mapping[str, TierConfig],
                 backends: Mapping[str, Backend]) -> list[Judge]:  # fmt: skip
    """The judges that label shadow pairs, cheapest first (the llm judge last). The feedback
    judge labels the user's own scores, not pairs: see judges/feedback.py."""
    judges: list[Judge] = []
    if settings.reference is not None:
        judges.append(ReferenceJudge(settings.reference))
    if settings.llm is not None:
        llm = settings.llm
        tier = tiers[llm.tier]
        judges.append(LlmJudge(llm, load_prompt(llm.mode, llm.prompt), backends[llm.tier],
                               tier.model, tier.price))  # fmt: skip
    return judges


__all__ = ["JUDGES", "FeedbackJudge", "build_judges"]
