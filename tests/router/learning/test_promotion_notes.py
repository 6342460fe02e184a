"""What promotion says and leaves behind (issue 25, item 12): a calibrated target share without a
reference trace is not said to be converted with one, and a rollback gives the config back its
own shape (no `classifier: {}` where the file had no classifier section). Real files, as
tests/router/learning/test_promotion.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from classifiers.model_files import model_file
from router.learning.promotion import evaluate, promote, rollback
from tests.router.commands.test_promote import _card_with_comparison, _config, _model
from tests.router.learning.test_promotion import _file, _sections


def test_a_calibrated_share_without_reference_trace_is_not_said_to_be_converted(
    tmp_path: Path,
) -> None:
    current, new = _model(tmp_path, "current"), _model(tmp_path / "new", "new")
    config = _config(
        tmp_path / "router.yaml",
        "http://127.0.0.1:9/v1",
        current,
        policies={"main": {"type": "threshold", "target_large_share": 0.3, "calibrate": {}}},
    )
    _card_with_comparison(new, current, 0.01)
    said: list[str] = []
    promote(evaluate(new, _sections(config)), _file(config), say=said.append)
    line = next(s for s in said if s.startswith("policies.main:"))
    assert "reference_trace" in line and "converted" not in line, line
    assert "held on live traffic by calibrate" in line, line
    assert "starting from the new model's card threshold" in line, line
    data = yaml.safe_load(config.read_text())
    assert "rescore" not in data["policies"]["main"]  # nothing to rescore


def test_rollback_leaves_no_empty_classifier_section(tmp_path: Path) -> None:
    current, new = _model(tmp_path, "current"), _model(tmp_path / "new", "new")
    config = _config(tmp_path / "router.yaml", "http://127.0.0.1:9/v1", current)
    # A file without a classifier section: the shipped model is in use.
    data = yaml.safe_load(config.read_text())
    del data["classifier"]
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    original = yaml.safe_load(config.read_text())
    sections = _sections(config)
    _card_with_comparison(new, model_file(None), 0.01)  # compared with the shipped model
    promote(evaluate(new, sections), _file(config), force=True)
    assert yaml.safe_load(config.read_text())["classifier"]["model_path"] == str(new.resolve())
    rollback(_sections(config), _file(config))
    restored = yaml.safe_load(config.read_text())
    assert "classifier" not in restored, restored
    assert restored == original
