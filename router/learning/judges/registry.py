"""`JUDGES`: the one list of judge kinds, and building the configured ones."""

from __future__ import annotations

from collections.abc import Mapping

from backends.base import Backend
from backends.config import TierConfig
from router.learning.config import JudgesConfig
from router.learning.judges.base import Judge
from router.learning.judges.feedback import FeedbackJudge
from router.learning.judges.llm import LlmJudge
from router.learning.judges.prompt import load_prompt
from router.learning.judges.reference import ReferenceJudge

JUDGES = ("llm", "reference", "feedback")


def build_judges(
    settings: JudgesConfig, tiers: Mapping[str, TierConfig], backends: Mapping[str, Backend]
) -> list[Judge]:
    """The judges that label shadow pairs, cheapest first (the llm judge last). The feedback
    judge labels the user's own scores, not pairs: see judges/feedback.py."""
    judges: list[Judge] = []
    if settings.reference is not None:
        judges.append(ReferenceJudge(settings.reference))
    if settings.llm is not None:
        llm = settings.llm
        tier = tiers[llm.tier]
        judges.append(
            LlmJudge(
                llm, load_prompt(llm.mode, llm.prompt), backends[llm.tier], tier.model, tier.price
            )
        )
    return judges


__all__ = ["JUDGES", "FeedbackJudge", "build_judges"]
