"""What a policy's drift is measured against: the reference score distribution, and the threshold
and target large share in force. One answer for the live gauges (router/observability/
drift_monitor.py) and `cost-router drift report` (router/commands/drift.py), so a policy is judged
against the same reference in both.

The reference is the one the operator named (`monitoring.reference`, `drift report --reference`),
which must load, else the `<model>.scores.json` of the policy's model (its own `model_path`, else
the classifier's; classifiers/model_files.py), used where it exists. Numpy and pydantic only (the
proxy loads it): no scipy; the trace readers load inside `reference_from_traces`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from classifiers.model_files import ModelFiles
from classifiers.score_reference import (
    DEFAULT_BINS,
    ScoreReference,
    ScoreReferenceError,
    bin_counts,
    quantile_from_counts,
)
from policies.config import PolicyConfig


@dataclass(frozen=True)
class ReferenceFile:
    """Where a policy's reference distribution is read from."""

    path: Path
    named: bool  # the operator named it: a missing or broken file is an error

    def load(self) -> ScoreReference | None:
        """The reference; None when it was not named and the model has none. Raises
        ScoreReferenceError (naming the file) for a file that cannot be used."""
        if not self.named and not self.path.exists():
            return None
        return ScoreReference.load(self.path)


def policy_model(policy: PolicyConfig | None, model_path: str | None) -> ModelFiles:
    """The model that scores a policy's requests: its own `model_path`, else the classifier's
    `model_path` (None: the shipped model)."""
    own = policy.model_path if policy is not None else None
    return ModelFiles.of(own or model_path)


def reference_file(
    named: str | Path | None, policy: PolicyConfig | None, model_path: str | None
) -> ReferenceFile:
    """The reference for `policy`: `named` when given, else its model's `<model>.scores.json`
    (`policy_model`)."""
    if named:
        return ReferenceFile(Path(named), named=True)
    return ReferenceFile(policy_model(policy, model_path).scores, named=False)


def configured_target(policy: PolicyConfig | None) -> float | None:
    """The policy's configured `target_large_share`, if it has one."""
    value = (policy.model_extra or {}).get("target_large_share") if policy is not None else None
    return float(value) if isinstance(value, int | float) else None


def threshold_and_target(
    reference: ScoreReference | None, threshold: float | None, target: float | None
) -> tuple[float | None, float | None]:
    """The threshold and target share to judge windows by, the missing one read off the
    reference: the threshold that sent the target share large, or the share the threshold sent."""
    if reference is not None:
        if threshold is None and target is not None:
            threshold = quantile_from_counts(reference.counts, target)
        if target is None and threshold is not None:
            target = reference.share_at_or_above(threshold)
    return threshold, target


def reference_from_traces(source: str, model: str = "") -> ScoreReference:
    """The reference distribution of the scores a JSONL trace folder or Parquet dataset
    recorded, counted batch by batch (a month of traffic never sits in memory). Raises
    DriftInputError for a source that cannot be read, ScoreReferenceError when it has no scores."""
    from simulations.drift_sources import Tiers, iter_source

    counts = np.zeros(DEFAULT_BINS, np.int64)
    # Threshold 0.5 only lets a Parquet dataset without a tier column be read: tiers do not
    # matter to the scores.
    for batch in iter_source(source, Tiers("small", "large", 0.5)):
        counts += bin_counts(batch.score[~np.isnan(batch.score)])
    if not counts.sum():
        raise ScoreReferenceError(f"no scores in {source} to build a reference from")
    return ScoreReference(counts=counts, source=source, model=model)
