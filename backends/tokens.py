"""Token counts for when an upstream reports no usage (e.g. llama.cpp streams).

Uses tiktoken's cl100k_base: an estimate for non-OpenAI models, but a far better one than a word
count, and good enough for charging budgets. tiktoken downloads encodings on first use; litellm
ships the same files, so we point tiktoken at litellm's copy when no cache is configured (the
machine running the proxy may have no internet).
"""

from __future__ import annotations

import importlib.util
import os
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from backends.launch import LaunchError, resolve_model_path
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


# --- a tier's own tokenizer and chat template ------------------------------------------------
#
# The count an upstream charges for is its own tokenizer's, over the prompt its chat template
# renders (role markers, a default system prompt). Where the router knows both, it can count the
# same thing instead of bounding it: a llama.cpp tier launched from a GGUF file carries both in
# the file. llama-cpp-python's server renders the GGUF's template with Jinja2ChatFormatter and
# tokenizes the result with special tokens and no added BOS (`added_special`), and reports that
# length as `usage.prompt_tokens`; `TemplateCounter` does the same steps with the same library.

# Message keys the template renders; any other key (tool_calls, name, ...) or a content that is
# not a string may be rendered differently by the server, so it is not counted here.
_PLAIN_KEYS = frozenset({"role", "content"})
# Request fields that reach the template beside the messages: counted elsewhere (bytes).
_TEMPLATE_EXTRAS = ("tools", "functions", "tool_choice", "function_call")


# Counting costs ~12 us per token here (llama.cpp's tokenizer; tiktoken ~2 us): a request's
# worst case is computed once per tier it may go to, so the last prompts' counts are kept.
_MEMO_SIZE = 256

_Count = Callable[[bytes, bool, bool], int]


class TemplateCounter:
    """Prompt tokens as a llama.cpp tier counts them: its tokenizer over its chat template."""

    def __init__(self, count: _Count, formatter: Any, source: str) -> None:
        self._count = count  # (utf-8 text, add_bos, special) -> number of tokens
        self._formatter = formatter  # llama-cpp-python's Jinja2ChatFormatter of the template
        self._memo: OrderedDict[tuple[str, bool, bool], int] = OrderedDict()
        self.source = source  # the GGUF file, for messages and the benchmark

    def _tokens(self, text: str, add_bos: bool, special: bool) -> int:
        key = (text, add_bos, special)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        n = self._count(text.encode("utf-8"), add_bos, special)
        self._memo[key] = n
        if len(self._memo) > _MEMO_SIZE:
            self._memo.popitem(last=False)
        return n

    def text_tokens(self, text: str) -> int:
        """A completions `prompt`: the server tokenizes it as sent, with its BOS."""
        return self._tokens(text, True, False)

    def chat_tokens(self, body: dict[str, Any]) -> int | None:
        """The rendered chat prompt's token count; None when the body has anything the template
        might render otherwise than we would (tools, non-text content, extra message keys)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        if any(body.get(k) is not None for k in _TEMPLATE_EXTRAS):
            return None
        for m in messages:
            if not isinstance(m, dict) or not _PLAIN_KEYS.issuperset(m):
                return None
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                return None
        try:
            prompt = self._formatter(messages=messages).prompt
        except Exception:  # noqa: BLE001 - a template that raises (e.g. on role order): not ours
            return None
        return self._tokens(prompt, False, True)  # the server's `added_special` tokenization

    def prompt_tokens(self, body: dict[str, Any]) -> int | None:
        """What the tier will report as prompt tokens for `body`, or None when unknown."""
        if "messages" in body:
            return self.chat_tokens(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str) and body.get("suffix") is None:
            return self.text_tokens(prompt)
        return None


@lru_cache(maxsize=16)
def gguf_counter(path: str) -> TemplateCounter | None:
    """The counter of a GGUF file (its vocabulary only: no weights are loaded, ~0.2 s once per
    file); None when llama-cpp-python is not installed, the file does not load, or it has no
    chat template the server would use as is (llama-cpp-python swaps a few known templates for
    its own formats: those are not counted here)."""
    try:
        # Optional heavy library (the `demo` extra), loaded only for a llama.cpp tier's file.
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import (
            Jinja2ChatFormatter,
            guess_chat_format_from_gguf_metadata,
        )

        llama = Llama(model_path=path, vocab_only=True, verbose=False)
    except Exception:  # noqa: BLE001 - no library or no readable file: the caller falls back
        return None
    template = llama.metadata.get("tokenizer.chat_template")
    if not template or guess_chat_format_from_gguf_metadata(llama.metadata) is not None:
        return None
    model = llama._model  # the token texts, as the server's own formatter is built
    eos, bos = llama.token_eos(), llama.token_bos()
    formatter = Jinja2ChatFormatter(
        template=template,
        eos_token=model.token_get_text(eos) if eos != -1 else "",
        bos_token=model.token_get_text(bos) if bos != -1 else "",
    )
    return TemplateCounter(_LlamaCount(llama, llama_cpp), formatter, path)


class _LlamaCount:
    """llama.cpp's token count of a text, without building the token list. Holds the vocab-only
    model: the vocabulary llama.cpp reads belongs to it."""

    def __init__(self, llama: Any, llama_cpp: Any) -> None:
        self._llama = llama
        self._tokenize = llama_cpp.llama_tokenize
        self._vocab = llama._model.vocab
        self._none = (llama_cpp.llama_token * 1)()

    def __call__(self, text: bytes, add_bos: bool, special: bool) -> int:
        # Room for no token: llama.cpp then answers minus the count, without writing tokens.
        n = self._tokenize(self._vocab, text, len(text), self._none, 0, add_bos, special)
        return abs(n)


# Server flags that make llama-cpp-python render chats otherwise than with the GGUF's template.
_OWN_FORMAT_FLAGS = ("--chat_format", "--chat-format", "--hf_pretrained_model_name_or_path")


@lru_cache(maxsize=64)
def tier_counter(
    launch_engine: str | None, launch_model: str | None, extra_args: tuple[str, ...] = ()
) -> TemplateCounter | None:
    """The counter of a tier launched by llama.cpp from a GGUF (path or `package:PKG/FILE`) with
    the GGUF's own chat template (`extra_args`: the launch profile's; a chat format of its own
    is not counted); None for any other tier: its tokenizer is not known to the router."""
    if launch_engine != "llama_cpp" or not launch_model:
        return None
    if any(a.split("=", 1)[0] in _OWN_FORMAT_FLAGS for a in extra_args):
        return None
    try:
        path = resolve_model_path(launch_model)
    except LaunchError:
        return None
    return gguf_counter(path)
