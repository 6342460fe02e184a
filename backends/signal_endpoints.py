"""Which tiers' servers are ours to poll, and where: tiers -> `Endpoint`s for the poller."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.config import TierConfig


@dataclass(frozen=True, slots=True)
class Endpoint:
    tier: str
    base_url: str | None  # OpenAI root (…/v1): readiness via GET {base_url}/models
    metrics_url: str | None


def metrics_url_for(base_url: str) -> str:
    """vLLM serves /metrics at the server root, next to /v1."""
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return f"{root}/metrics"


def polled_endpoints(tiers: Sequence[TierConfig]) -> list[Endpoint]:
    """Tiers whose server is ours to poll: those with a `metrics_url`, or a `launch` profile.

    A launched vLLM server serves /metrics next to /v1; a launched llama.cpp server has none, so
    it is polled for readiness only. Other OpenAI-compatible tiers (someone else's API) are not
    polled unless they name a metrics_url.
    """
    out = []
    for tier in tiers:
        if tier.kind != "openai" or not tier.base_url:
            continue
        metrics = tier.metrics_url
        if metrics is None and tier.launch is not None and tier.launch.engine == "vllm":
            metrics = metrics_url_for(tier.base_url)
        if metrics is not None or tier.launch is not None:
            out.append(Endpoint(tier.name, tier.base_url, metrics))
    return out
