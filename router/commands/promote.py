"""`cost-router classifier promote|rollback` (registered in router/commands/classifier.py).

    cost-router classifier promote models/new.onnx --config router.yaml --traces traces/
    cost-router classifier rollback --config router.yaml

`promote` swaps a retrained model in only when it beats the current one on labelled traffic
(simulations.promotion.gate: the paired 95% bootstrap interval of the APGR gain above 0; `--force`
overrides): the labelled requests of `--traces` (a proxy trace folder with its labels, CSVs, JSONL),
the new model scored out of fold where `classifier train` wrote `<model>.oof.jsonl`, or without
`--traces` the comparison `train` recorded in the model's card. It then moves each affected
policy's threshold to its recorded target, else to keep its large share
(simulations.promotion.retune), writes the config atomically (router/commands/config_edit.py: a
watching proxy never reads half a file), keeps a
copy of the previous model beside the new one (`<new>.prev.onnx` and its card) and appends the
promotion to `<config>.promotions.json`, the history `rollback` pops. A running proxy picks the
change up on its next reload (file watch or SIGHUP; router/proxy/state.py loads the model off the
event loop and in-flight requests finish on the old one).

`--policy NAME` promotes into one policy only (`policies.NAME.model_path`): a canary that an A/B
experiment can compare live with the arm on the current model (`cost-router ab report`).

Exit status: 0 promoted (or rolled back); 1 refused by the gate, or a rollback the config no
longer matches; 2 bad input. Heavy imports (onnxruntime, the trace loader) happen inside.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import typer

from classifiers.config import DEFAULT_MODEL
from classifiers.oof import oof_path, read_scores
from classifiers.score_reference import REFERENCE_SUFFIX
from router.commands.common import fail, load_config_or_exit
from router.commands.config_edit import edit_config, write_atomically
from router.config import RouterConfig
from trace_format.config_base import ConfigError

if TYPE_CHECKING:
    from simulations.promotion import Retuned, Verdict
    from simulations.trace import ReplayTrace

HISTORY_SUFFIX = ".promotions.json"
# The settings of a policy a promotion may change, restored as they were by rollback.
POLICY_KEYS = ("model_path", "threshold", "target_large_share", "rescore", "tuned_for")


def history_path(config: Path) -> Path:
    """`router.yaml` -> `router.promotions.json`, beside the config."""
    return config.with_name(config.stem + HISTORY_SUFFIX)


def prev_path(model: Path) -> Path:
    """Where the model a promotion replaced is kept: `new.onnx` -> `new.prev.onnx`."""
    return model.with_name(model.stem + ".prev.onnx")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _copy_model(src: Path, dst: Path) -> None:
    """The model and its sidecars (card, training prompts, drift reference) to `dst`, each
    replaced atomically."""
    for suffix in (".onnx", ".json", ".prompts", REFERENCE_SUFFIX):
        s, d = src.with_name(src.stem + suffix), dst.with_name(dst.stem + suffix)
        if not s.is_file():
            d.unlink(missing_ok=True)  # a sidecar left by an earlier copy is not this model's
        else:
            fd, tmp = tempfile.mkstemp(dir=d.parent, prefix=f".{d.name}.", suffix=".tmp")
            os.close(fd)
            shutil.copyfile(s, tmp)
            os.replace(tmp, d)


def _model_file(setting: str | None) -> Path:
    return (Path(setting) if setting else DEFAULT_MODEL).resolve()


@dataclass(frozen=True)
class Scope:
    """What a promotion replaces: the global classifier, or one policy's own model."""

    policy: str | None  # None: classifier.model_path

    @property
    def key(self) -> str:
        if self.policy is None:
            return "classifier.model_path"
        return f"policies.{self.policy}.model_path"

    def setting(self, cfg: RouterConfig) -> str | None:
        """The model path in force for the scope (a policy without its own: the global one)."""
        if self.policy is not None and cfg.policies[self.policy].model_path is not None:
            return cfg.policies[self.policy].model_path
        return cfg.classifier.model_path

    def own_setting(self, data: dict[str, Any]) -> str | None:
        """The scope's own key in the YAML document (None when unset)."""
        if self.policy is None:
            return (data.get("classifier") or {}).get("model_path")
        return ((data.get("policies") or {}).get(self.policy) or {}).get("model_path")

    def set(self, data: dict[str, Any], value: str | None) -> None:
        if self.policy is None:
            section = data.get("classifier") or {}
            data["classifier"] = section
        else:
            section = data["policies"][self.policy]
        if value is None:
            section.pop("model_path", None)
        else:
            section["model_path"] = value

    def policies(self, cfg: RouterConfig) -> list[str]:
        """The policies whose scores the swap changes."""
        if self.policy is not None:
            return [self.policy]
        return [n for n, p in cfg.policies.items() if p.model_path is None]


