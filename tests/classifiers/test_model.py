"""The exported model: onnxruntime == scikit-learn on real prompts; bad inputs; bad model files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.export import export, lean_model
from classifiers.features import (
    BROADCAST_KEY,
    MODEL_INPUTS,
    NUMERIC_INPUTS,
    PACKED_INPUTS,
    clean_text,
    is_multiple_choice,
)
from classifiers.inference import (
    BATCH_CELLS,
    BATCH_ROWS,
    CACHED_CHARS,
    DifficultyScorer,
    ModelLoadError,
    _chunks,
)
from classifiers.model_files import ModelFiles
from classifiers.train import WORD_PATTERN, TrainConfig, fit, frame, predict_scores
from trace_format.request_text import request_text

DATA = routellm_data_dir()
ODD_TEXTS = [
    "",
    "   ",
    "Ünïcödé straße ÉCOLE 40π ½ × 3",
    "中文问题：二加二等于几？",
    "Вопрос: сколько будет два плюс два?",
    "مرحبا كيف حالك",
    "emoji 🚀🔥 code ```def f(x): return x**2```",
    "x" * 1_000_000,
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    data = load_dataset(DATA)
    rng = np.random.default_rng(0)
    gsm = np.flatnonzero(data.benchmark == "gsm8k")
    mmlu = rng.choice(np.flatnonzero(data.benchmark == "mmlu"), 1500, replace=False)
    train = np.concatenate([gsm[:600], mmlu[:1000]])
    test = np.concatenate([gsm[600:], mmlu[1000:]])  # 805 unseen real prompts
    config = TrainConfig(candidate_features=3000, keep_word=400, keep_char=400)
    pipeline = fit(data.subset(train), config)
    path = tmp_path_factory.mktemp("model") / "model.onnx"
    export(pipeline, path, {"train_config": config.as_dict()})
    prompts = [data.prompts[i] for i in np.concatenate([train[:400], test])] + ODD_TEXTS
    return pipeline, path, prompts


def test_onnx_matches_sklearn_on_real_prompts(trained: tuple) -> None:
    pipeline, path, prompts = trained
    assert len(prompts) >= 1000
    scorer = DifficultyScorer.load(path)
    onnx_scores = scorer.score_texts(prompts)
    sk_scores = predict_scores(pipeline, frame(prompts))
    assert np.abs(onnx_scores - sk_scores).max() <= 1e-5
    assert ((onnx_scores >= 0) & (onnx_scores <= 1)).all()
    # Batched and one-at-a-time scoring agree (chunking must not change a score), with and
    # without overlapping preprocessing and onnxruntime, and for a small mixed batch.
    singles = np.array([scorer.score_texts([p])[0] for p in prompts[:50]])
    assert np.abs(singles - onnx_scores[:50]).max() <= 1e-6
    sequential = scorer.score_texts(prompts, overlap=False)
    assert np.abs(sequential - onnx_scores).max() <= 1e-6
    mixed = prompts[695:715]  # unseen GSM8K prompts, then MMLU ones
    assert len({is_multiple_choice(clean_text(p)) for p in mixed}) == 2
    assert np.abs(scorer.score_texts(mixed) - onnx_scores[695:715]).max() <= 1e-6


def test_export_is_the_lean_graph(trained: tuple) -> None:
    _pipeline, path, _prompts = trained
    model = onnx.load(path)
    nodes = model.graph.node
    counts = [n.output[0] for n in nodes if n.op_type == "TfIdfVectorizer"]
    assert len(counts) == 4
    # Each vectorizer's [rows, vocabulary] output only feeds its norm (Mul, squared) and one
    # MatMul: no full-width idf Mul, Div, normaliser or Concat.
    for name in counts:
        readers = sorted(n.op_type for n in nodes if name in n.input)
        assert readers == ["MatMul", "Mul"], readers
    assert not {"LinearClassifier", "Normalizer"} & {n.op_type for n in nodes}
    props = {p.key: p.value for p in model.metadata_props}
    assert props[BROADCAST_KEY] == "1"
    # The numeric features are one input (onnxruntime's cost per input dominated a one-prompt
    # run with one input each).
    assert [i.name for i in model.graph.input] == list(PACKED_INPUTS)


def test_former_lean_graph_with_one_input_per_feature_still_scores(
    trained: tuple, tmp_path: Path
) -> None:
    # Models exported before the numeric features were packed (e.g. a shipped model of an older
    # release) take one input per feature: they load and score the same.
    pipeline, path, prompts = trained
    former = tmp_path / "former.onnx"
    former.write_bytes(lean_model(pipeline, packed=False).SerializeToString())
    assert {i.name for i in onnx.load(former).graph.input} == set(MODEL_INPUTS)
    shutil.copy(ModelFiles(path).card, ModelFiles(former).card)
    old, new = DifficultyScorer.load(former), DifficultyScorer.load(path)
    assert np.abs(old.score_texts(prompts) - new.score_texts(prompts)).max() <= 1e-6
    body = {"messages": [{"role": "user", "content": prompts[0]}]}
    assert old.score_request(body) == pytest.approx(new.score_request(body), abs=1e-6)


def test_score_request_caches_repeated_texts_exactly(trained: tuple) -> None:
    _pipeline, path, prompts = trained
    scorer = DifficultyScorer.load(path)
    bodies = [{"messages": [{"role": "user", "content": p}]} for p in prompts[:40]]
    first = [scorer.score_request(b) for b in bodies]
    before = scorer._cached_score.cache_info()
    again = [scorer.score_request(b) for b in bodies]
    after = scorer._cached_score.cache_info()
    # A repeat is a hit and returns exactly the score of a fresh run (and of a batch).
    assert again == first
    cached = [len(request_text(b)) <= CACHED_CHARS for b in bodies]
    assert after.hits - before.hits == sum(cached) > 30
    batch = scorer.score_texts([request_text(b) for b in bodies])
    assert np.abs(np.array(first) - batch).max() <= 1e-6
    # A long text is scored every time, never held: the cache's memory stays bounded.
    long_body = {"prompt": "word " * CACHED_CHARS}
    size = scorer._cached_score.cache_info().currsize
    assert scorer.score_request(long_body) == scorer.score_texts([long_body["prompt"]])[0]
    assert scorer._cached_score.cache_info().currsize == size
    # The cache holds its scorer weakly: a replaced model is freed at once, without a GC cycle.
    held = weakref.ref(scorer)
    del scorer
    assert held() is None


def test_unsupported_pipeline_is_refused(tmp_path: Path) -> None:
    # Training builds only the shape the lean graph covers; any other pipeline is an error, and
    # no file is written.
    data = load_dataset(DATA)
    rows = np.flatnonzero(data.benchmark == "gsm8k")[:300]
    prompts = [data.prompts[i] for i in rows]
    labels = np.arange(len(prompts)) % 2
    features = ColumnTransformer(
        [
            ("words", TfidfVectorizer(lowercase=False, token_pattern=WORD_PATTERN), "open_text"),
            ("num", "passthrough", list(NUMERIC_INPUTS)),
        ]
    )
    pipeline = Pipeline([("features", features), ("model", LogisticRegression())])
    pipeline.fit(frame(prompts), labels)
    path = tmp_path / "unsupported.onnx"
    with pytest.raises(NotImplementedError, match="lean export: transformer 'num'"):
        export(pipeline, path, {})
    assert not path.exists() and not path.with_suffix(".json").exists()


def test_shipped_model_loads_and_scores_requests() -> None:
    scorer = DifficultyScorer.load(None)
    chat = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    completion = {"prompt": "Prove that there are infinitely many primes."}
    for body in (chat, completion, {}, {"messages": []}):
        score = scorer.score_request(body)
        assert 0.0 <= score <= 1.0
    assert scorer.score_texts([]).shape == (0,)


def test_bad_inputs_score_without_error() -> None:
    scorer = DifficultyScorer.load(None)
    scores = scorer.score_texts([*ODD_TEXTS, b"bad \xff\xfe utf8", "lone \ud800 surrogate"])
    assert np.isfinite(scores).all()
    # A 1 MB prompt is truncated deterministically: same score every time, equal to a prompt
    # that differs only in the middle part that truncation drops.
    big = "word " * 200_000
    other = big[:300_000] + "MIDDLE CHANGED " + big[300_015:]
    first, again, changed = scorer.score_texts([big, big, other])
    assert first == again == changed


def test_missing_and_corrupt_model_fail_at_load(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelLoadError, match="nope.onnx"):
        DifficultyScorer.load(missing)
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x01garbage that is not an onnx graph")
    with pytest.raises(ModelLoadError, match="corrupt.onnx"):
        DifficultyScorer.load(corrupt)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty.onnx"):
        DifficultyScorer.load(empty)


def _older_graph(path: Path, text_type: int) -> Path:
    """A tiny classifier graph as exported before the lean one: text inputs as strings ([rows, 1],
    the former skl2onnx export) or as character ids without the broadcast flag. Its score is
    P(class 1) = sigmoid(count of "hello" (strings) or of "h" (ids) in the open-side text)."""
    from onnx import TensorProto, helper, numpy_helper

    def tfidf(name: str) -> onnx.NodeProto:
        pool = (
            {"pool_strings": ["hello"]}
            if text_type == TensorProto.STRING
            else {"pool_int64s": [ord("h")]}
        )
        return helper.make_node(
            "TfIdfVectorizer",
            [name],
            [f"{name}_tf"],
            mode="TF",
            min_gram_length=1,
            max_gram_length=1,
            max_skip_count=0,
            ngram_counts=[0],
            ngram_indexes=[0],
            **pool,
        )

    text_shape = ["rows", 1] if text_type == TensorProto.STRING else ["rows", "chars"]
    inputs = [
        helper.make_tensor_value_info(n, text_type, text_shape) for n in ("mc_text", "open_text")
    ]
    inputs += [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["rows", 1]) for n in NUMERIC_INPUTS
    ]
    weights = np.zeros((2 + len(NUMERIC_INPUTS), 2), dtype=np.float32)
    weights[1, 1] = 1.0  # the open-side text's count
    nodes = [
        tfidf("mc_text"),
        tfidf("open_text"),
        helper.make_node("Concat", ["mc_text_tf", "open_text_tf", *NUMERIC_INPUTS], ["x"], axis=1),
        helper.make_node("MatMul", ["x", "w"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "older",
        inputs,
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["rows", 2])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("text_type", [onnx.TensorProto.STRING, onnx.TensorProto.INT64])
def test_models_of_older_exports_load_and_score(tmp_path: Path, text_type: int) -> None:
    # MODEL_CARD.md: models with string text inputs (the former skl2onnx export) or with
    # character ids but no broadcast flag (before the lean graph) still load and score.
    scorer = DifficultyScorer.load(_older_graph(tmp_path / "older.onnx", text_type))
    hit, miss, empty = scorer.score_texts(["hello", "bye", ""])
    assert hit == pytest.approx(1 / (1 + np.exp(-1.0)), abs=1e-6)
    assert miss == pytest.approx(0.5) and empty == pytest.approx(0.5)
    assert scorer.score_texts(["A) hello\nB) bye\nWhich one?"])[0] == pytest.approx(0.5)  # mc side


def test_bad_metadata_fails_at_load(tmp_path: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "classifiers" / "default" / "model.onnx"
    model = tmp_path / "m.onnx"
    model.write_bytes(shipped.read_bytes())
    (tmp_path / "m.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="m.json"):
        DifficultyScorer.load(model)
    (tmp_path / "m.json").write_text('{"class_values": [0.0, 1.0, 2.0, 3.0]}')
    with pytest.raises(ModelLoadError, match="m.onnx"):
        DifficultyScorer.load(model)


def test_request_path_imports_no_sklearn() -> None:
    code = (
        "import sys, classifiers.inference as i; i.DifficultyScorer.load(None);"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('sklearn', 'skl2onnx', 'pandas')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_chunks_cover_every_row_once_by_kind_and_length() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 5000, 3000)
    cleans = ["x" * int(n) for n in lengths]
    kinds = (rng.random(3000) < 0.7).tolist()
    chunks = _chunks(cleans, kinds)
    rows = np.concatenate(chunks)
    assert sorted(rows.tolist()) == list(range(3000))
    for chunk in chunks:
        assert len({kinds[i] for i in chunk}) == 1 and 1 <= len(chunk) <= BATCH_ROWS
        assert len(chunk) == 1 or len(chunk) * lengths[chunk].max() <= BATCH_CELLS
    assert [c.tolist() for c in _chunks(cleans[:5], kinds[:5])] == [[0, 1, 2, 3, 4]]
