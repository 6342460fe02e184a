"""The classifier models requests are scored with, loaded once per distinct file.

The global model (`classifier.model_path`) and each policy's own (`policies.<name>.model_path`,
a canary). A reload (router/proxy/build.py `build_routing`, run off the event loop) reuses a
loaded scorer while its file is unchanged (same stat of the .onnx and of its card) and loads the
ones that are new or replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from classifiers.inference import DifficultyScorer, ModelLoadError
from classifiers.model_files import ModelFiles, model_file
from router.config import RouterConfig


class Scorer(Protocol):
    def score_request(self, body: Mapping[str, Any], context_turns: int | None = None) -> float: ...


# A model file's identity: (mtime_ns, size, inode) of the .onnx and of its card (class values
# live there), so a file replaced in place (os.replace: new inode) is loaded again on reload.
FileStamp = tuple[tuple[int, int, int] | None, tuple[int, int, int] | None]


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def file_stamp(path: Path) -> FileStamp:
    return (_stat(path), _stat(ModelFiles(path).card))


@dataclass(frozen=True)
class LoadedModel:
    stamp: FileStamp
    scorer: Scorer


@dataclass(frozen=True)
class Scorers:
    """The classifier models requests are scored with: `default` (`classifier.model_path`) and
    the policies that name their own model (`policies.<name>.model_path`)."""

    default: Scorer
    policies: Mapping[str, Scorer] = field(default_factory=dict)
    # Every loaded file, for reuse by the next reload.
    files: Mapping[Path, LoadedModel] = field(default_factory=dict)

    def for_policy(self, name: str | None) -> Scorer:
        return self.policies.get(name, self.default) if name is not None else self.default


def load_scorers(config: RouterConfig, previous: Scorers | None = None) -> Scorers:
    """Load the config's classifier models (blocking: run it off the event loop). A file that
    `previous` loaded and that has not changed since is reused. Raises ModelLoadError naming
    the config key."""
    known = dict(previous.files) if previous is not None else {}
    files: dict[Path, LoadedModel] = {}

    def load(setting: str | None, key: str) -> Scorer:
        path = model_file(setting)
        if path in files:
            return files[path].scorer
        stamp = file_stamp(path)
        reused = known.get(path)
        if reused is not None and reused.stamp == stamp:
            files[path] = reused
            return reused.scorer
        try:
            scorer = DifficultyScorer.load(path)
        except ModelLoadError as exc:
            raise ModelLoadError(f"{key}: {exc}") from None
        files[path] = LoadedModel(stamp, scorer)
        return scorer

    main = load(config.classifier.model_path, "classifier.model_path")
    own = {
        name: load(policy.model_path, f"policies.{name}.model_path")
        for name, policy in config.policies.items()
        if policy.model_path is not None
    }
    return Scorers(main, own, files)