@dataclass(frozen=True)
class Labelled:
    """The labelled requests the gate compares on: both models' scores and the outcomes."""

    current: np.ndarray
    new: np.ndarray
    small: np.ndarray | None  # None: scores only (the card's recorded comparison)
    large: np.ndarray | None
    notes: list[str]
    trace: ReplayTrace | None = None  # the requests compared on (for targets needing outcomes)
    source: str = ""  # how the new model's scores were got, for the gate's message


def _labelled_from_traces(
    traces: list[Path], cfg: RouterConfig, current_model: Path, new_model: Path
) -> Labelled:
    """Score the traces' labelled requests with both models: the new one out of fold where its
    `.oof.jsonl` has the request, else directly, leaving out requests it was trained on."""
    # onnxruntime and the trace loader load for this command only.
    from classifiers.inference import DifficultyScorer, ModelLoadError
    from classifiers.provenance import in_sample_note, read_prompts
    from classifiers.provenance import prompt_hashes as _hashes
    from simulations.trace import LARGE, SMALL, TraceError
    from simulations.trace_loader import load_labelled_trace

    try:
        trace, notes = load_labelled_trace(list(traces), context_turns=cfg.classifier.context_turns)
        current_scorer = DifficultyScorer.load(current_model)
        new_scorer = DifficultyScorer.load(new_model)
    except (TraceError, ModelLoadError) as exc:
        raise fail(str(exc)) from None
    ids = trace.units()
    oof: dict[str, float] = {}
    if oof_path(new_model).is_file():
        try:
            oof = read_scores(oof_path(new_model))
        except ValueError as exc:
            raise fail(str(exc)) from None
    trained = read_prompts(new_model)
    keep, new = [], []
    direct = [i for i, rid in enumerate(ids) if rid not in oof]
    direct_scores = dict(
        zip(direct, new_scorer.score_texts([trace.texts[i] for i in direct]), strict=True)
    )
    in_sample = 0
    for i, rid in enumerate(ids):
        if rid in oof:
            keep.append(i)
            new.append(oof[rid])
        elif trained is not None and np.isin(_hashes([trace.texts[i]]), trained).any():
            in_sample += 1  # the new model fit this prompt and has no out-of-fold score for it
        else:
            keep.append(i)
            new.append(direct_scores[i])
    if in_sample:
        notes.append(
            f"note: left out {in_sample} labelled requests the new model was trained "
            "on and has no out-of-fold score for"
        )
    if not keep:
        raise fail(
            f"no labelled request to compare on in {', '.join(map(str, traces))} "
            "(every one is among the new model's training prompts)"
        )
    sub = trace.take(np.asarray(keep))
    if note := in_sample_note(current_model, sub.texts, "the current model's figures"):
        notes.append(note)
    current = current_scorer.score_texts(sub.texts)
    quality = sub.require_quality()
    from_oof = sum(1 for i in keep if ids[i] in oof)
    source = (
        "paired bootstrap; new model out of fold"
        if from_oof == len(keep)
        else f"paired bootstrap; new model out of fold on {from_oof}, scored directly on "
        f"{len(keep) - from_oof} it was not trained on"
    )
    return Labelled(
        current,
        np.asarray(new, np.float64),
        quality[:, SMALL],
        quality[:, LARGE],
        notes,
        sub,
        source,
    )


def _labelled_from_card(new_model: Path, current_model: Path) -> tuple[Labelled, Verdict]:
    """Without --traces: the comparison `classifier train` recorded, and the `.oof.jsonl` scores
    of both models (for the large share), provided it was made against the current model."""
    from simulations.promotion import recorded_verdict

    card_path = new_model.with_suffix(".json")
    try:
        card = orjson.loads(card_path.read_bytes())
        recorded = card["out_of_fold"]
        against = _model_file(str(recorded["current_model"]))
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        raise fail(
            f"{new_model}: no out-of-fold comparison in {card_path.name} (train it with "
            "--folds, or pass --traces with labelled requests)"
        ) from None
    if against != current_model:
        raise fail(
            f"{card_path.name} compares with {against}, not the model in use "
            f"({current_model}): pass --traces to compare on labelled requests"
        )
    try:
        verdict = recorded_verdict(recorded, card_path.name)
        scores = oof_path(new_model)
        new, current = read_scores(scores), read_scores(scores, "current_score")
    except ValueError as exc:
        raise fail(str(exc)) from None
    ids = list(new)
    return (
        Labelled(
            np.array([current[i] for i in ids]), np.array([new[i] for i in ids]), None, None, []
        ),
        verdict,
    )


