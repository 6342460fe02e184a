"""Leave-one-source-out (classifiers/loso.py): each held-out source is scored only by models that
never saw it, every recipe on the same rows, and the chosen recipe keeps a part only when taking
it out lowers the mean held-out APGR. Real data, cut small (a few rows of GSM8K and of four MMLU
subjects) so each fit takes a fraction of a second. `classifier train --report loso` is tested
with the commands (tests/router/commands/test_classifier_train_cli.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from classifiers.dataset import RoutingDataset, load_dataset, routellm_data_dir
from classifiers.evaluate import Estimate
from classifiers.loso import LosoReport, Result, holdouts, loso_report
from classifiers.train import TrainConfig

DATA = routellm_data_dir()
SUBJECTS = ["mmlu_anatomy.csv", "mmlu_astronomy.csv", "mmlu_marketing.csv", "mmlu_virology.csv"]
ROWS = 14  # per file


def write_loso_folder(root: Path) -> Path:
    """<root>/gsm8k/gsm8k_responses.csv and <root>/mmlu/<subject>.csv, ROWS rows each."""
    for bench, files in (("gsm8k", ["gsm8k_responses.csv"]), ("mmlu", SUBJECTS)):
        (root / bench).mkdir()
        for name in files:
            src = DATA / bench / name if bench == "gsm8k" else DATA / "mmlu" / "responses" / name
            with src.open(newline="", encoding="utf-8") as fh:
                rows = list(csv.reader(fh))[: ROWS + 1]
            with (root / bench / name).open("w", newline="", encoding="utf-8") as fh:
                csv.writer(fh).writerows(rows)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_loso_folder(tmp_path_factory.mktemp("loso"))


@pytest.fixture(scope="module")
def dataset(folder: Path) -> RoutingDataset:
    return load_dataset([folder], exclude_contaminated=False)


def test_each_holdout_is_scored_by_models_that_never_saw_it(dataset: RoutingDataset) -> None:
    splits = {h.name: h for h in holdouts(dataset)}
    assert set(splits) == {
        "gsm8k (trained on mmlu)",
        "mmlu (trained on gsm8k)",
        "mmlu half 2 (trained on half 1)",
        "mmlu half 1 (trained on half 2)",
    }
    for h in splits.values():
        assert not set(h.train) & set(h.test)
        assert not set(dataset.source[h.train]) & set(dataset.source[h.test])
    gsm = splits["gsm8k (trained on mmlu)"]
    assert set(dataset.benchmark[gsm.test]) == {"gsm8k"} and set(dataset.benchmark[gsm.train]) == {
        "mmlu"
    }
    half = splits["mmlu half 2 (trained on half 1)"]
    assert len(set(dataset.source[half.train])) == 2 and len(set(dataset.source[half.test])) == 2


def test_report_compares_recipes_on_the_same_rows(dataset: RoutingDataset) -> None:
    # The base recipe here is the words-only one (character n-grams and the source prior cost
    # seconds per fit); "shipped" names whatever base the report is given.
    base = TrainConfig(char_sides=(), prior_weight=0.0)
    recipes = {"shipped": (), "no_open_weight": ("open_weight",)}
    report = loso_report(dataset, base, recipes, rounds=20)
    assert len(report.results) == 4 * 2
    for r in report.results:
        assert r.apgr.n == report.test_rows[r.holdout]
        assert np.isnan(r.apgr.value) or -1 <= r.apgr.value <= 2  # NaN: no gap on those rows
        assert 0 <= r.auc.value <= 1
        assert (r.delta is None) == (r.recipe == "shipped")
    chosen, why = report.choose()
    assert chosen in recipes and why[-1].startswith(f"chosen: {chosen}")
    doc = json.loads(json.dumps(report.as_dict()))
    assert doc["chosen"] == chosen and set(doc["mean_apgr"]) == set(recipes)


def test_worker_processes_give_the_same_report(dataset: RoutingDataset) -> None:
    base = TrainConfig(char_sides=(), prior_weight=0.0)
    recipes = {"shipped": (), "no_open_weight": ("open_weight",)}
    alone = loso_report(dataset, base, recipes, rounds=20)
    done: list[str] = []
    forked = loso_report(dataset, base, recipes, rounds=20, progress=done.append, jobs=2)
    assert json.dumps(forked.as_dict()["results"]) == json.dumps(alone.as_dict()["results"])
    assert len(done) == len(alone.results) and all(m.endswith("(done)") for m in done)


def _report(effects: dict[str, tuple[float, float, float]]) -> LosoReport:
    """Two holdouts; on each, every recipe's paired difference from "shipped" is
    (value, low, high) and its APGR 0.6 + value."""
    results = []
    for holdout in ("h1", "h2"):
        results.append(
            Result(
                "shipped", holdout, Estimate(0.6, 0.5, 0.7, 10), Estimate(0.5, 0.5, 0.5, 10), None
            )
        )
        for name, (value, low, high) in effects.items():
            results.append(
                Result(
                    name,
                    holdout,
                    Estimate(0.6 + value, 0.5, 0.7, 10),
                    Estimate(0.5, 0.5, 0.5, 10),
                    Estimate(value, low, high, 10),
                )
            )
    return LosoReport(results, {}, {})


SIG_UP, SIG_DOWN, NOISE = (0.02, 0.01, 0.03), (-0.02, -0.03, -0.01), (0.002, -0.01, 0.014)


@pytest.mark.parametrize(
    ("effects", "chosen"),
    [
        (
            {"no_source_prior": SIG_DOWN, "no_char_ngrams": SIG_DOWN, "words_only": SIG_DOWN},
            "shipped",
        ),  # every part helps held out: keep all
        (
            {"no_source_prior": NOISE, "no_char_ngrams": NOISE, "words_only": NOISE},
            "shipped",
        ),  # no part shown to lower it (intervals span 0): keep all
        (
            {"no_source_prior": SIG_UP, "no_char_ngrams": NOISE, "words_only": NOISE},
            "no_source_prior",
        ),  # the prior lowers held-out APGR: drop it only
        (
            {"no_source_prior": SIG_UP, "no_char_ngrams": SIG_UP, "words_only": (0.03, 0.02, 0.04)},
            "words_only",
        ),  # both lower it: drop both
        (
            {"no_source_prior": SIG_UP, "no_char_ngrams": (0.03, 0.02, 0.04)},
            "no_char_ngrams",
        ),  # both lower it, together not measured: the best measured of the two
        ({"no_open_weight": (0.0, 0.0, 0.0)}, "shipped"),  # no holdout tells them apart: keep it
    ],
)
def test_choose_drops_only_parts_shown_to_lower_it(
    effects: dict[str, tuple[float, float, float]], chosen: str
) -> None:
    assert _report(effects).choose()[0] == chosen


def test_removal_effect_combines_the_holdouts() -> None:
    report = _report({"no_source_prior": (0.02, 0.0, 0.04), "no_open_weight": (0.0, 0.0, 0.0)})
    effect = report.removal_effect("no_source_prior")
    assert effect is not None and effect.value == pytest.approx(0.02)
    # Two holdouts, each with standard error 0.02 / 1.96: the mean's is that / sqrt(2).
    assert effect.high - effect.value == pytest.approx(0.02 / np.sqrt(2))
    assert report.removal_effect("no_open_weight") is None
    assert any("without open_weight: no holdout tells" in line for line in report.choose()[1])
