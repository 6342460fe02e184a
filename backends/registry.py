"""Config tiers -> Backend objects (one per tier, built once, shared by every request)."""

from __future__ import annotations

from backends.base import Backend
from router.config import RouterConfig, TierConfig


def build_backend(tier: TierConfig) -> Backend:
    if tier.kind == "openai":
        from backends.openai_http import OpenAIHTTPBackend

        return OpenAIHTTPBackend(tier)
    if tier.kind == "litellm":
        from backends.litellm_backend import LiteLLMBackend

        return LiteLLMBackend(tier)
    if tier.kind == "replay":
        # Imported lazily: only the simulator's replay tiers need it.
        from backends.replay import ReplayBackend

        return ReplayBackend(tier)
    raise ValueError(f"tier {tier.name!r}: unknown kind {tier.kind!r}")


def build_backends(config: RouterConfig) -> dict[str, Backend]:
    return {tier.name: build_backend(tier) for tier in config.tiers}


async def close_backends(backends: dict[str, Backend]) -> None:
    for backend in backends.values():
        await backend.aclose()
