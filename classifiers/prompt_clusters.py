"""Clusters of prompts, for a workflow that is "prompts like these" rather than a team or a tag.

`cost-router distill clusters` fits k-means over the words of a distillation set's prompts
(classifiers/cluster_fit.py, scikit-learn) and writes it as one ONNX graph (tf-idf over the
text's character ids as the classifier's graph takes them, then the nearest centroid). The
export (`distill export --clusters F --cluster N`) and a policy's `workflows:` entry (`clusters:
{file: F, ids: [N]}`) select the same prompts through this module, so the rows a student was
trained on and the requests it is sent are one definition.

Request path: numpy and onnxruntime only, and it runs only for a request whose team and tags
already match a workflow that names clusters. The text is the last user turn (`cluster_text`),
cleaned and lowercased as the classifier's is, so fit, export and routing see the same words.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from classifiers.features import WORD_PATTERN, char_ids, clean_text, normalize_text
from classifiers.inference import _session
from trace_format.request_text import request_text

# The graph's input (character ids, classifiers.features.char_ids) and output (cluster ids), and
# the metadata key holding what `distill clusters` fitted.
INPUT = "ids"
OUTPUT = "cluster"
META_KEY = "cost_router_clusters"
FORMAT = "prompt-clusters/1"
WORD = re.compile(WORD_PATTERN)  # the words k-means saw
NO_CLUSTER = -1


class ClusterLoadError(RuntimeError):
    """The file is missing, unreadable, or not a cluster model `distill clusters` wrote."""


def cluster_text(body: Mapping[str, Any]) -> str:
    """The words a prompt is clustered by: its last user turn, cleaned and lowercased."""
    return normalize_text(clean_text(request_text(body, 0)))


class PromptClusters:
    """A fitted cluster model: `assign(texts)` gives each text's cluster id (NO_CLUSTER for a
    text without a single word the model knows of: it is like no cluster)."""

    def __init__(self, session: ort.InferenceSession, meta: Mapping[str, Any], path: Path) -> None:
        self._session = session
        self.path = path
        self.k = int(meta["k"])
        self.vocabulary = frozenset(meta.get("vocabulary", ()))
        self.sha256 = str(meta.get("sha256", ""))

    @classmethod
    def load(cls, path: str | Path) -> PromptClusters:
        path = Path(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ClusterLoadError(
                f"{path}: cannot read the cluster model ({exc.strerror})"
            ) from None
        try:
            session = _session(path, 1)  # the classifier's settings: one thread, sequential
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ClusterLoadError(f"{path}: not an ONNX model ({type(exc).__name__})") from None
        meta_text = session.get_modelmeta().custom_metadata_map.get(META_KEY)
        inputs = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        if meta_text is None or inputs != [INPUT] or outputs != [OUTPUT]:
            raise ClusterLoadError(
                f"{path}: not a prompt-cluster model (`cost-router distill clusters` writes one)"
            )
        meta = json.loads(meta_text)
        if meta.get("format") != FORMAT:
            raise ClusterLoadError(f"{path}: unknown cluster format {meta.get('format')!r}")
        meta["sha256"] = hashlib.sha256(raw).hexdigest()
        model = cls(session, meta, path)
        model.assign(["probe"])  # fail here, never at the first request
        return model

    def assign(self, texts: Sequence[str]) -> list[int]:
        """Cluster ids of already-normalized texts (`cluster_text`)."""
        if not texts:
            return []
        known = [any(w in self.vocabulary for w in WORD.findall(t)) for t in texts]
        labels = self._session.run([OUTPUT], {INPUT: char_ids(texts)})[0]
        return [int(c) if k else NO_CLUSTER for c, k in zip(labels, known, strict=True)]

    def of_body(self, body: Mapping[str, Any]) -> int:
        return self.assign([cluster_text(body)])[0]

    def describe(self) -> dict[str, Any]:
        return {"file": str(self.path), "sha256": self.sha256, "k": self.k}
