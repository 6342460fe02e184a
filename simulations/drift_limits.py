"""When `drift report` flags a window: the limits and the false-alarm budget
(simulations/drift_stats.py's module docstring and docs/monitoring.md, "Sound detection").
Pydantic only, so the router config can hold them (`monitoring.drift`) without loading scipy."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DriftLimits(BaseModel):
    """When a window is flagged (docs/monitoring.md, "Sound detection")."""

    model_config = ConfigDict(extra="forbid")

    false_alarms_per_30_days: float = Field(
        default=1.0,
        gt=0,
        description="false-alarm budget on stationary traffic, spent uniformly over windows "
        "(windowed tests) and over requests at requests_per_hour (the share CUSUM)",
    )
    requests_per_hour: float = Field(
        default=1000.0,
        gt=0,
        description="traffic the share CUSUM's limit is planned for (more traffic: "
        "proportionally more false alarms per day)",
    )
    psi_limit: float = Field(
        default=0.2,
        gt=0,
        description="score drift needs PSI (20 bins) >= this as well as a significant KS test",
    )
    share_delta: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="large-share shift the CUSUM is tuned to detect (absolute, e.g. 5 points)",
    )
    quality_limit: float = Field(
        default=0.9,
        gt=0,
        description="quality retained (routed / all-large) the quality CUSUM holds in control; "
        "it flags evidence of a drop below it",
    )
    quality_delta: float = Field(
        default=0.05,
        gt=0,
        description="drop of quality retained below quality_limit the quality CUSUM is tuned to "
        "detect",
    )
    min_labels: int = Field(
        default=30,
        ge=2,
        description="labelled requests a window needs to count in the quality test",
    )
    retrain_psi: float = Field(
        default=0.4,
        gt=0,
        description="PSI on the latest window at or above which retraining is advised (inputs "
        "far from what the model was fitted on)",
    )
