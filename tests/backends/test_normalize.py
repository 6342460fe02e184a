"""backends/normalize.py: the llama.cpp rewrite exactly, by tier kind, never mutating what the
client sent; the recognition of llama-cpp-python's validation 500 and nothing else. (The same
against the real server: tests/router/proxy/test_llama_normalize.py.)"""

from __future__ import annotations

import copy
from typing import Any

from backends.config import TierConfig
from backends.normalize import invalid_request, normalize_llama_cpp, normalizer
from benchmarks.fault_upstream import LLAMA_VALIDATION_500
from tests.support.proxy import tier


def _tier(launch: dict[str, Any] | None) -> TierConfig:
    extra = {"launch": launch} if launch is not None else {}
    return TierConfig.model_validate(tier("t", "http://127.0.0.1:9/v1", **extra))


def test_only_llama_cpp_tiers_are_normalized() -> None:
    assert normalizer(_tier(None)) is None
    assert normalizer(_tier({"engine": "vllm", "model": "m"})) is None
    assert normalizer(_tier({"engine": "llama_cpp", "model": "m.gguf"})) is normalize_llama_cpp


def test_the_llama_cpp_rewrite() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    body = {
        "model": "m",
        "temperature": None,
        "stop": None,
        "max_completion_tokens": 7,
        "messages": [
            {"role": "developer", "content": "be brief"},
            {
                "role": "system",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
            {"role": "assistant", "tool_calls": [{"id": "d"}]},
            {"role": "tool", "tool_call_id": "c", "content": None},
            {"role": "user", "content": "hi", "name": "ann"},
        ],
    }
    sent = copy.deepcopy(body)
    assert normalize_llama_cpp(body) == {
        "model": "m",
        "max_completion_tokens": 7,
        "max_tokens": 7,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "system", "content": "a\nb"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "d"}]},
            {"role": "tool", "tool_call_id": "c", "content": ""},
            {"role": "user", "content": "hi", "name": "ann"},
        ],
    }
    assert body == sent  # the client's body (the trace's, the shadow's) is untouched
    # The client's own max_tokens wins; a completions prompt passes as it is.
    both = normalize_llama_cpp({"max_tokens": 2, "max_completion_tokens": 9, "prompt": "x"})
    assert both == {"max_tokens": 2, "max_completion_tokens": 9, "prompt": "x"}


def test_the_validation_500_is_recognised_and_nothing_else() -> None:
    assert invalid_request("llama_cpp", 500, LLAMA_VALIDATION_500)
    pydantic_v1 = {"error": {"message": "1 validation error for Request\nbody -> temperature\n  x"}}
    assert invalid_request("llama_cpp", 500, pydantic_v1)
    template = {
        "error": {
            "message": 'can only concatenate str (not "NoneType") to str',
            "type": "internal_server_error",
        }
    }
    assert not invalid_request("llama_cpp", 500, template)  # a failure: the tier falls back
    assert not invalid_request("llama_cpp", 502, LLAMA_VALIDATION_500)
    assert not invalid_request("vllm", 500, LLAMA_VALIDATION_500)
    assert not invalid_request(None, 500, LLAMA_VALIDATION_500)
    not_body = {
        "error": {"message": "2 validation errors:\n  {'type': 'x', 'loc': ('query', 'a')}"}
    }
    assert not invalid_request("llama_cpp", 500, not_body)
    assert not invalid_request("llama_cpp", 500, {"error": "text"})
