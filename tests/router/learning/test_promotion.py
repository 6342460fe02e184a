"""Promotion and rollback called as a library (router/learning/promotion.py), as the admin API
would: no typer, no CLI. Real files: copies of the shipped model with their cards, the comparison
`classifier train` records in a card, a router YAML edited through router.config.edit_config,
and the promotion history beside it."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import yaml

from classifiers.model_files import ModelFiles
from router.config import edit_config, load_config, write_atomically
from router.learning.promotion import (
    ConfigFile,
    PromotionError,
    RoutingSections,
    evaluate,
    history_path,
    promote,
    rollback,
    sha256,
)
from tests.router.commands.test_promote import _card_with_comparison, _config, _model


def _sections(config: Path) -> RoutingSections:
    loaded = load_config(config)
    return RoutingSections(loaded.classifier, loaded.policies, loaded.policy_env())


def _file(config: Path) -> ConfigFile:
    return ConfigFile(config, partial(edit_config, config), write_atomically)


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The model in use, a new one beside it, and the router YAML naming the first."""
    current, new = _model(tmp_path, "current"), _model(tmp_path / "new", "new")
    config = _config(tmp_path / "router.yaml", "http://127.0.0.1:9/v1", current)
    return current, new, config


def test_a_model_not_shown_better_is_refused_and_nothing_is_written(
    models: tuple[Path, Path, Path],
) -> None:
    current, new, config = models
    _card_with_comparison(new, current, -0.01)
    before = config.read_bytes()
    candidate = evaluate(new, _sections(config))
    assert not candidate.verdict.promote and candidate.current == current.resolve()
    said: list[str] = []
    with pytest.raises(PromotionError) as refused:
        promote(candidate, _file(config), say=said.append)
    assert not refused.value.bad_input and refused.value.forcible
    assert str(refused.value).startswith("the new model is not shown better")
    assert said == [] and config.read_bytes() == before
    assert not history_path(config).exists() and not ModelFiles(new.resolve()).prev.onnx.exists()


def test_force_promotes_then_rollback_restores_the_config(
    models: tuple[Path, Path, Path],
) -> None:
    current, new, config = models
    _card_with_comparison(new, current, -0.01)
    original = yaml.safe_load(config.read_text())
    said: list[str] = []
    done = promote(evaluate(new, _sections(config)), _file(config), force=True, say=said.append)

    assert said[0].startswith("forced: the new model is not shown better")
    assert said[1].startswith("policies.main.threshold 0.6 -> "), said
    data = yaml.safe_load(config.read_text())
    assert data["classifier"]["model_path"] == str(new.resolve())
    # The large share the current model had at 0.6 on the recorded requests, kept: the
    # new model's recorded scores are the current ones squared.
    assert data["policies"]["main"]["threshold"] == pytest.approx(0.36, abs=0.02)
    saved = ModelFiles(new.resolve()).prev
    assert done.saved == saved.onnx and sha256(saved.onnx) == sha256(current)
    assert saved.card.read_bytes() == ModelFiles(current).card.read_bytes()
    assert saved.scores.read_bytes() == ModelFiles(current).scores.read_bytes()
    history = yaml.safe_load(history_path(config).read_text())["promotions"]
    assert len(history) == 1 and history[0] == done.record
    assert history[0]["gate"]["forced"] and history[0]["scope"] == "classifier.model_path"
    assert history[0]["policies"] == {"main": {"threshold": 0.6}}

    said.clear()
    back = rollback(_sections(config), _file(config), say=said.append)
    assert (back.key, back.restored) == ("classifier.model_path", str(current))
    assert said == ["policies.main: threshold 0.6"]
    assert yaml.safe_load(config.read_text()) == original
    assert yaml.safe_load(history_path(config).read_text())["promotions"] == []
    with pytest.raises(PromotionError, match="no promotion recorded") as nothing:
        rollback(_sections(config), _file(config))
    assert nothing.value.bad_input


def test_rollback_refuses_a_config_edited_since_unless_forced(
    models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    current, new, config = models
    _card_with_comparison(new, current, 0.01)
    promote(evaluate(new, _sections(config)), _file(config))
    other = _model(tmp_path / "other", "other")
    _file(config).edit(lambda data: data["classifier"].update(model_path=str(other)))
    with pytest.raises(PromotionError, match="the config was edited since") as edited:
        rollback(_sections(config), _file(config))
    assert not edited.value.bad_input and edited.value.forcible
    assert load_config(config).classifier.model_path == str(other)
    rollback(_sections(config), _file(config), force=True)
    assert load_config(config).classifier.model_path == str(current)


def test_bad_input_is_a_promotion_error_naming_it(models: tuple[Path, Path, Path]) -> None:
    current, new, config = models
    cases = [
        (lambda: evaluate(new.with_name("missing.onnx"), _sections(config)), "no such .onnx"),
        (lambda: evaluate(current, _sections(config)), "already the model of classifier"),
        (lambda: evaluate(new, _sections(config), policy="nope"), "policies.nope: no such"),
        (lambda: evaluate(new, _sections(config)), "no out-of-fold comparison"),
    ]
    for call, message in cases:
        with pytest.raises(PromotionError, match=message) as bad:
            call()
        assert bad.value.bad_input and not bad.value.forcible
