"""`cost-router classifier promote|rollback` and per-policy models (issue 13, gated promotion).

Models: the shipped one, and the same graph with its card's class values swapped ("inverted":
score = 1 - the shipped score), so which model scored a request shows in `x-router-score`. On
real GSM8K/MMLU prompts with their recorded outcomes the shipped model routes far better than the
inverted one, which is what the gate has to see. Labelled traffic is a proxy-style trace folder:
`requests.jsonl` plus a judge's `labels.jsonl` (trace_format/labels.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from benchmarks.echo_upstream import running_echo_upstream
from classifiers.config import DEFAULT_MODEL
from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.inference import DifficultyScorer
from classifiers.model_files import ModelFiles
from router.cli import app
from router.config import load_config
from router.learning.promotion import history_path, sha256
from tests.support.flowing import Answer, first_scored, requests_flowing
from tests.support.proxy import ProxyThread, tier
from tests.support.waiting import wait_for
from trace_format.labels import LABELS_FILE, LabelRecord

runner = CliRunner()
ROWS = 300
PROMPT = "Write a haiku about autumn"


def _model(folder: Path, name: str, inverted: bool = False) -> Path:
    """A copy of the shipped model (without its training-prompt sidecar: scored directly)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}.onnx"
    shutil.copyfile(DEFAULT_MODEL, out)
    card = json.loads(DEFAULT_MODEL.with_suffix(".json").read_text())
    if inverted:
        card["class_values"] = card["class_values"][::-1]  # score -> 1 - score
    out.with_suffix(".json").write_text(json.dumps(card))
    shutil.copyfile(ModelFiles(DEFAULT_MODEL).scores, ModelFiles(out).scores)
    return out


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace folder of ROWS real prompts (half GSM8K, half MMLU), each labelled by a judge."""
    folder = tmp_path_factory.mktemp("labelled") / "traces"
    folder.mkdir()
    data = routellm_data_dir()
    rows: dict[str, tuple[float, float]] = {}
    for ds, stop in (
        (load_dataset(data / "gsm8k"), ROWS // 2),
        (load_dataset(data / "mmlu" / "responses" / "mmlu_high_school_psychology.csv"), ROWS),
    ):
        for prompt, small, large in zip(ds.prompts, ds.small, ds.large, strict=True):
            if len(rows) == stop:
                break
            rows.setdefault(prompt, (float(small), float(large)))
    requests, labels = [], []
    for i, (prompt, (small, large)) in enumerate(rows.items()):
        requests.append(
            json.dumps(
                {
                    "schema_version": 1,
                    "id": f"r{i}",
                    "time": 1.0 + i,
                    "prompt": prompt,
                    "prompt_tokens": 50,
                    "completion_tokens": 20,
                }
            )
            + "\n"
        )
        labels.append(
            LabelRecord(
                request_id=f"r{i}", judge="reference", outcomes={"small": small, "large": large}
            ).line()
        )
    (folder / "requests.jsonl").write_text("".join(requests))
    (folder / LABELS_FILE).write_bytes(b"".join(labels))
    return folder


def _config(path: Path, url: str, model: Path, **extra: Any) -> Path:
    data: dict[str, Any] = {
        "server": {"reload_debounce_s": 0.1},
        "tiers": [tier("small", url), tier("large", url, price=(10, 10))],
        "traces": {"path": str(path.parent / "proxy-traces" / "requests.jsonl")},
        "signals": {"enabled": False},
        "classifier": {"model_path": str(model)},
        "default_policy": "main",
        "policies": {"main": {"type": "threshold", "threshold": 0.6}},
        **extra,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _scores(model: Path, labelled: Path) -> np.ndarray:
    texts = [json.loads(line)["prompt"] for line in (labelled / "requests.jsonl").open()]
    return DifficultyScorer.load(model).score_texts(texts)


def test_promote_refuses_a_model_not_shown_better(tmp_path: Path, labelled: Path) -> None:
    good, bad = _model(tmp_path, "good"), _model(tmp_path, "bad", inverted=True)
    config = _config(tmp_path / "router.yaml", "http://127.0.0.1:9/v1", good)
    before = config.read_bytes()
    result = runner.invoke(
        app,
        [
            "classifier",
            "promote",
            str(bad),
            "--config",
            str(config),
            "--traces",
            str(labelled),
            "--bootstrap",
            "200",
        ],
    )
    assert result.exit_code == 1, result.output
    refusal = [line for line in result.output.splitlines() if line.startswith("refused:")]
    assert len(refusal) == 1, result.output
    assert f"on {ROWS} labelled requests" in refusal[0] and "must lie above 0" in refusal[0]
    assert "APGR gain -" in refusal[0] and "[" in refusal[0]  # the interval, and it is a loss
    assert config.read_bytes() == before and not history_path(config).exists()
    assert not ModelFiles(bad).prev.onnx.exists()


def test_promote_swaps_a_better_model_in_and_rollback_restores(
    tmp_path: Path, labelled: Path
) -> None:
    bad, good = _model(tmp_path, "current", inverted=True), _model(tmp_path / "new", "new")
    config_file = _config(tmp_path / "router.yaml", "http://127.0.0.1:9/v1", bad)
    original = yaml.safe_load(config_file.read_text())
    result = runner.invoke(
        app,
        [
            "classifier",
            "promote",
            str(good),
            "--config",
            str(config_file),
            "--traces",
            str(labelled),
            "--bootstrap",
            "200",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "the new model is better: APGR gain" in result.output
    assert "no target recorded: kept its large share" in result.output
    config = load_config(config_file)
    assert config.classifier.model_path == str(good.resolve())
    # The large share the policy had with the old model at 0.6, now with the new model.
    share = float(np.mean(_scores(bad, labelled) >= 0.6))
    threshold = config.policies["main"].model_extra["threshold"]  # type: ignore[index]
    assert threshold != 0.6
    assert float(np.mean(_scores(good, labelled) >= threshold)) == pytest.approx(share, abs=0.01)
    saved = ModelFiles(good.resolve()).prev.onnx
    assert saved.is_file() and sha256(saved) == sha256(bad)
    # The previous model's drift reference travels with its copy.
    assert ModelFiles(saved).scores.read_bytes() == ModelFiles(bad).scores.read_bytes()
    history = json.loads(history_path(config_file).read_text())["promotions"]
    assert len(history) == 1 and history[0]["gate"]["promote"] and not history[0]["gate"]["forced"]

    result = runner.invoke(app, ["classifier", "rollback", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(config_file.read_text()) == original
    assert json.loads(history_path(config_file).read_text())["promotions"] == []
    result = runner.invoke(app, ["classifier", "rollback", "--config", str(config_file)])
    assert result.exit_code == 2 and "no promotion recorded" in result.output


def test_rollback_uses_the_saved_copy_when_the_old_file_changed(
    tmp_path: Path, labelled: Path
) -> None:
    bad, good = _model(tmp_path, "current", inverted=True), _model(tmp_path / "new", "new")
    config = _config(tmp_path / "router.yaml", "http://127.0.0.1:9/v1", bad)
    result = runner.invoke(
        app,
        [
            "classifier",
            "promote",
            str(good),
            "--config",
            str(config),
            "--traces",
            str(labelled),
            "--force",
            "--bootstrap",
            "50",
        ],
    )
    assert result.exit_code == 0, result.output
    bad.write_bytes(b"retrained over, in place")  # e.g. `classifier train --out` the same path
    result = runner.invoke(app, ["classifier", "rollback", "--config", str(config)])
    assert result.exit_code == 0, result.output
    restored = load_config(config).classifier.model_path
    assert (
        restored == str(ModelFiles(good.resolve()).prev.onnx)
        and "restoring its copy" in result.output
    )


def test_promote_bad_input_exits_2(tmp_path: Path, labelled: Path) -> None:
    good = _model(tmp_path, "good")
    config = _config(tmp_path / "router.yaml", "http://127.0.0.1:9/v1", good)
    cases = [
        ([str(tmp_path / "missing.onnx")], "no such .onnx file"),
        ([str(good)], "already the model of classifier.model_path"),
        ([str(_model(tmp_path, "other")), "--policy", "nope"], "--policy nope: no such policy"),
        ([str(_model(tmp_path, "third"))], "no out-of-fold comparison"),  # no card, no --traces
    ]
    for args, message in cases:
        result = runner.invoke(app, ["classifier", "promote", *args, "--config", str(config)])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and result.output.startswith("error: "), result.output


def _ask(client: httpx.Client) -> Answer:
    r = client.post(
        "/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": PROMPT}]},
    )
    return r.status_code, r.headers.get("x-router-score", "")


def test_promote_into_a_live_proxy_swaps_model_and_threshold_without_failing_a_request(
    tmp_path: Path, labelled: Path
) -> None:
    old, new = _model(tmp_path, "old"), _model(tmp_path / "new", "new", inverted=True)
    old_score = f"{DifficultyScorer.load(old).score_request({'prompt': PROMPT}):.4f}"
    new_score = f"{DifficultyScorer.load(new).score_request({'prompt': PROMPT}):.4f}"
    assert old_score != new_score
    with running_echo_upstream() as url:
        config = _config(tmp_path / "router.yaml", url, old)
        with (
            ProxyThread(load_config(config), config_path=config) as proxy,
            httpx.Client(base_url=proxy.url, timeout=30) as http,
            requests_flowing(lambda: _ask(http), join_s=30) as seen,
        ):
            wait_for(lambda: len(seen) >= 20, 30, "requests before the promotion")
            result = runner.invoke(
                app,
                [
                    "classifier",
                    "promote",
                    str(new),
                    "--config",
                    str(config),
                    "--traces",
                    str(labelled),
                    "--force",
                    "--bootstrap",
                    "50",
                ],
            )
            assert result.exit_code == 0, result.output
            assert "forced: the new model is not shown better" in result.output
            at = first_scored(
                seen, new_score, len(seen), 30, "the new model's scores in x-router-score"
            )
            wait_for(lambda: len(seen) >= at + 20, 30, "requests after the swap")
            threshold = load_config(config).policies["main"].model_extra["threshold"]
            assert proxy.state.selector.policies["main"].threshold == threshold  # type: ignore[attr-defined]
            result = runner.invoke(app, ["classifier", "rollback", "--config", str(config)])
            assert result.exit_code == 0, result.output
            back = len(seen)
            first_scored(seen, old_score, back, 30, "the old model's scores again after rollback")
    failed = [s for s in seen if s[0] != 200]
    assert not failed, f"{len(failed)} of {len(seen)} requests failed: {failed[:3]}"
    after = [s for _, s in seen[at:back]]
    assert after and all(s == new_score for s in after), "old scores after the swap"
    assert proxy.app.state.reloader.failures == 0


def test_an_experiment_arm_scores_with_its_own_policy_model(tmp_path: Path) -> None:
    control, canary = _model(tmp_path, "control"), _model(tmp_path, "canary", inverted=True)
    want = {
        "control": f"{DifficultyScorer.load(control).score_request({'prompt': PROMPT}):.4f}",
        "canary": f"{DifficultyScorer.load(canary).score_request({'prompt': PROMPT}):.4f}",
    }
    with running_echo_upstream() as url:
        config = _config(
            tmp_path / "router.yaml",
            url,
            control,
            policies={
                "main": {"type": "threshold", "threshold": 0.5},
                "candidate": {"type": "threshold", "threshold": 0.5, "model_path": str(canary)},
            },
            experiments=[
                {
                    "name": "new-model",
                    "unit": "header",
                    "header": "x-unit",
                    "arms": {
                        "control": {"policy": "main", "weight": 1},
                        "canary": {"policy": "candidate", "weight": 1},
                    },
                }
            ],
        )
        with ProxyThread(load_config(config), config_path=config) as proxy:
            assert proxy.state.scorer_for("candidate") is not proxy.state.scorer_for("main")
            arms: dict[str, set[str]] = {"control": set(), "canary": set()}
            with httpx.Client(base_url=proxy.url, timeout=30) as client:
                for unit in range(40):
                    r = client.post(
                        "/v1/chat/completions",
                        headers={"x-unit": f"u{unit}"},
                        json={"model": "auto", "messages": [{"role": "user", "content": PROMPT}]},
                    )
                    assert r.status_code == 200, r.text
                    arms[r.headers["x-router-arm"]].add(r.headers["x-router-score"])
            records = proxy.traces(40)
    assert arms == {"control": {want["control"]}, "canary": {want["canary"]}}
    by_arm = {r["arm"]: round(r["score"], 4) for r in records if r.get("arm")}
    assert by_arm == {arm: float(score) for arm, score in want.items()}


def test_a_policy_model_that_cannot_load_is_rejected_on_reload(tmp_path: Path) -> None:
    model = _model(tmp_path, "main")
    with running_echo_upstream() as url:
        config = _config(tmp_path / "router.yaml", url, model)
        with ProxyThread(load_config(config), config_path=config) as proxy:
            reloader = proxy.app.state.reloader
            data = yaml.safe_load(config.read_text())
            data["policies"]["main"]["model_path"] = str(tmp_path / "missing.onnx")
            config.write_text(yaml.safe_dump(data))
            wait_for(lambda: reloader.failures == 1, 30, "the reload to be rejected")
            r = httpx.post(
                f"{proxy.url}/v1/chat/completions",
                json={"model": "auto", "messages": [{"role": "user", "content": PROMPT}]},
            )
            assert r.status_code == 200 and proxy.state.config.policies["main"].model_path is None


def test_tune_write_records_the_target_and_promote_retunes_to_it(
    tmp_path: Path, labelled: Path
) -> None:
    bad, good = _model(tmp_path, "current", inverted=True), _model(tmp_path / "new", "new")
    config = _config(tmp_path / "router.yaml", "http://127.0.0.1:9/v1", bad)
    result = runner.invoke(
        app,
        [
            "tune",
            "--traces",
            str(labelled),
            "--config",
            str(config),
            "--target-quality",
            "0.95",
            "--bootstrap",
            "0",
            "--write",
            str(config),
        ],
    )
    assert result.exit_code == 0, result.output
    entry = yaml.safe_load(config.read_text())["policies"]["main"]
    assert entry["tuned_for"] == {"kind": "quality", "value": 0.95}
    result = runner.invoke(
        app,
        [
            "classifier",
            "promote",
            str(good),
            "--config",
            str(config),
            "--traces",
            str(labelled),
            "--bootstrap",
            "200",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "to its recorded target (quality >= 95.0% of all-large)" in result.output
    entry = yaml.safe_load(config.read_text())["policies"]["main"]
    assert entry["tuned_for"] == {"kind": "quality", "value": 0.95}
    # The new model at the new threshold meets the target on the labelled requests.
    rows = [json.loads(line) for line in (labelled / LABELS_FILE).open()]
    small = np.array([r["outcomes"]["small"] for r in rows])
    large = np.array([r["outcomes"]["large"] for r in rows])
    routed = np.where(_scores(good, labelled) >= entry["threshold"], large, small)
    assert routed.mean() / large.mean() >= 0.95 - 1e-9
    # ... and cheaper than all-large: it is a real threshold, not "everything large".
    assert np.mean(_scores(good, labelled) >= entry["threshold"]) < 0.9


def test_promote_into_one_policy_as_a_canary_and_roll_back(tmp_path: Path, labelled: Path) -> None:
    current, new = _model(tmp_path, "current"), _model(tmp_path / "new", "new", inverted=True)
    config = _config(
        tmp_path / "router.yaml",
        "http://127.0.0.1:9/v1",
        current,
        policies={
            "main": {"type": "threshold", "threshold": 0.6},
            "candidate": {"type": "threshold", "threshold": 0.6},
        },
    )
    original = yaml.safe_load(config.read_text())
    result = runner.invoke(
        app,
        [
            "classifier",
            "promote",
            str(new),
            "--config",
            str(config),
            "--traces",
            str(labelled),
            "--policy",
            "candidate",
            "--force",
            "--bootstrap",
            "50",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "as policies.candidate.model_path" in result.output
    data = yaml.safe_load(config.read_text())
    assert data["classifier"] == original["classifier"] and data["policies"]["main"] == {
        "type": "threshold",
        "threshold": 0.6,
    }  # the global model and other policies: untouched
    assert data["policies"]["candidate"]["model_path"] == str(new.resolve())
    assert data["policies"]["candidate"]["threshold"] != 0.6
    result = runner.invoke(app, ["classifier", "rollback", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(config.read_text()) == original


def _card_with_comparison(model: Path, against: Path, low: float, rows: int = 400) -> None:
    """What `classifier train --current AGAINST` leaves beside its model: the comparison in the
    card (`out_of_fold`) and the out-of-fold scores of both models (classifiers/oof.py)."""
    card = json.loads(model.with_suffix(".json").read_text())
    card["out_of_fold"] = {
        "file": model.stem + ".oof.jsonl",
        "folds": 5,
        "current_model": str(against),
        "comparison": {
            "n": rows,
            "better": low > 0,
            "delta": {"APGR": {"value": low + 0.03, "low": low, "high": low + 0.06}},
        },
    }
    model.with_suffix(".json").write_text(json.dumps(card))
    rng = np.random.default_rng(0)
    current = rng.random(rows)
    lines = [
        json.dumps(
            {
                "request_id": f"r{i}",
                "score": float(c) ** 2,
                "fold": i % 5,
                "current_score": float(c),
            }
        )
        for i, c in enumerate(current)
    ]
    model.with_name(model.stem + ".oof.jsonl").write_text("\n".join(lines) + "\n")


def test_promote_without_traces_uses_the_comparison_train_recorded(tmp_path: Path) -> None:
    current, new = _model(tmp_path, "current"), _model(tmp_path / "new", "new")
    config = _config(tmp_path / "router.yaml", "http://127.0.0.1:9/v1", current)
    _card_with_comparison(new, tmp_path / "some-other.onnx", 0.01)
    result = runner.invoke(app, ["classifier", "promote", str(new), "--config", str(config)])
    assert result.exit_code == 2 and "not the model in use" in result.output, result.output
    _card_with_comparison(new, current, -0.01)
    result = runner.invoke(app, ["classifier", "promote", str(new), "--config", str(config)])
    assert result.exit_code == 1 and "refused: the new model is not shown better" in result.output
    _card_with_comparison(new, current, 0.01)
    result = runner.invoke(app, ["classifier", "promote", str(new), "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "recorded by classifier train in new.json" in result.output
    # The large share the current model had at 0.6 on those requests (40%), kept: 0.6 ** 2.
    threshold = yaml.safe_load(config.read_text())["policies"]["main"]["threshold"]
    assert threshold == pytest.approx(0.36, abs=0.02)
