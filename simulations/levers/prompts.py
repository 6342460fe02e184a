"""The prompts a lever trial replays, read through the one loader (classifiers/dataset.py: a
trace folder or file, RouteLLM CSVs), with a gold answer where the data has one.

Gold answers: the RouteLLM CSVs mark each model's answer correct or not and keep the answer
text, so on GSM8K a correct answer's text carries the gold number (its last number, which is
how the `reference` judge reads it in numeric mode). The small model's answer is preferred
(GSM8K-style "#### 18" endings), then the large one's. Rows where neither was right, and every
trace record, have none; they are judged by the `llm` judge when one is configured.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from classifiers.dataset import DatasetError, RoutingDataset, load_dataset
from trace_format.jsonl import read_objects
from trace_format.reader import data_files, is_trace_file


class NoPromptsError(DatasetError):
    """The data holds no prompt text to replay (a trace written with content logging off)."""


@dataclass(frozen=True, slots=True)
class TrialPrompt:
    id: str  # the loader's request id: a trace record's id or "<CSV path>:<row>"
    text: str  # sent as the one user message
    reference: str | None  # text whose last number is the gold answer (module docstring)
    source: str  # benchmark or trace stem


def _reference(ds: RoutingDataset, i: int) -> str | None:
    for outcome, responses in ((ds.small, ds.small_responses), (ds.large, ds.large_responses)):
        if responses is not None and outcome[i] == 1.0 and responses[i].strip():
            return responses[i]
    return None


def _trace_references(paths: Iterable[Path]) -> dict[str, str]:
    """`metadata.reference_answer` of each trace record that has one, by request id."""
    out: dict[str, str] = {}
    for path in paths:
        for f in data_files(path):
            if not is_trace_file(f):
                continue
            for rec in read_objects(f):
                meta, rid = rec.get("metadata"), rec.get("id")
                ref = meta.get("reference_answer") if isinstance(meta, dict) else None
                usable = isinstance(ref, str | int | float) and not isinstance(ref, bool)
                if isinstance(rid, str) and usable and str(ref).strip():
                    out[rid] = str(ref)
    return out


def load_prompts(
    paths: Iterable[str | Path], n: int | None = None, seed: int = 0
) -> list[TrialPrompt]:
    """Up to `n` prompts with text, a seeded sample across every file (the same `seed` and data
    give the same prompts, so a rerun resumes on the same ones); raises NoPromptsError when
    there is none, DatasetError on unreadable data."""
    paths = [Path(p) for p in paths]
    ds = load_dataset(paths, require_outcomes=False)
    keep = [i for i, text in enumerate(ds.prompts) if text.strip()]
    if not keep:
        where = ", ".join(ds.files) or ", ".join(map(str, paths))
        raise NoPromptsError(
            f"{where}: no prompt text in {len(ds)} records (traces written with content "
            "logging off record no prompt: set traces.include_prompt to record them)"
        )
    order = np.random.default_rng(seed).permutation(len(keep))
    chosen = sorted(keep[j] for j in (order if n is None else order[:n]))
    traced = _trace_references(paths)
    return [
        TrialPrompt(
            ds.ids[i],
            ds.prompts[i],
            _reference(ds, i) or traced.get(ds.ids[i]),
            str(ds.source[i]),
        )
        for i in chosen
    ]
