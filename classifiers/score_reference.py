"""The reference score distribution: what a model's scores looked like when its threshold was
tuned, kept beside the model as `<model>.scores.json` (`ModelFiles.scores`,
classifiers/model_files.py), so live traffic and `drift report` can say
how far today's scores have moved from it.

One owner writes it: `cost-router drift reference` (router/commands/drift.py) builds it from a
trace folder, a Parquet dataset or an out-of-fold scores file (`<model>.oof.jsonl`, written by
`classifier train`), by default beside the configured model. Readers: the proxy's live drift
gauges and `cost-router drift report` (`--reference FILE`, else `<model>.scores.json`).

Format (JSON, version 1): ``{"schema_version": 1, "bins": B, "counts": [B ints], "n": int,
"source": str, "model": str, "created": UNIX s}``. The bins are fixed: B equal-width bins over
[0, 1] (bin i holds scores in [i/B, (i+1)/B), the last also 1.0), so a reference and any window
of live scores are histograms over the same edges, and two references can be compared. B is
1,000 by default: fine enough for a two-sample KS test and a threshold at 0.001 resolution;
PSI uses a coarser view (`coarse`, 20 bins) where each bin holds enough scores to be stable.

Numpy and the standard library only (the proxy loads it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

REFERENCE_SCHEMA_VERSION = 1
DEFAULT_BINS = 1000
PSI_BINS = 20


class ScoreReferenceError(ValueError):
    """A reference file that cannot be read or is not a valid reference; the message names it."""


def bin_counts(scores: np.ndarray, bins: int = DEFAULT_BINS) -> np.ndarray:
    """Counts of scores per fixed bin; scores outside [0, 1] are clipped into the end bins (a
    score is a probability; a value just outside is rounding, not a new category)."""
    values = np.clip(np.asarray(scores, dtype=np.float64).ravel(), 0.0, 1.0)
    index = np.minimum((values * bins).astype(np.int64), bins - 1)
    return np.bincount(index, minlength=bins).astype(np.int64)


def rebin(counts: np.ndarray, bins: int) -> np.ndarray:
    """Counts over `bins` coarser equal-width bins; `bins` must divide the current number."""
    counts = np.asarray(counts, dtype=np.int64)
    if len(counts) % bins:
        raise ValueError(f"cannot merge {len(counts)} bins into {bins}")
    return counts.reshape(bins, -1).sum(axis=1)


def quantile_from_counts(counts: np.ndarray, share_above: float) -> float:
    """Score t with about `share_above` of the histogram's mass at or above it (linear within a
    bin): the threshold that sends that share large, read from binned scores."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        raise ValueError("no scores to take a quantile of")
    bins = len(counts)
    # Mass at or above the lower edge of each bin, from the top.
    above = np.cumsum(counts[::-1])[::-1]
    target = share_above * total
    if target <= 0:
        return 1.0
    i = int(np.flatnonzero(above >= target)[-1])  # highest bin whose lower edge has >= target
    inside = counts[i]
    over = above[i] - inside  # mass strictly above bin i
    frac = 0.0 if inside == 0 else (target - over) / inside  # part of bin i needed, from its top
    return float((i + 1 - frac) / bins)


@dataclass(frozen=True)
class ScoreReference:
    counts: np.ndarray  # per fixed bin over [0, 1]
    source: str  # what the scores came from: a trace folder, an oof file, a dataset URI
    model: str = ""  # the model that produced the scores
    created: float = field(default_factory=time.time)

    @property
    def bins(self) -> int:
        return len(self.counts)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def from_scores(
        cls, scores: np.ndarray, source: str, model: str = "", bins: int = DEFAULT_BINS
    ) -> ScoreReference:
        counts = bin_counts(scores, bins)
        if counts.sum() == 0:
            raise ScoreReferenceError(f"no scores in {source} to build a reference from")
        return cls(counts=counts, source=source, model=model)

    def coarse(self, bins: int = PSI_BINS) -> np.ndarray:
        return rebin(self.counts, bins)

    def share_at_or_above(self, threshold: float) -> float:
        """Share of reference scores >= threshold (bin resolution)."""
        start = int(np.ceil(np.clip(threshold, 0.0, 1.0) * self.bins - 1e-9))
        return float(self.counts[start:].sum() / max(self.n, 1))

    def as_dict(self) -> dict[str, object]:
        return {
            "schema_version": REFERENCE_SCHEMA_VERSION,
            "bins": self.bins,
            "counts": self.counts.tolist(),
            "n": self.n,
            "source": self.source,
            "model": self.model,
            "created": self.created,
        }

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_bytes(orjson.dumps(self.as_dict(), option=orjson.OPT_INDENT_2) + b"\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> ScoreReference:
        """Read a reference file; raises ScoreReferenceError naming the file and what is wrong."""
        p = Path(path)
        try:
            data = orjson.loads(p.read_bytes())
        except OSError as exc:
            raise ScoreReferenceError(f"cannot read reference {p}: {exc.strerror}") from None
        except orjson.JSONDecodeError as exc:
            raise ScoreReferenceError(f"{p}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ScoreReferenceError(f"{p}: expected a JSON object")
        version = data.get("schema_version")
        if version != REFERENCE_SCHEMA_VERSION:
            raise ScoreReferenceError(
                f"{p}: schema_version {version!r} is not {REFERENCE_SCHEMA_VERSION}"
            )
        counts = data.get("counts")
        if (
            not isinstance(counts, list)
            or not counts
            or not all(isinstance(c, int) and c >= 0 for c in counts)
        ):
            raise ScoreReferenceError(f"{p}: 'counts' must be a non-empty list of counts >= 0")
        if data.get("bins", len(counts)) != len(counts):
            raise ScoreReferenceError(
                f"{p}: 'bins' is {data.get('bins')} but 'counts' has {len(counts)}"
            )
        if sum(counts) == 0:
            raise ScoreReferenceError(f"{p}: the reference holds no scores")
        created = data.get("created", 0.0)
        return cls(
            counts=np.asarray(counts, dtype=np.int64),
            source=str(data.get("source", "")),
            model=str(data.get("model", "")),
            created=float(created) if isinstance(created, int | float) else 0.0,
        )
