"""Backend kinds: the one list of them. A tier's `kind` must name one; adding a kind is a new module
plus one line in `BACKENDS`, and the config accepts it from then on.

An entry names its class by module and name, with the tier keys the kind cannot do without: the
config (and so every command, `config check` and `--help` included) validates kinds without
importing httpx, aiohttp and every backend; a class is imported when a tier of its kind is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass

from backends.base import Backend, BackendClass
from backends.config import TierConfig


@dataclass(frozen=True, slots=True)
class BackendKind:
    module: str  # e.g. "backends.openai_http"
    cls: str  # the class in it: takes the TierConfig
    required_keys: tuple[str, ...] = ()  # TierConfig keys this kind needs set
    # (key, other): a required key that `other` may stand in for (base_url or deployments)
    alternatives: tuple[tuple[str, str], ...] = ()
    # Client APIs it can pass through as they are (`TierConfig.apis`); chat completions always.
    native_apis: tuple[str, ...] = ("chat",)

    def load(self) -> BackendClass:
        backend_class: BackendClass = getattr(importlib.import_module(self.module), self.cls)
        return backend_class


BACKENDS: dict[str, BackendKind] = {
    "openai": BackendKind(
        "backends.openai_http",
        "OpenAIHTTPBackend",
        ("base_url",),
        alternatives=(("base_url", "deployments"),),
        native_apis=("chat", "messages", "responses"),
    ),
    "litellm": BackendKind("backends.litellm_backend", "LiteLLMBackend"),
    "replay": BackendKind("backends.recorded", "RecordedBackend", ("replay_trace",)),
}


def tier_problems(tier: TierConfig) -> list[tuple[str, str]]:
    """(key, message) for each way `tier` does not fit its kind; [] when it does."""
    kind = BACKENDS.get(tier.kind)
    if kind is None:
        return [("kind", f"unknown backend kind {tier.kind!r} (known: {sorted(BACKENDS)})")]
    others = dict(kind.alternatives)
    problems = []
    for key in kind.required_keys:
        other = others.get(key)
        if not getattr(tier, key) and not (other and getattr(tier, other)):
            either = f" (or {other})" if other else ""
            problems.append((key, f"{key}{either} is required for kind {tier.kind!r}"))
    cannot = [api for api in tier.apis if api not in kind.native_apis]
    if cannot:
        problems.append(
            ("apis", f"kind {tier.kind!r} cannot pass {cannot} through (it speaks chat only)")
        )
    if tier.deployments and "deployments" not in others.values():
        problems.append(("deployments", f"kind {tier.kind!r} takes one server, not deployments"))
    return problems


def build_backend(tier: TierConfig) -> Backend:
    return BACKENDS[tier.kind].load()(tier)


def build_backends(tiers: Iterable[TierConfig]) -> dict[str, Backend]:
    """One backend per tier, built once and shared by every request."""
    return {tier.name: build_backend(tier) for tier in tiers}


async def close_backends(backends: dict[str, Backend]) -> None:
    for backend in backends.values():
        await backend.aclose()
