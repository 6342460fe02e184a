"""Promotion and rollback of classifier models: the learning loop's last step.

A promotion swaps a retrained model in only when it beats the current one on labelled traffic
(simulations.promotion.gate: the paired 95% bootstrap interval of the APGR gain above 0; `force`
overrides). `evaluate` labels the comparison: the labelled requests of some traces (a proxy trace
folder with its labels, CSVs, JSONL), the new model scored out of fold where `classifier train`
wrote `<model>.oof.jsonl`, or without traces the comparison `train` recorded in the model's card.
`promote` then moves each affected policy's threshold to its recorded target, else to keep its
large share (simulations.promotion.retune), has the config file edited (validated and replaced
atomically: a watching proxy never reads half a file), keeps a copy of the previous model beside
the new one (`<new>.prev.onnx` and its sidecars, classifiers/model_files.py) and appends the
promotion to `<config>.promotions.json`, the history `rollback` pops. A running proxy picks the
change up on its next reload.

A promotion's scope is the global classifier (`classifier.model_path`) or one policy's own model
(`policies.NAME.model_path`): a canary an A/B experiment can compare live with the current model.

Callers: `cost-router classifier promote|rollback` (router/commands/promote.py); the admin API
may expose the same functions. The config file is theirs to load and edit (router/config.py
composes this package's `evaluation:` section, so it sits above it): they pass the sections a
promotion reads and a `ConfigFile` that edits the YAML. Every failure is a `PromotionError`.
Heavy imports (onnxruntime, the trace loader, the replay) happen inside the functions.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from classifiers.config import ClassifierConfig
from classifiers.model_files import ModelFiles, model_file
from classifiers.oof import read_scores
from policies.config import PolicyConfig
from policies.spec import PolicyEnv
from trace_format.config_base import ConfigError

if TYPE_CHECKING:
    from simulations.promotion import Retuned, Verdict
    from simulations.trace import ReplayTrace

HISTORY_SUFFIX = ".promotions.json"
# The settings of a policy a promotion may change, restored as they were by rollback.
POLICY_KEYS = ("model_path", "threshold", "target_large_share", "rescore", "tuned_for")

Document = dict[str, Any]
Say = Callable[[str], None]


class PromotionError(Exception):
    """Why a promotion or rollback did not happen; the message names the file or key.

    `bad_input`: the input cannot be used (a missing model, an unknown policy, a config the edit
    makes invalid; the CLI exits 2); otherwise it could, and the answer is no (the gate refused,
    the config no longer matches the promotion, a file could not be written; exit 1).
    `forcible`: the same call with `force` would go ahead."""

    def __init__(self, message: str, *, bad_input: bool = True, forcible: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input
        self.forcible = forcible


@dataclass(frozen=True)
class RoutingSections:
    """The config sections a promotion reads: the classifier (its model, context turns), the
    policies, and what building them needs (`RouterConfig.policy_env()`: the tiers' prices)."""

    classifier: ClassifierConfig
    policies: Mapping[str, PolicyConfig]
    env: PolicyEnv


@dataclass(frozen=True)
class ConfigFile:
    """The router YAML a promotion changes, with the caller's means to change it.

    `edit(mutate)` applies `mutate` to the YAML document, validates the result as a whole and
    replaces the file atomically (router.config.edit_config bound to `path`), raising ConfigError
    (the file unchanged) or OSError; `write(path, data)` replaces a file atomically
    (router.config.write_atomically), for the promotion history beside the config."""

    path: Path
    edit: Callable[[Callable[[Document], None]], object]
    write: Callable[[Path, bytes], None]

    @property
    def history(self) -> Path:
        return history_path(self.path)


def history_path(config: Path) -> Path:
    """`router.yaml` -> `router.promotions.json`, beside the config."""
    return config.with_name(config.stem + HISTORY_SUFFIX)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Scope:
    """What a promotion replaces: the global classifier, or one policy's own model."""

    policy: str | None  # None: classifier.model_path

    @property
    def key(self) -> str:
        if self.policy is None:
            return "classifier.model_path"
        return f"policies.{self.policy}.model_path"

    def setting(self, sections: RoutingSections) -> str | None:
        """The model path in force for the scope (a policy without its own: the global one)."""
        if self.policy is not None and sections.policies[self.policy].model_path is not None:
            return sections.policies[self.policy].model_path
        return sections.classifier.model_path

    def own_setting(self, data: Document) -> str | None:
        """The scope's own key in the YAML document (None when unset)."""
        if self.policy is None:
            return (data.get("classifier") or {}).get("model_path")
        return ((data.get("policies") or {}).get(self.policy) or {}).get("model_path")

    def set(self, data: Document, value: str | None) -> None:
        if self.policy is None:
            section = data.get("classifier") or {}
            data["classifier"] = section
        else:
            section = data["policies"][self.policy]
        if value is None:
            section.pop("model_path", None)
            if self.policy is None and not section:
                # Restoring "no model_path" where the promotion added the section: the file
                # gets back its own shape, not a `classifier: {}` it never had.
                del data["classifier"]
        else:
            section["model_path"] = value

    def policies(self, sections: RoutingSections) -> list[str]:
        """The policies whose scores the swap changes."""
        if self.policy is not None:
            return [self.policy]
        return [n for n, p in sections.policies.items() if p.model_path is None]


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


@dataclass(frozen=True)
class Candidate:
    """A new model weighed against the one in use for a scope: what `promote` acts on."""

    sections: RoutingSections
    scope: Scope
    model: Path  # the new model, resolved
    current: Path  # the model in use for the scope, resolved
    labelled: Labelled
    verdict: Verdict

    @property
    def notes(self) -> list[str]:
        """What the caller should know about the comparison (requests left out, in-sample)."""
        return self.labelled.notes


@dataclass(frozen=True)
class Promoted:
    """A promotion done: the history entry appended, and where the previous model is kept."""

    scope: Scope
    model: Path
    saved: Path
    record: dict[str, Any]


@dataclass(frozen=True)
class RolledBack:
    """A rollback done: the scope's key and the model setting restored (None: the shipped
    model)."""

    key: str
    restored: str | None


def evaluate(
    model: Path,
    sections: RoutingSections,
    policy: str | None = None,
    traces: Sequence[Path] | None = None,
    rounds: int = 1000,
    seed: int = 0,
) -> Candidate:
    """Weigh `model` against the model in use for the scope (`policy`'s own, else the global
    classifier): on the labelled requests of `traces`, else on the comparison its card records.
    Raises PromotionError (bad input) when there is nothing to compare on."""
    from simulations.promotion import gate

    if policy is not None and policy not in sections.policies:
        raise PromotionError(
            f"policies.{policy}: no such policy (known: {sorted(sections.policies)})"
        )
    scope = Scope(policy)
    new_model = model.resolve()
    if new_model.suffix != ".onnx" or not new_model.is_file():
        raise PromotionError(f"{model}: no such .onnx file")
    current_model = model_file(scope.setting(sections))
    if current_model == new_model:
        raise PromotionError(f"{model} is already the model of {scope.key}")
    if traces:
        labelled = _labelled_from_traces(
            traces, sections.classifier.context_turns, current_model, new_model
        )
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
    return Candidate(sections, scope, new_model, current_model, labelled, verdict)


def promote(
    candidate: Candidate, config: ConfigFile, force: bool = False, say: Say = lambda _: None
) -> Promoted:
    """Swap the candidate in if the gate passed it (or `force`): re-tune the affected policies'
    thresholds, keep the previous model beside the new one, edit the config, append the history.
    `say` gets each line of what is done, as it is done (the verdict, each threshold moved).
    Raises PromotionError: the gate's refusal (forcible), bad input, or a file not written; the
    config is then as it was."""
    verdict, scope = candidate.verdict, candidate.scope
    if not verdict.promote and not force:
        raise PromotionError(verdict.reason(), bad_input=False, forcible=True)
    say(verdict.reason() if verdict.promote else f"forced: {verdict.reason()}")
    new_model, current_model = candidate.model, candidate.current
    saved = ModelFiles(new_model).prev
    history = _read_history(config.history)  # before anything is written: a bad one changes nothing
    record: dict[str, Any] = {}

    def mutate(data: Document) -> None:
        changes, notes, before = _retune(
            candidate.sections, scope.policies(candidate.sections), candidate.labelled, data
        )
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
                "saved": str(saved.onnx),
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
            say(line)
        ModelFiles(current_model).copy_to(saved)  # before the config names the new model

    try:
        _edit(config, mutate)
    except OSError as exc:
        raise PromotionError(f"promote: {exc}", bad_input=False) from None
    _write_history(config, [*history, record])
    return Promoted(scope, new_model, saved.onnx, record)


def rollback(
    sections: RoutingSections, config: ConfigFile, force: bool = False, say: Say = lambda _: None
) -> RolledBack:
    """Undo the last promotion recorded for the config: its model and thresholds as before.
    `say` gets each line of what is done. Raises PromotionError: nothing to undo or a history
    that names what the config no longer has (bad input); a config edited since the promotion
    (forcible), or a previous model that is gone. An OSError writing the files passes through."""
    hist = config.history
    entries = _read_history(hist)
    if not entries:
        raise PromotionError(f"no promotion recorded for {config.path} ({hist} has none)")
    last = entries[-1]
    key = str(last.get("scope", "classifier.model_path"))
    policy = key.split(".")[1] if key.startswith("policies.") else None
    if policy is not None and policy not in sections.policies:
        raise PromotionError(
            f"{hist}: the last promotion was into {key}, which {config.path} no longer has"
        )
    scope = Scope(policy)
    in_use = model_file(scope.setting(sections))
    if in_use != Path(last["model"]) and not force:
        raise PromotionError(
            f"{key} is {in_use}, not the promoted {last['model']}: the config was edited since",
            bad_input=False,
            forcible=True,
        )
    previous = last["previous"]
    restore = previous["setting"]
    file, saved = Path(previous["file"]), Path(previous["saved"])
    if not (file.is_file() and sha256(file) == previous["sha256"]):
        if not (saved.is_file() and sha256(saved) == previous["sha256"]):
            raise PromotionError(
                f"the previous model is gone: {file} changed and its copy {saved} "
                "is missing or changed",
                bad_input=False,
            )
        say(f"note: {file} changed since the promotion; restoring its copy {saved}")
        restore = str(saved)

    def mutate(data: Document) -> None:
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
            say(
                f"policies.{name}: "
                + (
                    ", ".join(f"{k} {v}" for k, v in settings.items() if k != "model_path")
                    or "restored"
                )
            )

    _edit(config, mutate)
    _write_history(config, entries[:-1])
    return RolledBack(key, restore)


def _edit(config: ConfigFile, mutate: Callable[[Document], None]) -> None:
    """The edit, with an edit the config's validation refuses as bad input."""
    try:
        config.edit(mutate)
    except ConfigError as exc:
        raise PromotionError(str(exc)) from None


def _labelled_from_traces(
    traces: Sequence[Path], context_turns: int, current_model: Path, new_model: Path
) -> Labelled:
    """Score the traces' labelled requests with both models: the new one out of fold where its
    `.oof.jsonl` has the request, else directly, leaving out requests it was trained on."""
    # onnxruntime and the trace loader load for promotion only.
    from classifiers.inference import DifficultyScorer, ModelLoadError
    from classifiers.provenance import in_sample_note, read_prompts
    from classifiers.provenance import prompt_hashes as _hashes
    from simulations.trace import LARGE, SMALL, TraceError
    from simulations.trace_loader import load_labelled_trace

    try:
        trace, notes = load_labelled_trace(list(traces), context_turns=context_turns)
        current_scorer = DifficultyScorer.load(current_model)
        new_scorer = DifficultyScorer.load(new_model)
    except (TraceError, ModelLoadError) as exc:
        raise PromotionError(str(exc)) from None
    ids = trace.units()
    oof: dict[str, float] = {}
    oof_file = ModelFiles(new_model).oof
    if oof_file.is_file():
        try:
            oof = read_scores(oof_file)
        except ValueError as exc:
            raise PromotionError(str(exc)) from None
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
        raise PromotionError(
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
    """Without traces: the comparison `classifier train` recorded, and the `.oof.jsonl` scores
    of both models (for the large share), provided it was made against the current model."""
    from simulations.promotion import recorded_verdict

    files = ModelFiles(new_model)
    card_path = files.card
    try:
        card = orjson.loads(card_path.read_bytes())
        recorded = card["out_of_fold"]
        against = model_file(str(recorded["current_model"]))
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        raise PromotionError(
            f"{new_model}: no out-of-fold comparison in {card_path.name} (train it with "
            "--folds, or pass --traces with labelled requests)"
        ) from None
    if against != current_model:
        raise PromotionError(
            f"{card_path.name} compares with {against}, not the model in use "
            f"({current_model}): pass --traces to compare on labelled requests"
        )
    try:
        verdict = recorded_verdict(recorded, card_path.name)
        new, current = read_scores(files.oof), read_scores(files.oof, "current_score")
    except ValueError as exc:
        raise PromotionError(str(exc)) from None
    ids = list(new)
    return (
        Labelled(
            np.array([current[i] for i in ids]), np.array([new[i] for i in ids]), None, None, []
        ),
        verdict,
    )


def _retune(
    sections: RoutingSections, names: list[str], labelled: Labelled, data: Document
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
        built = build_policies(sections.policies, sections.env)
    except ConfigError as exc:
        raise PromotionError(str(exc)) from None
    changes, notes, before = [], [], {}
    if not sections.policies:
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
                f"note: policies.{name} ({sections.policies[name].type}) has no single "
                "threshold: left as it is; check it with `cost-router simulate`"
            )
            continue
        if entry.get("target_large_share") is not None and not entry.get("reference_trace"):
            # Allowed only with calibrate: (policies/spec.py): the live calibrator holds the
            # share, there is no trace to rescore, and it starts from the threshold named here.
            start = (entry.get("calibrate") or {}).get("start_threshold")
            origin = (
                f"calibrate.start_threshold {start}"
                if start is not None
                else "the new model's card threshold"
            )
            notes.append(
                f"policies.{name}: keeps target_large_share {entry['target_large_share']}, "
                f"held on live traffic by calibrate (no reference_trace), starting from {origin}"
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
                inputs = sweep_inputs(sections.env.prices, labelled.trace, labelled.new, policy)
            except ReplayError as exc:
                raise PromotionError(
                    f"policies.{name}: cannot re-tune to its target: {exc}"
                ) from None
        try:
            result = retune(name, policy.threshold, labelled.current, labelled.new, target, inputs)
        except (TuneError, ValueError) as exc:
            raise PromotionError(str(exc)) from None
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
        raise PromotionError(
            f'{path}: not a promotion history (expected {{"promotions": [...]}})'
        ) from None


def _write_history(config: ConfigFile, entries: list[dict[str, Any]]) -> None:
    config.write(config.history, orjson.dumps({"promotions": entries}, option=orjson.OPT_INDENT_2))
