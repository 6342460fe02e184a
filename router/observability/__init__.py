"""What the proxy tells its operators: Prometheus metrics (`metrics.py`), OpenTelemetry spans
(`telemetry_config.py`, and `telemetry.py` only when tracing is on), the trace files written
(`trace_sink.py`, `trace_ids.py`), the live drift gauges (`drift_monitor.py`, configured by
`config.py`) and the shipped alert rules and dashboard (`monitoring/`). It reads the request
path's results; it never decides anything."""
