"""`classifier train` says what it is about to do and how long it should take, then one line per
phase (each fit and fold) on stderr when no progress bar can be drawn (issue 25, item 7: piped,
`--with-default-data` printed nothing for 15 minutes), and its default report is 3 folds."""

from __future__ import annotations

import csv
import json
import resource
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.train import TrainConfig, out_of_fold
from router.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def slice_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = load_dataset(routellm_data_dir())
    rows = np.concatenate([np.flatnonzero(data.benchmark == b)[:60] for b in ("gsm8k", "mmlu")])
    path = tmp_path_factory.mktemp("data") / "bench" / "outcomes.csv"
    path.parent.mkdir()
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "cheap", "pricey"])
        for i in rows:
            writer.writerow([data.prompts[i], bool(data.small[i]), bool(data.large[i])])
    return path


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the forked fold workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def test_train_prints_its_plan_and_a_line_per_fit(slice_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    args = ["classifier", "train", str(slice_csv), "--small", "cheap", "--large", "pricey"]
    start = _cpu_s()
    result = runner.invoke(app, [*args, "--bootstrap", "50", "--out", str(out)])
    spent = _cpu_s() - start
    assert result.exit_code == 0, result.output
    err = result.stderr
    # The plan, before any fit: rows, fits, a rough time.
    plan = next(line for line in err.splitlines() if line.startswith("training on"))
    assert "120 labelled rows" in plan and "3-fold out-of-fold report" in plan, plan
    assert "roughly" in plan and "min" in plan, plan
    assert err.index("training on") < err.index("fold 1/3")
    # A line per phase: each fold's fit, the final fit, the export, then the total.
    lines = [line for line in err.splitlines() if line.startswith("[")]
    for phase in ("fold 1/3", "fold 2/3", "fold 3/3", "fitting the model", "exporting"):
        assert any(phase in line for line in lines), (phase, err)
    assert any("took" in line and "so far" in line for line in lines), err
    assert any("left)" in line for line in lines), err  # the fits' pace predicts the rest
    assert lines[-1].startswith("[done]") and "in all" in lines[-1], err
    # The default report is 3 folds, and the run on a small slice is quick.
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["out_of_fold"]["folds"] == 3
    # CPU, not wall time: on the shared 2-core machine wall time is 2-4x this.
    assert spent < 30, spent


def test_folds_fitted_at_once_give_the_same_scores(slice_csv: Path) -> None:
    data = load_dataset(slice_csv, small="cheap", large="pricey")
    one = out_of_fold(data, TrainConfig(), folds=3, jobs=1)
    two = out_of_fold(data, TrainConfig(), folds=3, jobs=2)
    assert np.array_equal(one.rows, two.rows) and np.array_equal(one.folds, two.folds)
    assert np.allclose(one.scores, two.scores, rtol=0, atol=1e-12)
