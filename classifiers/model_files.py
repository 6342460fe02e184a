"""A classifier model on disk: which `.onnx` file a setting names, and the files kept beside it.

`model_file(setting)` is the one answer to "the configured model, or the shipped one". A
`ModelFiles` names a model's sidecars, so no caller rebuilds their names by hand:

| file | what | written by |
|---|---|---|
| `<model>.onnx` | the graph | `classifier train` (classifiers/export.py) |
| `<model>.json` | the card: metadata, class values, training record | export, train |
| `<model>.scores.json` | reference score distribution (drift gauges) | train, drift reference |
| `<model>.prompts` | hashes of the training prompts (in-sample checks) | train |
| `<model>.oof.jsonl` | out-of-fold scores of the labelled requests | train |
| `<model>.prev.onnx` (+ its sidecars) | the model a promotion replaced | `classifier promote` |
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from classifiers.config import DEFAULT_MODEL

CARD_SUFFIX = ".json"
REFERENCE_SUFFIX = ".scores.json"
PROMPTS_SUFFIX = ".prompts"
OOF_SUFFIX = ".oof.jsonl"
PREV_STEM = ".prev"


def model_file(setting: str | Path | None) -> Path:
    """The `.onnx` file a `model_path` setting names (None or empty: the shipped model),
    resolved."""
    return (Path(setting) if setting else DEFAULT_MODEL).resolve()


@dataclass(frozen=True)
class ModelFiles:
    """A model's `.onnx` file and the names of its sidecars (they need not exist)."""

    onnx: Path

    @classmethod
    def of(cls, setting: str | Path | None) -> ModelFiles:
        """The files of the model a setting names (None: the shipped model)."""
        return cls(model_file(setting))

    def _beside(self, suffix: str) -> Path:
        return self.onnx.with_name(self.onnx.stem + suffix)

    @property
    def card(self) -> Path:
        return self._beside(CARD_SUFFIX)

    @property
    def scores(self) -> Path:
        """The reference score distribution (classifiers/score_reference.py)."""
        return self._beside(REFERENCE_SUFFIX)

    @property
    def prompts(self) -> Path:
        """The training prompts' hashes (classifiers/provenance.py)."""
        return self._beside(PROMPTS_SUFFIX)

    @property
    def oof(self) -> Path:
        """The out-of-fold scores (classifiers/oof.py)."""
        return self._beside(OOF_SUFFIX)

    @property
    def prev(self) -> ModelFiles:
        """Where the model a promotion replaced is kept: `new.onnx` -> `new.prev.onnx`."""
        return ModelFiles(self._beside(PREV_STEM + ".onnx"))

    def kept(self) -> tuple[Path, ...]:
        """The files that travel with the model when it is copied (the out-of-fold scores are
        about its training run, not the model, and stay behind)."""
        return (self.onnx, self.card, self.prompts, self.scores)

    def copy_to(self, dst: ModelFiles) -> None:
        """The model and the sidecars it travels with to `dst`, each replaced atomically; a
        sidecar `dst` has but this model lacks is removed (it would not be this model's)."""
        for src_file, dst_file in zip(self.kept(), dst.kept(), strict=True):
            if not src_file.is_file():
                dst_file.unlink(missing_ok=True)
                continue
            fd, tmp = tempfile.mkstemp(
                dir=dst_file.parent, prefix=f".{dst_file.name}.", suffix=".tmp"
            )
            os.close(fd)
            shutil.copyfile(src_file, tmp)
            os.replace(tmp, dst_file)
