"""Probe (not shipped): would feeding the classifier graph integer ids instead of strings reach
the batch target of 20,000 prompts/s?

Rewrites the shipped model's graph in memory: each string Tokenizer + TfIdfVectorizer pair is
replaced by a TfIdfVectorizer over int64 pools fed by Python, characters as Unicode code points
(char 3-5-grams) and words as vocabulary ids (unknown words become the pad id, which is in no
n-gram). Everything downstream (idf, L2 norm, numeric features, linear model) is the shipped
graph unchanged, so the scores must equal the shipped string path exactly; the script checks that
on every shared prompt, then times both paths side by side (onnxruntime 1 thread), the Python
feed alone, and the graph alone with its per-operator split.

    .venv/bin/python benchmarks/classifier_ids_probe.py [--data DIR] [--batch 8000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from classifiers.dataset import load_dataset  # noqa: E402
from classifiers.features import (  # noqa: E402
    NUMERIC_FEATURES,
    NUMERIC_INPUTS,
    clean_text,
    is_multiple_choice,
    normalize_text,
    numeric_features,
)
from classifiers.inference import DEFAULT_MODEL, DifficultyScorer  # noqa: E402

PAD = -1  # no code point or vocabulary id is negative, so no n-gram contains it
WORD = re.compile(r"\w{2,}")  # scikit-learn's (?u)\w{2,}; the shipped graph uses its RE2 twin
Feed = dict[str, np.ndarray]


def id_graph(model_path: Path) -> tuple[bytes, dict[str, dict[str, int]]]:
    """The shipped graph with string ops swapped for int64 ones, and the word vocabularies."""
    model = onnx.load(str(model_path))
    graph = model.graph
    tokenized: dict[str, tuple[str, str]] = {}
    for node in graph.node:
        if node.op_type == "Tokenizer":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            kind = "chars" if attrs["tokenexp"] == b"." else "words"
            tokenized[node.output[0]] = (node.input[0].split("_")[0], kind)
    flattened = {n.output[0]: tokenized[n.input[0]] for n in graph.node if n.op_type == "Flatten"}
    vocab: dict[str, dict[str, int]] = {}
    nodes = []
    for node in graph.node:
        if node.op_type in ("Tokenizer", "Flatten"):
            continue
        if node.op_type == "TfIdfVectorizer":
            side, kind = flattened[node.input[0]]
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            grams = [s.decode() for s in attrs.pop("pool_strings")]
            if kind == "chars":
                attrs["pool_int64s"] = [ord(g) for g in grams]
            else:
                vocab[side] = {g: i for i, g in enumerate(grams)}
                attrs["pool_int64s"] = list(range(len(grams)))
            node = helper.make_node(
                "TfIdfVectorizer", [f"{side}_{kind}"], list(node.output), name=node.name, **attrs
            )
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [i for i in graph.input if i.name not in ("mc_text", "open_text")]
    del graph.input[:]
    graph.input.extend(kept)
    for side in ("mc", "open"):
        for kind in ("words", "chars"):
            graph.input.append(
                helper.make_tensor_value_info(f"{side}_{kind}", TensorProto.INT64, [None, None])
            )
    return model.SerializeToString(), vocab


def session(blob: bytes, profile: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_profiling = profile
    return ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])


def padded(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Row-concatenated ids -> [rows, longest] int64, padded with PAD."""
    width = max(1, int(lengths.max(initial=0)))
    out = np.full((len(lengths), width), PAD, np.int64)
    out[np.arange(width) < lengths[:, None]] = values
    return out


