"""`threshold`: score >= t goes to the large tier, everything else to the small one."""

from __future__ import annotations

import numpy as np
from pydantic import Field, model_validator

from policies.base import NO_CONTEXT, BatchContext, Decision, RoutingContext, Tunable
from policies.calibration import CalibrateParams, build_calibrating
from policies.load_shed import LoadShedParams, LoadShedPolicy
from policies.spec import Builder, PolicySpec, TwoTierParams, card_threshold


class ThresholdPolicy:
    """Two tiers split by one threshold on the classifier score.

    A threshold above 1 sends everything small; 0 sends everything large.
    """

    def __init__(self, name: str, small: str, large: str, threshold: float) -> None:
        self.name = name
        self.small = small
        self.large = large
        self.threshold = float(threshold)

    def tiers(self) -> list[str]:
        return [self.small, self.large]

    def with_threshold(self, threshold: float) -> ThresholdPolicy:
        return ThresholdPolicy(self.name, self.small, self.large, threshold)

    def decide(self, ctx: RoutingContext) -> Decision:
        if ctx.score >= self.threshold:
            return Decision(self.large, self.name, f"score {ctx.score:.4f} >= {self.threshold:.4f}")
        return Decision(self.small, self.name, f"score {ctx.score:.4f} < {self.threshold:.4f}")

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        # float64 comparison, as decide() compares Python floats: the two always agree.
        return (np.asarray(scores, dtype=np.float64) >= self.threshold).astype(np.int64)


class ThresholdParams(TwoTierParams):
    load_shed: LoadShedParams | None = Field(
        default=None, description="send borderline requests small while the large tier queues"
    )
    calibrate: CalibrateParams | None = Field(
        default=None,
        description="hold target_large_share on live traffic: the threshold follows a streaming "
        "quantile of recent scores, shared by replicas through the budget store "
        "(policies/calibration.py)",
    )

    @model_validator(mode="after")
    def _calibrate_needs_target(self) -> ThresholdParams:
        if self.calibrate is not None and self.target_large_share is None:
            raise ValueError("calibrate needs target_large_share")
        return self

    def calibrates(self) -> bool:
        return self.calibrate is not None and self.calibrate.enabled


def build(b: Builder, p: ThresholdParams) -> Tunable:
    small, large = b.two_tiers(p.small, p.large)
    if p.calibrate is not None and p.calibrate.enabled:
        assert p.target_large_share is not None
        start = p.calibrate.start_threshold
        if start is None:
            start = b.threshold(p) if p.reference_trace else card_threshold(b.env.model_path)
        inner = _shedding(ThresholdPolicy(b.name, small, large, start), p)
        return build_calibrating(inner, p.target_large_share, start, p.calibrate, b.env.model_path)
    return _shedding(ThresholdPolicy(b.name, small, large, b.threshold(p)), p)


def _shedding(policy: ThresholdPolicy, p: ThresholdParams) -> ThresholdPolicy | LoadShedPolicy:
    if p.load_shed is None:
        return policy
    return LoadShedPolicy(policy, p.load_shed.max_waiting, p.load_shed.margin)


SPEC = PolicySpec(ThresholdParams, build)
