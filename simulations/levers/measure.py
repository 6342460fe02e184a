"""One trial request, streamed with the official `openai` client, and what it measured.

Streaming is what makes the latency split visible: time to first token (TTFT: the first chunk
with text), inter-token latency (ITL: first to last text chunk over the tokens after the first,
vLLM's definition, right also when a speculative server sends several tokens per chunk) and
end-to-end time. Tokens are the server's usage when it reports it (`stream_options.
include_usage`; vLLM does); llama.cpp's server does not, and sends one token per chunk, so the
text chunks are counted instead and the prompt's tokens estimated by backends/tokens.py
(`tokens_reported` says which). Cost is the tier's price applied
by the one cost formula (backends/config.py).
"""

from __future__ import annotations

import time

import httpx
import openai

from backends.tokens import count_prompt_tokens
from simulations.levers.prompts import TrialPrompt
from simulations.levers.records import Measurement, TierDownError, TrialTier


def client_for(tier: TrialTier) -> openai.AsyncOpenAI:
    # No client retries: a retried request would hide the failure and inflate the latency.
    return openai.AsyncOpenAI(
        base_url=tier.base_url,
        api_key=tier.api_key or "unused",
        timeout=tier.timeout_s,
        max_retries=0,
    )


async def check_up(client: openai.AsyncOpenAI, tier: TrialTier) -> None:
    """GET /models, the readiness check every OpenAI-compatible server answers."""
    try:
        await client.models.list()
    except openai.APIConnectionError as exc:
        raise TierDownError(tier, f"{type(exc).__name__}: {exc}") from None
    except openai.APIStatusError as exc:
        raise TierDownError(tier, f"GET /models answered {exc.status_code}") from None


def _failed(prompt: TrialPrompt, tier: TrialTier, started: float, error: str) -> Measurement:
    return Measurement(
        prompt.id, tier.name, "", None, None, time.perf_counter() - started, 0, 0, False, 0.0, error
    )


async def measure(
    client: openai.AsyncOpenAI,
    tier: TrialTier,
    prompt: TrialPrompt,
    max_tokens: int,
    temperature: float,
) -> Measurement:
    """One streamed chat completion; a refused request or a timeout is a failed Measurement, an
    unreachable server raises TierDownError."""
    messages = [{"role": "user", "content": prompt.text}]
    started = time.perf_counter()
    first = last = None
    parts: list[str] = []
    chunks = 0
    usage = None
    opened = False  # the server answered: a connection error after this is a cut stream
    try:
        stream = await client.chat.completions.create(
            model=tier.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=temperature,
            stream=True,
            stream_options={"include_usage": True},
        )
        opened = True
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text = choice.delta.content if choice.delta else None
                if text:
                    now = time.perf_counter()
                    first = now if first is None else first
                    last = now
                    parts.append(text)
                    chunks += 1
    except openai.APIConnectionError as exc:
        if isinstance(exc, openai.APITimeoutError):
            return _failed(prompt, tier, started, f"timed out after {tier.timeout_s:g} s")
        if opened:
            return _failed(prompt, tier, started, "cut mid-stream")
        raise TierDownError(tier, f"{type(exc).__name__}: {exc}") from None
    except openai.APIStatusError as exc:
        return _failed(prompt, tier, started, f"answered {exc.status_code}")
    except openai.APIError as exc:  # an error event inside the stream
        return _failed(prompt, tier, started, f"stream error: {exc.message[:200]}")
    except ValueError as exc:  # a chunk that is not JSON (the client's json.loads raises)
        return _failed(prompt, tier, started, f"unreadable stream ({type(exc).__name__})")
    except httpx.TimeoutException:
        return _failed(prompt, tier, started, f"timed out after {tier.timeout_s:g} s")
    except httpx.TransportError as exc:
        # Broken mid-stream where the client does not wrap httpx's error: this request failed;
        # a server that went away fails the next one's connect (TierDownError).
        return _failed(prompt, tier, started, f"cut mid-stream ({type(exc).__name__})")
    e2e = time.perf_counter() - started
    reported = usage is not None and usage.completion_tokens is not None
    completion = int(usage.completion_tokens) if usage is not None and reported else chunks
    prompt_tokens = (
        int(usage.prompt_tokens or 0)
        if usage is not None and reported
        else count_prompt_tokens({"messages": messages})
    )
    itl = (
        (last - first) / (completion - 1)
        if first is not None and last is not None and completion > 1
        else None
    )
    return Measurement(
        prompt_id=prompt.id,
        tier=tier.name,
        text="".join(parts),
        ttft_s=None if first is None else first - started,
        itl_s=itl,
        e2e_s=e2e,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        tokens_reported=reported,
        cost_usd=tier.price.cost(prompt_tokens, completion),
    )