def id_feed(texts: Sequence[str | bytes], vocab: dict[str, dict[str, int]]) -> Feed:
    rows = len(texts)
    numeric = np.zeros((rows, len(NUMERIC_INPUTS)), np.float32)
    side_texts: dict[str, list[str]] = {"mc": [""] * rows, "open": [""] * rows}
    n = len(NUMERIC_FEATURES)
    for r, text in enumerate(texts):
        clean = clean_text(text)
        normalized = normalize_text(clean)
        values = numeric_features(clean, normalized)
        if is_multiple_choice(clean):
            numeric[r, :n] = values
            numeric[r, -1] = 1.0
            side_texts["mc"][r] = normalized
        else:
            numeric[r, n : 2 * n] = values
            side_texts["open"][r] = normalized
    feed = {name: numeric[:, i : i + 1] for i, name in enumerate(NUMERIC_INPUTS)}
    for side, side_rows in side_texts.items():
        lengths = np.fromiter(map(len, side_rows), np.int64, rows)
        codes = np.frombuffer("".join(side_rows).encode("utf-32-le"), np.uint32)
        feed[f"{side}_chars"] = padded(codes.astype(np.int64), lengths)
        get = vocab[side].get
        ids = [[get(w, PAD) for w in WORD.findall(t)] for t in side_rows]
        counts = np.fromiter(map(len, ids), np.int64, rows)
        flat = np.fromiter((i for row in ids for i in row), np.int64, int(counts.sum()))
        feed[f"{side}_words"] = padded(flat, counts)
    return feed


def in_chunks(
    texts: Sequence[str | bytes], rows: int, run: Callable[[list], np.ndarray]
) -> np.ndarray:
    """Chunks of similar length (sorted), so padding to the longest row costs little."""
    order = np.argsort(np.fromiter(map(len, texts), np.int64, len(texts)), kind="stable")
    out = np.empty(len(texts))
    for start in range(0, len(texts), rows):
        idx = order[start : start + rows]
        out[idx] = run([texts[i] for i in idx])
    return out


def rate(n: int, fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="/work/shared/data/routellm")
    parser.add_argument("--batch", type=int, default=8000)
    parser.add_argument("--rows", type=int, default=512, help="rows per onnxruntime call")
    args = parser.parse_args()
    prompts = load_dataset(Path(args.data), require_outcomes=False).prompts
    blob, vocab = id_graph(DEFAULT_MODEL)
    ids = session(blob)
    values = np.array(json.loads(DEFAULT_MODEL.with_suffix(".json").read_text())["class_values"])

    def score(texts: list) -> np.ndarray:
        probabilities = ids.run(["probabilities"], id_feed(texts, vocab))[0]
        return np.clip(probabilities @ values, 0.0, 1.0)

    shipped = DifficultyScorer.load(None)
    diff = np.abs(shipped.score_texts(prompts) - in_chunks(prompts, args.rows, score))
    order = np.random.default_rng(0).permutation(len(prompts))
    batch = [prompts[order[k % len(order)]] for k in range(args.batch)]
    in_chunks(batch[: args.rows], args.rows, score)  # warm-up
    chunks = [batch[i : i + args.rows] for i in range(0, len(batch), args.rows)]
    feeds = [id_feed(sorted(c, key=len), vocab) for c in chunks]
    figures = {
        "shipped string graph (prompts/s)": rate(len(batch), lambda: shipped.score_texts(batch)),
        "id graph, end to end (prompts/s)": rate(
            len(batch), lambda: in_chunks(batch, args.rows, score)
        ),
        "id feed, Python only (prompts/s)": rate(
            len(batch), lambda: [id_feed(c, vocab) for c in chunks]
        ),
        "id graph, onnxruntime only (prompts/s)": rate(
            len(batch), lambda: [ids.run(["probabilities"], f) for f in feeds]
        ),
    }
    print(f"parity id graph vs shipped: max |diff| = {diff.max():.3g} over {len(diff)} prompts")
    print(f"id model bytes: {len(blob)}; chunks of {args.rows} rows, {args.batch} prompts")
    for name, value in figures.items():
        print(f"{name:40s} {value:8.0f}")
    profiled = session(blob, profile=True)
    for f in feeds:
        profiled.run(["probabilities"], f)
    with open(profiled.end_profiling()) as handle:
        events = json.load(handle)
    kernels: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", e["name"])
            kernels[op] = kernels.get(op, 0.0) + e["dur"]
    total = sum(kernels.values())
    print("onnxruntime time by operator type: " + ", ".join(
        f"{op} {t / total:.0%}" for op, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:6]
    ))
    load = os.getloadavg()
    print(f"load average (1/5/15 m): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
