"""A tier's launch profile (`launch:`) and the rules for what a profile may combine.

The rules encode the combinations vLLM documents as impossible (speculative-config reference,
"Known Feature Incompatibility") and the options llama-cpp-python's server does not have, so a bad
profile fails at `config check` time with the key named, not minutes later on a GPU node.
`backends/launch.py` turns a valid profile into a command line.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Methods whose drafts come from a second set of weights (`model` in vLLM's speculative config).
MODEL_METHODS = frozenset({"eagle", "eagle3", "draft_model"})
# Draft-free methods that match n-grams of the prompt; `prompt_lookup` is our alias of `ngram`.
NGRAM_METHODS = frozenset({"ngram", "prompt_lookup"})

# Flags the profile sets itself; passing them again through extra_args would bypass validation.
VLLM_MANAGED_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--quantization",
        "-q",
        "--dtype",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--speculative-config",
        "--served-model-name",
    }
)
LLAMA_CPP_MANAGED_FLAGS = frozenset(
    {
        "--model",
        "--model_alias",
        "--host",
        "--port",
        "--n_ctx",
        "--n_threads",
        "--draft_model",
        "--draft_model_num_pred_tokens",
    }
)
LLAMA_CPP_PROMPT_LOOKUP = "prompt-lookup-decoding"
PACKAGE_PREFIX = "package:"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Problem = tuple[str, str]  # (key under `launch.`, message)


class SpeculativeConfig(BaseModel):
    """Speculative decoding of a tier's server (vLLM --speculative-config, llama.cpp lookup).

    `prompt_lookup` is accepted as another name for vLLM's `ngram` (both draft by matching n-grams
    of the prompt). Impossible combinations are rejected by `launch_problems` below.
    """

    model_config = ConfigDict(extra="forbid")

    method: Literal["ngram", "eagle", "eagle3", "draft_model", "prompt_lookup"] = "ngram"
    num_speculative_tokens: int = Field(default=5, ge=1, le=64)
    draft_model: str | None = Field(default=None, description="draft model / EAGLE head (vLLM)")
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    quantization: Literal["awq", "gptq", "fp8"] | None = Field(
        default=None, description="quantization of the draft model's weights (vLLM)"
    )


class LaunchConfig(BaseModel):
    """How to start a tier's server (used by `cost-router backends plan|launch`)."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["vllm", "llama_cpp"] = "vllm"
    model: str = Field(
        description="HF id or path (vLLM); GGUF path or 'package:PKG/FILE.gguf' (llama.cpp)"
    )
    port: int = Field(default=8000, ge=1, le=65535)
    host: str = "127.0.0.1"
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    quantization: Literal["awq", "gptq", "fp8"] | None = None
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    speculative: SpeculativeConfig | None = None
    n_threads: int | None = Field(default=None, ge=1)
    n_ctx: int | None = Field(default=None, ge=1)
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(
        default_factory=dict, description="server environment, e.g. CUDA_VISIBLE_DEVICES"
    )
    ready_timeout_s: float = Field(default=600.0, gt=0, description="launch waits this long")

    @model_validator(mode="after")
    def _possible(self) -> LaunchConfig:
        problems = launch_problems(self)
        if problems:
            raise ValueError("; ".join(f"{key}: {msg}" for key, msg in problems))
        return self


# --- validation ------------------------------------------------------------------------------


def launch_problems(launch: LaunchConfig) -> list[Problem]:
    """Every impossible combination in one profile, as (key, message) pairs."""
    problems = _extra_args_problems(launch)
    problems += [
        (f"env.{name}", "is not a valid environment variable name")
        for name in launch.env
        if not ENV_NAME.fullmatch(name)
    ]
    if launch.engine == "vllm":
        return problems + _vllm_problems(launch)
    return problems + _llama_cpp_problems(launch)


def _extra_args_problems(launch: LaunchConfig) -> list[Problem]:
    managed = VLLM_MANAGED_FLAGS if launch.engine == "vllm" else LLAMA_CPP_MANAGED_FLAGS
    problems: list[Problem] = []
    for arg in launch.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in managed:
            problems.append(("extra_args", f"{flag!r} is set by the profile's own keys; use those"))
    return problems


def _vllm_problems(launch: LaunchConfig) -> list[Problem]:
    problems: list[Problem] = []
    for key in ("n_threads", "n_ctx"):
        if getattr(launch, key) is not None:
            problems.append((key, "is a llama.cpp option; vLLM uses max_model_len"))
    spec = launch.speculative
    if spec is None:
        return problems
    if launch.pipeline_parallel_size > 1:
        problems.append(
            (
                "pipeline_parallel_size",
                "vLLM documents speculative decoding as not composable with pipeline parallelism",
            )
        )
    return problems + _vllm_spec_problems(spec, launch.tensor_parallel_size)


def _vllm_spec_problems(spec: SpeculativeConfig, tensor_parallel_size: int) -> list[Problem]:
    problems: list[Problem] = []
    if spec.method in MODEL_METHODS:
        if not spec.draft_model:
            problems.append(("speculative.draft_model", f"method {spec.method!r} needs a model"))
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(spec, key) is not None:
                problems.append((f"speculative.{key}", "applies only to method 'ngram'"))
        dtp = spec.draft_tensor_parallel_size
        if dtp is not None and dtp not in (1, tensor_parallel_size):
            problems.append(
                (
                    "speculative.draft_tensor_parallel_size",
                    f"must be 1 or the target's tensor_parallel_size ({tensor_parallel_size})",
                )
            )
        return problems
    # n-gram: no weights to load, so the model-only keys are meaningless.
    for key in ("draft_model", "draft_tensor_parallel_size", "quantization"):
        if getattr(spec, key) is not None:
            problems.append((f"speculative.{key}", f"does not apply to method {spec.method!r}"))
    if spec.prompt_lookup_max is None:
        problems.append(("speculative.prompt_lookup_max", "is required for method 'ngram'"))
    elif spec.prompt_lookup_min is not None and spec.prompt_lookup_min > spec.prompt_lookup_max:
        problems.append(
            ("speculative.prompt_lookup_min", "must not exceed speculative.prompt_lookup_max")
        )
    return problems


def _llama_cpp_problems(launch: LaunchConfig) -> list[Problem]:
    problems: list[Problem] = []
    if launch.tensor_parallel_size != 1:
        problems.append(("tensor_parallel_size", "llama.cpp server runs one process; must be 1"))
    if launch.pipeline_parallel_size != 1:
        problems.append(("pipeline_parallel_size", "llama.cpp server runs one process; must be 1"))
    if launch.quantization is not None:
        problems.append(("quantization", "a GGUF file is already quantized; pick the GGUF instead"))
    for key in ("dtype", "gpu_memory_utilization"):
        if getattr(launch, key) is not None:
            problems.append((key, "is a vLLM option, not a llama.cpp server one"))
    if launch.max_model_len is not None:
        problems.append(("max_model_len", "is a vLLM option; llama.cpp uses n_ctx"))
    spec = launch.speculative
    if spec is None:
        return problems
    if spec.method not in NGRAM_METHODS:
        problems.append(
            ("speculative.method", "llama-cpp-python's server drafts only by prompt lookup")
        )
    for key in (
        "draft_model",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "draft_tensor_parallel_size",
        "quantization",
    ):
        if getattr(spec, key) is not None:
            problems.append(
                (
                    f"speculative.{key}",
                    "not a llama-cpp-python server option (it takes num_speculative_tokens only)",
                )
            )
    return problems
