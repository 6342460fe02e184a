"""Sticky, deterministic experiment assignment: across restarts, replicas, and by weight."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime

import pytest
from scipy.stats import chisquare

from policies.config import ExperimentConfig
from policies.experiments import Experiment, ExperimentSet, UnitContext
from router.config import config_from_dict
from trace_format.config_base import ConfigError

ARMS = {
    "control": {"policy": "a", "weight": 1},
    "treatment": {"policy": "b", "weight": 3},
    "baseline": {"policy": "a", "weight": 1},
}


def _exp(**kw) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"name": "exp1", "arms": ARMS, "salt": "s1", **kw})


_CHILD = """
import json, sys
from policies.experiments import Experiment
from policies.config import ExperimentConfig
settings = ExperimentConfig.model_validate(json.loads(sys.argv[1]))
exp = Experiment(settings)
print(json.dumps([exp.arm_for(f"team-{i}") for i in range(2000)]))
"""


def _in_new_process(settings: ExperimentConfig, hash_seed: str) -> list[str]:
    # A different PYTHONHASHSEED per process: Python's hash() would differ, ours must not.
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, settings.model_dump_json()],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONHASHSEED": hash_seed, "PATH": ""},
    )
    return json.loads(out.stdout)


def test_assignment_identical_across_processes() -> None:
    settings = _exp()
    here = [Experiment(settings).arm_for(f"team-{i}") for i in range(2000)]
    assert _in_new_process(settings, "1") == here
    assert _in_new_process(settings, "12345") == here


def test_assignment_sticky_and_order_independent() -> None:
    a = Experiment(_exp())
    reordered = _exp(arms=dict(reversed(list(ARMS.items()))))
    b = Experiment(reordered)
    units = [f"user-{i}" for i in range(3000)]
    assert [a.arm_for(u) for u in units] == [a.arm_for(u) for u in units]
    assert [a.arm_for(u) for u in units] == [b.arm_for(u) for u in units]


def test_salt_reshuffles() -> None:
    units = [f"u{i}" for i in range(2000)]
    a = [Experiment(_exp()).arm_for(u) for u in units]
    b = [Experiment(_exp(salt="other")).arm_for(u) for u in units]
    assert sum(x != y for x, y in zip(a, b, strict=True)) > 500


def test_weights_chi_square_100k_units() -> None:
    exp = Experiment(_exp())
    counts = Counter(exp.arm_for(f"unit-{i}") for i in range(100_000))
    arms = sorted(ARMS)
    total_w = sum(ARMS[a]["weight"] for a in arms)
    expected = [100_000 * ARMS[a]["weight"] / total_w for a in arms]
    result = chisquare([counts[a] for a in arms], expected)
    assert result.pvalue > 0.001


def test_unit_kinds_and_missing_unit() -> None:
    exps = ExperimentSet([_exp(unit="header", header="X-Tenant"), _exp(name="e2", unit="user")])
    got = exps.assign(UnitContext(team="t", headers={"x-tenant": "acme"}), now=0)
    assert got is not None and got.experiment == "exp1"
    assert got.arm == Experiment(_exp()).arm_for("acme")
    # No header: the next experiment (unit user) takes it.
    by_user = exps.assign(UnitContext(team="t", user="bob"), now=0)
    assert by_user is not None and by_user.experiment == "e2"
    assert exps.assign(UnitContext(team="t"), now=0) is None


def test_start_stop_window_and_team_filter() -> None:
    start, stop = "2026-11-01T00:00:00", "2026-12-01T00:00:00+00:00"
    exps = ExperimentSet([_exp(start=start, stop=stop, teams=["red"])])
    t0 = datetime(2026, 11, 1, tzinfo=UTC).timestamp()  # naive start is read as UTC
    t1 = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    red = UnitContext(team="red")
    assert exps.assign(red, now=t0 - 1) is None
    assert exps.assign(red, now=t0) is not None
    assert exps.assign(red, now=t1 - 1) is not None
    assert exps.assign(red, now=t1) is None
    assert exps.assign(UnitContext(team="blue"), now=t0 + 10) is None


def test_experiment_config_validation_names_key() -> None:
    tiers = [
        {
            "name": "s",
            "base_url": "http://x",
            "model": "m",
            "price": {"input_per_mtok": 1, "output_per_mtok": 1},
        }
    ]
    base = {
        "tiers": tiers,
        "policies": {"a": {"type": "fixed", "tier": "s"}},
        "default_policy": "a",
    }
    bad_stop = {
        "name": "e",
        "arms": {"x": {"policy": "a", "weight": 1}},
        "start": "2026-02-01",
        "stop": "2026-01-01",
    }
    with pytest.raises(ConfigError, match="stop must be after start"):
        config_from_dict({**base, "experiments": [bad_stop]})
    unknown = {"name": "e", "arms": {"x": {"policy": "zzz", "weight": 1}}}
    with pytest.raises(ConfigError, match=r"experiments\[0\]\.arms\.x\.policy"):
        config_from_dict({**base, "experiments": [unknown]})
    zero = {"name": "e", "arms": {"x": {"policy": "a", "weight": 0}}}
    with pytest.raises(ConfigError, match=r"experiments\.0\.arms\.x\.weight"):
        config_from_dict({**base, "experiments": [zero]})
    ok = {"name": "e", "arms": {"x": {"policy": "a", "weight": 1}}}
    with pytest.raises(ConfigError, match="duplicate experiment names"):
        config_from_dict({**base, "experiments": [ok, ok]})
