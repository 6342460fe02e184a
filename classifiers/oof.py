"""The out-of-fold scores file `<model>.oof.jsonl` (`ModelFiles.oof`, classifiers/model_files.py)
beside a model trained by `classifier train`
(classifiers/retrain.py): one line per labelled request, {"request_id", "score" (the new model's,
out of fold), "fold", "current_score" (the model it was compared with)}.

`tune --scores <file>` replays those scores instead of re-scoring with a model, so a threshold is
picked on scores the model did not fit. Imports orjson and the standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson

from trace_format.jsonl import jsonl_lines


def write_oof(
    path: Path,
    ids: Sequence[str],
    scores: Sequence[float],
    folds: Sequence[int],
    current: Sequence[float],
) -> None:
    with path.open("wb") as fh:
        for rid, score, fold, cur in zip(ids, scores, folds, current, strict=True):
            line = {"request_id": rid, "score": score, "fold": fold, "current_score": cur}
            fh.write(orjson.dumps(line) + b"\n")


def read_scores(path: str | Path, field: str = "score") -> dict[str, float]:
    """Scores by request id from a `.oof.jsonl` file (or any JSONL of {"request_id", field}).

    Raises ValueError naming the file and line for a line without both fields.
    """
    p = Path(path)
    try:
        lines = list(jsonl_lines(p))
    except OSError as exc:
        raise ValueError(f"cannot read scores {p}: {exc.strerror}") from None
    out: dict[str, float] = {}
    for line in lines:
        if line.blank:
            continue
        record = line.value or {}  # not a JSON object: as an object without the fields
        try:
            out[str(record["request_id"])] = float(record[field])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{p}: line {line.number}: expected an object with 'request_id' and a number "
                f"'{field}'"
            ) from None
    return out