def _retune(
    cfg: RouterConfig, names: list[str], labelled: Labelled, data: dict[str, Any]
) -> tuple[list[Retuned], list[str], dict[str, dict[str, Any]]]:
    """New thresholds for the policies the swap affects; edits `data` (the YAML document).
    Returns the changes, notes, and each edited policy's settings before the edit."""
    from policies.base import Tunable
    from policies.registry import build_policies
    from policies.spec import TunedFor
    from simulations.promotion import retune
    from simulations.replay import ReplayError, sweep_inputs
    from simulations.tune import Target, TuneError

    try:
        built = build_policies(cfg.policies, cfg.policy_env())
    except ConfigError as exc:
        raise fail(str(exc)) from None
    changes, notes, before = [], [], {}
    if not cfg.policies:
        notes.append(
            "note: no policies configured: the built-in default policy takes the new "
            "model's card threshold"
        )
    doc_policies = data.get("policies") or {}
    for name in names:
        entry = doc_policies.get(name)
        policy = built[name]
        if not isinstance(entry, dict):
            notes.append(
                f"note: policies.{name} is not in the file (set by the environment?): "
                "its threshold is left as it is"
            )
            continue
        before[name] = {k: entry[k] for k in POLICY_KEYS if k in entry}
        if not isinstance(policy, Tunable):
            notes.append(
                f"note: policies.{name} ({cfg.policies[name].type}) has no single "
                "threshold: left as it is; check it with `cost-router simulate`"
            )
            continue
        if entry.get("target_large_share") is not None:
            # The share is converted on each load from the reference trace's scores; those must
            # be the new model's.
            if not entry.get("rescore"):
                entry["rescore"] = True
            notes.append(
                f"policies.{name}: keeps target_large_share "
                f"{entry['target_large_share']}, converted with the new model's scores "
                "of its reference_trace (rescore: true)"
            )
            continue
        target = None
        if entry.get("tuned_for") is not None:
            tuned = TunedFor.model_validate(entry["tuned_for"])  # validated with the config
            target = Target(tuned.kind, tuned.value)
        inputs = None
        if labelled.trace is not None and target is not None and target.kind != "large_share":
            try:
                prices = {t.name: t.price for t in cfg.tiers}
                inputs = sweep_inputs(prices, labelled.trace, labelled.new, policy)
            except ReplayError as exc:
                raise fail(f"policies.{name}: cannot re-tune to its target: {exc}") from None
        try:
            result = retune(name, policy.threshold, labelled.current, labelled.new, target, inputs)
        except (TuneError, ValueError) as exc:
            raise fail(str(exc)) from None
        entry["threshold"] = result.after
        changes.append(result)
    return changes, notes, before


def _read_history(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    try:
        data = orjson.loads(path.read_bytes())
        entries = data["promotions"]
        assert isinstance(entries, list)
        return entries
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AssertionError):
        raise fail(f'{path}: not a promotion history (expected {{"promotions": [...]}})') from None


def _write_history(path: Path, entries: list[dict[str, Any]]) -> None:
    write_atomically(path, orjson.dumps({"promotions": entries}, option=orjson.OPT_INDENT_2))


