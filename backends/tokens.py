"""Token counts for when an upstream reports no usage (e.g. llama.cpp streams).

Uses tiktoken's cl100k_base: an estimate for non-OpenAI models, but a far better one than a word
count, and good enough for charging budgets. tiktoken downloads encodings on first use; litellm
ships the same files, so we point tiktoken at litellm's copy when no cache is configured (the
machine running the proxy may have no internet).
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from trace_format.request_text import upstream_text


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


def _litellm_tokenizer_dir() -> str | None:
    # find_spec of a top-level package only locates it; it does not import litellm.
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return str(path) if path.is_dir() else None


@lru_cache(maxsize=1)
def _encoding() -> _Encoding | None:
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        local = _litellm_tokenizer_dir()
        if local:
            os.environ["TIKTOKEN_CACHE_DIR"] = local
    try:
        import tiktoken  # lazy: only once a count is needed, after TIKTOKEN_CACHE_DIR is set

        return tiktoken.get_encoding("cl100k_base")
    except Exception:  # noqa: BLE001 - no encoding available offline: fall back to a heuristic
        return None


def count_tokens(text: str) -> int:
    if not text:
        return 0
    enc = _encoding()
    if enc is None:
        return max(1, len(text) // 4)
    return len(enc.encode_ordinary(text))


def count_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)  # already token ids
    # Chat templates add a few tokens per message; 4 is OpenAI's documented rule of thumb.
    messages = body.get("messages")
    overhead = 4 * len(messages) if isinstance(messages, list) else 0
    return count_tokens(upstream_text(body)) + overhead
