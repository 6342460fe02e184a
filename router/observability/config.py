"""The `monitoring:` section: who may read `/metrics` and what it names, and the live drift
gauges' window and limits (pydantic only, so the router config can hold it without loading numpy
or the drift statistics)."""

from __future__ import annotations

from pydantic import Field, field_validator

from simulations.drift_limits import DriftLimits
from trace_format.config_base import StrictModel

# An environment variable's name, as a shell would accept it.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def listen_address(value: str) -> tuple[str, int]:
    """`host:port` (`[::1]:9464` for IPv6) -> (host, port); ValueError saying what is wrong."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:9464, port 0-65535)")
    return host, int(port)


class MonitoringConfig(StrictModel):
    """What operators watch: access to `/metrics` and its team labels (docs/monitoring.md,
    "Who can read /metrics"), and the live drift signals of the proxy
    (router/observability/drift_monitor.py; docs/monitoring.md, "Live signals and calibration"):
    per-policy gauges over a rolling window of requests."""

    metrics_token_env: str | None = Field(
        default=None,
        pattern=ENV_NAME,
        description="env var holding the bearer token /metrics then requires (Prometheus: "
        "`authorization: {credentials_file: ...}`); unset or empty: `serve` refuses to start "
        "(and a scrape is refused, 401, never let through)",
    )
    metrics_listen: str | None = Field(
        default=None,
        description="host:port of a second listener of the same process that serves /metrics "
        "(and nothing else); the API port then answers 404 there. None: /metrics is on the API "
        "port, and needs metrics_token_env when auth.required is set",
    )
    team_labels: bool = Field(
        default=True,
        description="false: /metrics names no team (nor key id): series that differed only by "
        "team are summed into one",
    )

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

    @field_validator("metrics_listen")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            listen_address(value)
        return value

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        return None if self.metrics_listen is None else listen_address(self.metrics_listen)