def promote_cmd(
    model: Path = typer.Argument(..., help="the new .onnx model (e.g. from `classifier train`)"),
    config: Path = typer.Option(..., "--config", "-c", help="the router YAML to promote into"),
    traces: list[Path] | None = typer.Option(
        None,
        "--traces",
        "-t",
        help="labelled requests to compare on (a proxy trace folder with labels, CSV, JSONL); "
        "default: the comparison `classifier train` recorded in the model's card",
    ),
    policy: str | None = typer.Option(
        None, "--policy", "-p", help="promote into this policy only (a canary), not the classifier"
    ),
    force: bool = typer.Option(False, "--force", help="promote even if not shown better"),
    rounds: int = typer.Option(1000, "--bootstrap", min=10, help="bootstrap resamples"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed"),
) -> None:
    """Swap in a new model if it beats the current one on labelled traffic (paired bootstrap
    interval of the APGR gain above 0), re-tune thresholds, keep the old model for rollback."""
    from simulations.promotion import gate

    cfg = load_config_or_exit(config)
    if policy is not None and policy not in cfg.policies:
        raise fail(f"--policy {policy}: no such policy in {config} (known: {sorted(cfg.policies)})")
    scope = Scope(policy)
    new_model = model.resolve()
    if new_model.suffix != ".onnx" or not new_model.is_file():
        raise fail(f"{model}: no such .onnx file")
    current_model = _model_file(scope.setting(cfg))
    if current_model == new_model:
        raise fail(f"{model} is already the model of {scope.key}")
    if traces:
        labelled = _labelled_from_traces(traces, cfg, current_model, new_model)
        assert labelled.small is not None and labelled.large is not None
        verdict = gate(
            labelled.current,
            labelled.new,
            labelled.small,
            labelled.large,
            rounds,
            seed,
            labelled.source,
        )
    else:
        labelled, verdict = _labelled_from_card(new_model, current_model)
    for note in labelled.notes:
        typer.echo(note, err=True)
    if not verdict.promote and not force:
        typer.echo(f"refused: {verdict.reason()} (--force promotes anyway)", err=True)
        raise typer.Exit(1)
    typer.echo(verdict.reason() if verdict.promote else f"forced: {verdict.reason()}")

    saved = prev_path(new_model)
    hist = history_path(config)
    history = _read_history(hist)  # before anything is written: a bad history changes nothing
    record: dict[str, Any] = {}

    def edit(data: dict[str, Any]) -> None:
        changes, notes, before = _retune(cfg, scope.policies(cfg), labelled, data)
        own = scope.own_setting(data)
        scope.set(data, str(new_model))
        record.update(
            time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            scope=scope.key,
            model=str(new_model),
            model_sha256=sha256(new_model),
            previous={
                "setting": own,
                "file": str(current_model),
                "sha256": sha256(current_model),
                "saved": str(saved),
            },
            policies=before,
            gate={
                "promote": verdict.promote,
                "forced": not verdict.promote,
                "n": verdict.n,
                "apgr_gain": [verdict.delta.value, verdict.delta.low, verdict.delta.high],
                "source": verdict.source,
            },
        )
        for line in [*notes, *(c.line() for c in changes)]:
            typer.echo(line)
        _copy_model(current_model, saved)  # before the config names the new model

    try:
        edit_config(config, edit)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        typer.echo(f"error: promote: {exc}", err=True)
        raise typer.Exit(1) from None
    _write_history(hist, [*history, record])
    typer.echo(
        f"promoted {new_model} as {scope.key} in {config}; previous model kept as {saved} "
        f"(`cost-router classifier rollback --config {config}` restores it); a running "
        "proxy picks it up on its next reload"
    )


def rollback_cmd(
    config: Path = typer.Option(..., "--config", "-c", help="the router YAML promoted into"),
    force: bool = typer.Option(
        False, "--force", help="roll back even if the config was edited since the promotion"
    ),
) -> None:
    """Undo the last `classifier promote` into CONFIG: its model and thresholds as before."""
    cfg = load_config_or_exit(config)
    hist = history_path(config)
    entries = _read_history(hist)
    if not entries:
        raise fail(f"no promotion recorded for {config} ({hist} has none)")
    last = entries[-1]
    key = str(last.get("scope", "classifier.model_path"))
    policy = key.split(".")[1] if key.startswith("policies.") else None
    if policy is not None and policy not in cfg.policies:
        raise fail(f"{hist}: the last promotion was into {key}, which {config} no longer has")
    scope = Scope(policy)
    in_use = _model_file(scope.setting(cfg))
    if in_use != Path(last["model"]) and not force:
        typer.echo(
            f"error: {key} is {in_use}, not the promoted {last['model']}: the config was "
            "edited since; --force rolls back anyway",
            err=True,
        )
        raise typer.Exit(1)
    previous = last["previous"]
    restore = previous["setting"]
    file, saved = Path(previous["file"]), Path(previous["saved"])
    if not (file.is_file() and sha256(file) == previous["sha256"]):
        if not (saved.is_file() and sha256(saved) == previous["sha256"]):
            typer.echo(
                f"error: the previous model is gone: {file} changed and its copy {saved} "
                "is missing or changed",
                err=True,
            )
            raise typer.Exit(1)
        typer.echo(f"note: {file} changed since the promotion; restoring its copy {saved}")
        restore = str(saved)

    def edit(data: dict[str, Any]) -> None:
        scope.set(data, restore)
        for name, settings in (last.get("policies") or {}).items():
            entry = (data.get("policies") or {}).get(name)
            if not isinstance(entry, dict):
                continue
            for k in POLICY_KEYS:
                if k == "model_path" and name == policy:
                    continue  # the scope's own key, restored above
                if k in settings:
                    entry[k] = settings[k]
                else:
                    entry.pop(k, None)
            typer.echo(
                f"policies.{name}: "
                + (
                    ", ".join(f"{k} {v}" for k, v in settings.items() if k != "model_path")
                    or "restored"
                )
            )

    try:
        edit_config(config, edit)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    _write_history(hist, entries[:-1])
    typer.echo(
        f"rolled back {key} to {restore or 'the shipped model'} in {config}; a running "
        "proxy picks it up on its next reload"
    )
