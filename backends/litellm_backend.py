"""Backend for hosted providers (OpenAI, Anthropic, Bedrock, ...) through ``litellm``.

litellm fetches its price map from the internet at import unless told otherwise; the env var is
set before the (lazy) import so the proxy starts offline. The tier's ``model`` is a litellm model
string (``anthropic/claude-...``, ``bedrock/...``, ``openai/<name>`` with ``base_url``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from functools import lru_cache
from typing import Any

import httpx
import orjson

from backends.base import UpstreamClientError, UpstreamError, UpstreamResponse
from backends.config import TierConfig
from backends.openai_http import CREDENTIAL_STATUSES, answer_usage

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Statuses that say "this tier cannot serve now", so another tier may: fall back on them. The
# credential ones are the provider refusing the router's key, never the client's fault.
FALLBACK_STATUSES = frozenset({408, 429}) | CREDENTIAL_STATUSES


# litellm's loggers: each gets its own stderr handler and also propagates to the root, so every
# INFO line of every request printed twice. Only warnings pass, once, in the proxy's log format.
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


@lru_cache(maxsize=1)
def _litellm() -> Any:
    import litellm  # lazy: a second or more to import, and only litellm tiers need it

    if "LITELLM_LOG" not in os.environ:  # someone asked for litellm's own logging: keep it
        for name in LITELLM_LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(logging.WARNING)
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
        litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner per error
    return litellm


def _as_dict(obj: Any) -> dict[str, Any]:
    return obj.model_dump(exclude_none=True) if hasattr(obj, "model_dump") else dict(obj)


class LiteLLMBackend:
    def __init__(self, tier: TierConfig) -> None:
        self.tier = tier.name
        self.model = tier.model
        self.base_url = tier.base_url
        self.api_key = os.environ.get(tier.api_key_env) if tier.api_key_env else None
        self.timeout_s = tier.timeout_s

    def _kwargs(self, body: dict[str, Any]) -> dict[str, Any]:
        kwargs = {k: v for k, v in body.items() if k != "model"}
        kwargs.update(model=self.model, timeout=self.timeout_s)
        if self.base_url:
            kwargs["api_base"] = self.base_url
        if self.api_key:
            kwargs["api_key"] = self.api_key
        return kwargs

    def _translate(self, exc: Exception) -> Exception:
        status = getattr(exc, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500 and status not in FALLBACK_STATUSES:
            # Kept for the log; the client gets the status and a generic message.
            message = str(getattr(exc, "message", exc))
            return UpstreamClientError(
                status, {"error": {"message": message, "type": "upstream_error"}}
            )
        # The provider's text can name hosts and accounts: the log's, never the client's.
        return UpstreamError(
            self.tier, f"{type(exc).__name__}: {exc}", status if isinstance(status, int) else None
        )

    async def _call(self, endpoint: str, body: dict[str, Any]) -> Any:
        litellm = _litellm()
        fn = litellm.acompletion if endpoint == "chat/completions" else litellm.atext_completion
        try:
            return await fn(**self._kwargs(body))
        except Exception as exc:  # noqa: BLE001 - litellm raises its own hierarchy; map by status
            raise self._translate(exc) from exc

    async def complete(self, endpoint: str, body: dict[str, Any]) -> UpstreamResponse:
        answer = _as_dict(await self._call(endpoint, body))
        return UpstreamResponse(answer, answer_usage(body, answer))

    async def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        chunks = await self._call(endpoint, body)
        try:
            async for chunk in chunks:
                yield b"data: " + orjson.dumps(_as_dict(chunk)) + b"\n\n"
        except Exception as exc:  # noqa: BLE001 - mid-stream provider failure
            raise self._translate(exc) from exc
        yield b"data: [DONE]\n\n"

    async def ready(self) -> tuple[bool, str]:
        if not self.base_url:
            return True, "hosted provider (not probed: a probe would be billed)"
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                resp = await client.get(f"{self.base_url.rstrip('/')}/models")
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return resp.status_code == 200, f"GET /models answered {resp.status_code}"

    async def aclose(self) -> None:
        return None
