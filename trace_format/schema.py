"""The trace record: one JSON object per line.

Written by the proxy, read by training and by the simulator.

Versioned: ``schema_version`` is bumped on any incompatible change; readers accept every version
they know and reject newer ones with a clear error. See docs/traces.md for the field reference.

Version 1 fields (all optional except ``schema_version``, ``id`` and ``time`` unless noted):

- identity: ``id`` (request id), ``time`` (UNIX seconds, float), ``team``, ``key_id``, ``user``
- decision: ``policy``, ``experiment``, ``arm``, ``ab_unit`` / ``ab_unit_id`` (the unit that
  assigned the arm and its id, hashed for ``user`` and ``header``), ``score`` (classifier, 0..1),
  ``tier`` (chosen),
  ``model`` (that answered), ``requested_model``, ``reason``, ``downgraded``,
  ``fallback_from`` (tier that failed first, if any), ``tiers_tried``
- usage: ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``cache_write_tokens``,
  ``reasoning_tokens``, ``cost_usd``, ``latency_ms``, ``ttft_ms``
- outcome: ``status`` (HTTP status returned to the client), ``error`` (error code), ``stream``
- content (only when configured): ``prompt`` (the text the classifier scored), ``messages``
- evaluation (offline traces, replay): ``outcomes`` = {tier or model name: quality in [0, 1]},
  ``feedback`` (mean user feedback score, filled by /v1/feedback), ``source`` (benchmark or
  dataset the request came from; evaluation reports quality per source)
- live backend signals: ``backend_signals`` = {tier: {metric: value}}
- ``deployment``: which of the answering tier's deployments served it (tiers that list several)
- conversation: ``session`` (its id: the client's, or ``auto-...`` derived), ``turn`` (user
  messages in the request), ``session_reason`` (why the session's rules kept or moved the tier),
  ``session_prompt_tokens`` / ``session_prefix_tokens`` (the router's estimate of the prompt and
  of its part up to the last answer: what ``cache_aware`` prices)
- ``endpoint``: the API path under /v1 that was called (``chat/completions``, ``completions``,
  ``embeddings``, ``messages``, ``responses``); records without it are from before it was
  written (chat or completions)
- ``upstream_endpoint`` (``messages`` and ``responses`` only): what the tier that answered was
  sent: ``chat/completions`` (translated) or the client's own API (passed through, ``apis:``)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})


class TraceRecord(BaseModel):
    # Readers ignore unknown fields so newer minor additions don't break old simulators.
    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    id: str
    time: float
    team: str | None = None
    key_id: str | None = None
    user: str | None = None
    policy: str | None = None
    experiment: str | None = None
    arm: str | None = None
    # The unit the arm was assigned by (team, key, user, header, session) and its id: the value,
    # or "h:" and 16 hex digits of a salted sha256 for user and header. None: no experiment, or
    # written before they were recorded.
    ab_unit: str | None = None
    ab_unit_id: str | None = None
    score: float | None = Field(default=None, ge=0, le=1)
    tier: str | None = None
    model: str | None = None
    requested_model: str | None = None
    reason: str | None = None
    downgraded: bool = False
    fallback_from: str | None = None
    tiers_tried: list[str] = Field(default_factory=list)
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    # Parts of prompt_tokens the provider read from / wrote to its prompt cache (priced at the
    # tier's cached / cache-write price; the rest of the prompt fresh), and of completion_tokens
    # spent reasoning (priced as output). None: written before they were recorded.
    cached_tokens: int | None = Field(default=None, ge=0)
    cache_write_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    # True when the token counts are the router's own (the upstream reported none, or usage the
    # router could not use); absent when they are the upstream's.
    usage_estimated: bool | None = None
    endpoint: str | None = None
    upstream_endpoint: str | None = None
    latency_ms: float | None = Field(default=None, ge=0)
    ttft_ms: float | None = Field(default=None, ge=0)
    status: int | None = None
    error: str | None = None
    stream: bool = False
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    outcomes: dict[str, float] | None = None
    source: str | None = None
    feedback: float | None = None
    backend_signals: dict[str, dict[str, float]] | None = None
    deployment: str | None = None
    session: str | None = None
    turn: int | None = Field(default=None, ge=0)
    session_reason: str | None = None
    # The router's estimate (4 characters a token) of the prompt and of its prefix up to the last
    # assistant message: what cache_aware prices; the simulator prices every mode with them.
    session_prompt_tokens: int | None = Field(default=None, ge=0)
    session_prefix_tokens: int | None = Field(default=None, ge=0)
