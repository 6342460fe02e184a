"""Which prompts a model was trained on, by content: a sidecar of prompt hashes beside the model.

`classifier eval`, `tune` and `simulate` warn when the prompts they score overlap the model's
training prompts, whatever path the data came from (a copy of the training CSV, a trace of the
same benchmark, the shipped model's own data). Each prompt is hashed after the model's own
cleaning and normalisation (classifiers.features: lowercased, whitespace collapsed), so a prompt
differing only in case or spacing still counts as seen.

Format: `<model>.prompts` (`ModelFiles.prompts`), the sorted distinct 64-bit
BLAKE2b digests of the training prompts as little-endian uint64, 8 bytes each; for 10,685 prompts
85 KB. A 64-bit digest makes a false match between two different prompts about n^2 / 2^64: none
in practice. Imports numpy and the standard library only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from classifiers.features import clean_text, normalize_text
from classifiers.model_files import ModelFiles

HASH_NAME = "blake2b-64 of the normalized prompt (classifiers/provenance.py)"


def digests(texts: Iterable[str]) -> np.ndarray:
    """One uint64 digest per text, of the text as the model sees it."""
    return np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(normalize_text(clean_text(t)).encode(), digest_size=8).digest(),
                "little",
            )
            for t in texts
        ),
        dtype=np.uint64,
    )


def prompt_hashes(texts: Iterable[str]) -> np.ndarray:
    """Sorted distinct uint64 digests of the texts."""
    return np.unique(digests(texts))


def write_prompts(model_path: str | Path, texts: Iterable[str]) -> Path:
    """Write the sidecar of the model at `model_path`; returns its path."""
    path = ModelFiles(Path(model_path)).prompts
    path.write_bytes(prompt_hashes(texts).astype("<u8").tobytes())
    return path


def read_prompts(model_path: str | Path) -> np.ndarray | None:
    """The model's training prompt digests, or None when it has no (readable) sidecar."""
    path = ModelFiles(Path(model_path)).prompts
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) % 8:
        return None
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


@dataclass(frozen=True)
class Overlap:
    """How many of `total` scored prompts are among the model's training prompts."""

    seen: int
    total: int
    known: bool  # False: the model has no sidecar, so overlap cannot be told

    @property
    def share(self) -> float:
        return self.seen / self.total if self.total else 0.0


def overlap(model_path: str | Path, texts: list[str]) -> Overlap:
    """Overlap of `texts` with the training prompts of the model at `model_path`."""
    trained = read_prompts(model_path)
    if trained is None:
        return Overlap(0, len(texts), False)
    # Replayed traces repeat prompts (synthetic ones a lot): hash each distinct text once.
    distinct = list(dict.fromkeys(texts))
    seen = dict(zip(distinct, np.isin(digests(distinct), trained).tolist(), strict=True))
    return Overlap(sum(seen[t] for t in texts), len(texts), True)


def in_sample_note(
    model_path: str | Path, texts: list[str], what: str = "these figures"
) -> str | None:
    """A one-line warning when the texts overlap the model's training prompts, else None."""
    found = overlap(model_path, texts)
    if not found.seen:
        return None
    return (
        f"note: {found.seen} of {found.total} prompts ({found.share:.0%}) are among the training "
        f"prompts of {Path(model_path).name}, so {what} are in-sample (optimistic); score "
        "held-out data, or use out-of-fold scores (`classifier train` writes <model>.oof.jsonl)"
    )
