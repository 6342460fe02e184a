"""The `monitoring:` section: the live drift gauges' window and limits (pydantic only, so the
router config can hold it without loading numpy or the drift statistics)."""

from __future__ import annotations

from pydantic import Field

from simulations.drift_limits import DriftLimits
from trace_format.config_base import StrictModel


class MonitoringConfig(StrictModel):
    """Live drift signals of the proxy (router/observability/drift_monitor.py; docs/monitoring.md,
    "Live signals and calibration"): per-policy gauges over a rolling window of requests."""

    enabled: bool = Field(default=True, description="compute the live drift gauges")
    window_requests: int = Field(
        default=1000,
        ge=10,
        description="the rolling window: this many most recent scored requests per policy (with "
        "window_s: at most this many)",
    )
    window_s: float | None = Field(
        default=None,
        gt=0,
        description="the rolling window in seconds instead (requests older than this drop out); "
        "window_requests still caps its memory",
    )
    reference: str | None = Field(
        default=None,
        description="reference score distribution (classifiers/score_reference.py format) the "
        "PSI and KS gauges compare with; None: `<model>.scores.json` beside each policy's "
        "classifier model, when it exists",
    )
    drift: DriftLimits = Field(
        default_factory=DriftLimits,
        description="limits and false-alarm budget of `cost-router drift report` "
        '(docs/monitoring.md, "Sound detection")',
    )
