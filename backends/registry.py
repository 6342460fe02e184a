"""Backend kinds: the one list of them. A tier's `kind` must name one; adding a kind is a new module
plus one line in `BACKENDS`, and the config accepts it from then on."""

from __future__ import annotations

from collections.abc import Iterable

from backends.base import Backend, BackendClass
from backends.config import TierConfig
from backends.litellm_backend import LiteLLMBackend
from backends.openai_http import OpenAIHTTPBackend
from backends.recorded import RecordedBackend

BACKENDS: dict[str, BackendClass] = {
    "openai": OpenAIHTTPBackend,
    "litellm": LiteLLMBackend,
    "replay": RecordedBackend,
}


def tier_problems(tier: TierConfig) -> list[tuple[str, str]]:
    """(key, message) for each way `tier` does not fit its kind; [] when it does."""
    cls = BACKENDS.get(tier.kind)
    if cls is None:
        return [("kind", f"unknown backend kind {tier.kind!r} (known: {sorted(BACKENDS)})")]
    return [(key, f"{key} is required for kind {tier.kind!r}")
            for key in cls.required_keys if not getattr(tier, key)]


def build_backend(tier: TierConfig) -> Backend:
    return BACKENDS[tier.kind](tier)


def build_backends(tiers: Iterable[TierConfig]) -> dict[str, Backend]:
    """One backend per tier, built once and shared by every request."""
    return {tier.name: build_backend(tier) for tier in tiers}


async def close_backends(backends: dict[str, Backend]) -> None:
    for backend in backends.values():
        await backend.aclose()
