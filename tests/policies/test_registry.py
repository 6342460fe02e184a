"""Config -> policies: params validation naming the key, defaults, target-share conversion,
and which policy or experiment arm serves a request."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml
from typer.testing import CliRunner

from policies.base import Policy, RoutingContext
from policies.budget_pacing import BudgetPacingPolicy
from policies.fixed import FixedPolicy
from policies.keys import key_id_of
from policies.registry import SPECS, build_policies
from policies.selection import UnknownPolicyError
from policies.target_share import (
    ReferenceTraceError,
    achieved_share,
    load_reference_scores,
    threshold_for_share,
)
from policies.threshold import ThresholdPolicy
from policies.tiers import TiersPolicy
from router.cli import app
from router.config import RouterConfig, config_from_dict
from router.proxy.build import build_selector
from trace_format.config_base import ConfigError

TIERS = [
    {
        "name": "large",
        "base_url": "http://l",
        "model": "big-model",
        "price": {"input_per_mtok": 10, "output_per_mtok": 30},
    },
    {
        "name": "small",
        "base_url": "http://s",
        "model": "tiny-model",
        "price": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
    },
    {
        "name": "medium",
        "base_url": "http://m",
        "model": "mid-model",
        "price": {"input_per_mtok": 2, "output_per_mtok": 6},
    },
]


def _config(**kw: Any) -> RouterConfig:
    return config_from_dict({"tiers": TIERS, **kw})


def _built(config: RouterConfig) -> dict[str, Policy]:
    return build_policies(config.policies, config.policy_env())


def test_default_policy_is_threshold_between_cheapest_and_priciest() -> None:
    pols = _built(_config(default_policy="house"))
    assert list(pols) == ["house"]
    p = pols["house"]
    assert isinstance(p, ThresholdPolicy) and p.tiers() == ["small", "large"]


def test_default_threshold_comes_from_classifier_card(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text('{"default_threshold": 0.23}')
    config = _config(classifier={"model_path": str(tmp_path / "m.onnx")})
    assert _built(config)["balanced"].threshold == 0.23
    config = _config(
        classifier={"model_path": str(tmp_path / "m.onnx")},
        policies={"balanced": {"type": "threshold"}},
    )
    assert _built(config)["balanced"].threshold == 0.23
    (tmp_path / "m.json").write_text('{"default_threshold": "high"}')
    assert (
        _built(_config(classifier={"model_path": str(tmp_path / "m.onnx")}))["balanced"].threshold
        == 0.5
    )


def test_single_tier_default_is_fixed() -> None:
    pols = _built(config_from_dict({"tiers": TIERS[:1]}))
    assert isinstance(pols["balanced"], FixedPolicy)


@pytest.mark.parametrize(
    ("policy", "key"),
    [
        ({"type": "threshold", "threshold": 1.5}, "policies.balanced.threshold"),
        ({"type": "threshold", "treshold": 0.5}, "policies.balanced.treshold"),
        ({"type": "threshold", "target_large_share": 0.3}, "policies.balanced"),
        ({"type": "random"}, "policies.balanced.p"),
        ({"type": "tiers", "thresholds": [0.7, 0.2]}, "policies.balanced"),
        ({"type": "budget_pacing", "slack": 0}, "policies.balanced.slack"),
        ({"type": "threshold", "small": "nope"}, "policies.balanced.small"),
    ],
)
def test_bad_params_name_the_key(policy: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _config(policies={"balanced": policy})


def test_unknown_type_names_the_key_and_the_registered_types(tmp_path: Path) -> None:
    """PolicyConfig.type accepts what policies/registry.py SPECS lists, and nothing else."""
    message = f"policies.balanced.type: unknown policy type 'nope' (known: {sorted(SPECS)})"
    with pytest.raises(ConfigError, match=re.escape(message)):
        _config(policies={"balanced": {"type": "nope"}})
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({"tiers": TIERS, "policies": {"balanced": {"type": "nope"}}}))
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    assert result.exit_code != 0 and message in result.output


def test_build_time_errors_name_the_key(tmp_path: Path) -> None:
    bad_order = _config(
        policies={"balanced": {"type": "tiers", "tiers": ["large", "small"], "thresholds": [0.5]}}
    )
    with pytest.raises(ConfigError, match=r"policies\.balanced\.tiers: must be ordered cheapest"):
        _built(bad_order)
    swapped = _config(
        policies={"balanced": {"type": "threshold", "small": "large", "large": "small"}}
    )
    with pytest.raises(ConfigError, match=r"policies\.balanced\.small"):
        _built(swapped)
    missing = _config(
        policies={
            "balanced": {
                "type": "threshold",
                "target_large_share": 0.2,
                "reference_trace": str(tmp_path / "none.jsonl"),
            }
        }
    )
    with pytest.raises(ConfigError, match=r"policies\.balanced\.reference_trace: cannot read"):
        _built(missing)


def test_every_type_builds() -> None:
    pols = _built(
        _config(
            default_policy="th",
            policies={
                "th": {"type": "threshold", "threshold": 0.3},
                "three": {"type": "tiers", "thresholds": [0.3, 0.8]},
                "pace": {"type": "budget_pacing", "threshold": 0.4, "max_threshold": 0.9},
                "ctl": {"type": "fixed", "tier": "large"},
                "rnd": {"type": "random", "p": 0.2, "small": "medium"},
            },
        )
    )
    assert isinstance(pols["three"], TiersPolicy)
    assert pols["three"].tiers() == ["small", "medium", "large"]
    assert isinstance(pols["pace"], BudgetPacingPolicy) and pols["pace"].max_threshold == 0.9
    assert pols["ctl"].decide(RoutingContext(score=0.0)).tier == "large"
    assert pols["rnd"].tiers() == ["medium", "large"]


def _trace(path: Path, scores: np.ndarray) -> Path:
    with path.open("wb") as fh:
        for i, s in enumerate(scores):
            fh.write(
                orjson.dumps({"schema_version": 1, "id": f"r{i}", "time": 0.0, "score": float(s)})
                + b"\n"
            )
    return path


def test_target_share_converted_on_reference_trace(tmp_path: Path, caplog) -> None:
    scores = np.random.default_rng(3).beta(2, 5, 4000)
    ref = _trace(tmp_path / "ref.jsonl", scores)
    config = _config(
        policies={
            "balanced": {
                "type": "threshold",
                "target_large_share": 0.25,
                "reference_trace": str(ref),
            },
            "three": {"type": "tiers", "target_shares": [0.5, 0.1], "reference_trace": str(ref)},
        }
    )
    with caplog.at_level(logging.INFO, logger="cost_router.policies"):
        pols = _built(config)
    t = pols["balanced"].threshold
    assert achieved_share(scores, t) == pytest.approx(0.25, abs=1e-3)
    assert "target large share 0.2500 -> threshold" in caplog.text
    lo, hi = pols["three"].thresholds
    assert achieved_share(scores, lo) == pytest.approx(0.5, abs=1e-3)
    assert achieved_share(scores, hi) == pytest.approx(0.1, abs=1e-3)


def test_reference_trace_goes_through_the_trace_reader(tmp_path: Path) -> None:
    newer = tmp_path / "newer.jsonl"
    newer.write_bytes(b'{"schema_version": 99, "id": "r0", "time": 0, "score": 0.5}\n')
    with pytest.raises(ReferenceTraceError, match=r"newer\.jsonl: line 1: .*schema_version 99"):
        load_reference_scores(newer)
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b'{"id": "r0", "time": 0, "score": 0.5}\n{not json\n')
    with pytest.raises(ReferenceTraceError, match=r"broken\.jsonl: line 2: not JSON"):
        load_reference_scores(broken)


def test_rescore_scores_prompts_and_messages_as_the_proxy_does(tmp_path: Path) -> None:
    from classifiers.inference import DifficultyScorer

    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Prove that there are infinitely many primes."},
    ]
    ref = tmp_path / "ref.jsonl"
    ref.write_bytes(
        b"".join(
            orjson.dumps(r) + b"\n"
            for r in [
                {"id": "a", "time": 0, "prompt": "What is 2 + 2?", "score": 0.9},
                {"id": "b", "time": 0, "messages": messages},
                {"id": "c", "time": 0},  # no content: skipped
            ]
        )
    )
    scorer = DifficultyScorer.load()
    want = [
        scorer.score_request({"prompt": "What is 2 + 2?"}),
        scorer.score_request({"messages": messages}),
    ]
    assert load_reference_scores(ref, rescore=True).tolist() == want
    assert load_reference_scores(ref).tolist() == [0.9]


def test_threshold_for_share_edges() -> None:
    scores = np.array([0.1, 0.2, 0.3, 0.4])
    assert achieved_share(scores, threshold_for_share(scores, 0.0)) == 0.0
    assert achieved_share(scores, threshold_for_share(scores, 1.0)) == 1.0
    assert threshold_for_share(scores, 0.5) == 0.3


def _selector_config():
    key = "ab" * 32
    return key, _config(
        default_policy="balanced",
        policies={
            "balanced": {"type": "threshold", "threshold": 0.5},
            "cheap": {"type": "fixed", "tier": "small"},
            "pricey": {"type": "fixed", "tier": "large"},
            "keyed": {"type": "threshold", "threshold": 0.9},
        },
        teams={"red": {"policy": "cheap"}, "green": {"policy": "cheap"}},
        keys=[{"key_sha256": key, "team": "red", "policy": "keyed"}],
        experiments=[
            {
                "name": "exp",
                "unit": "team",
                "teams": ["green"],
                "salt": "x",
                "arms": {
                    "a": {"policy": "balanced", "weight": 1},
                    "b": {"policy": "pricey", "weight": 1},
                },
            }
        ],
    )


def test_selection_order() -> None:
    key, config = _selector_config()
    sel = build_selector(config)
    # 1. a tier name or its upstream model: passthrough
    for model in ("medium", "mid-model"):
        s = sel.select(model, team="green")
        assert (s.policy, s.tier, s.source) == (None, "medium", "passthrough")
    # 2. router:<name> beats experiment, key and team
    s = sel.select("router:pricey", team="red", key_id=key_id_of(key))
    assert (s.policy_name, s.source) == ("pricey", "request")
    with pytest.raises(UnknownPolicyError, match="unknown routing policy 'nope'") as err:
        sel.select("router:nope")
    assert err.value.status == 404
    # 3. experiment covers team green
    s = sel.select("auto", team="green")
    assert s.source == "experiment" and s.experiment == "exp" and s.arm in {"a", "b"}
    assert s.policy_name == {"a": "balanced", "b": "pricey"}[s.arm]
    # 4. key, 5. team, 6. default; an unknown model name is routed, not rejected
    assert sel.select("gpt-4o", team="red", key_id=key_id_of(key)).policy_name == "keyed"
    assert sel.select(None, team="red").source == "team"
    s = sel.select("auto", team="blue")
    assert (s.policy_name, s.source, s.arm) == ("balanced", "default", None)


def test_experiment_arms_split_teams() -> None:
    _, config = _selector_config()
    config.experiments[0].teams = None
    sel = build_selector(config)
    arms = {sel.select("auto", team=f"team{i}").arm for i in range(50)}
    assert arms == {"a", "b"}
