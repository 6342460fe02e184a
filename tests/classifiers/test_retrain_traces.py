"""The proxy's own trace folder as training data (issue 13).

The real proxy (replay tiers answering from real GSM8K/MMLU prompts, prompt logging on) serves
requests sent with the official `openai` client; users rate some answers through
`POST /v1/feedback`; a judge's labels are written through trace_format.labels (the reference
outcomes of the data, as the `reference` judge would); a shadow file sits beside them. The one
loader reads the folder's traces and labels and skips its side files. `classifier train <trace
dir>`, `tune --traces <trace dir> --scores <oof>` and `simulate` on such a folder are tested with
the commands (tests/router/commands/test_classifier_train_traces_cli.py, which builds its folder
with `build_trace_folder`).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from classifiers.dataset import load_dataset, routellm_data_dir
from router.config import config_from_dict
from tests.support.proxy import ProxyThread
from tests.support.sim import router_config_dict
from trace_format.feedback import FEEDBACK_FILE
from trace_format.labels import LABELS_FILE, LabelRecord
from trace_format.reader import data_files

DATA = routellm_data_dir()
N = 240  # requests through the proxy; LABELLED of them get a judge's label
LABELLED = 200


def _source_trace(path: Path) -> dict[str, tuple[float, float]]:
    """A replay trace of N distinct real prompts (half GSM8K, half MMLU: the replay tiers answer
    by prompt); returns their outcomes by prompt."""
    gsm = load_dataset(DATA / "gsm8k")
    mmlu = load_dataset(DATA / "mmlu" / "responses" / "mmlu_high_school_psychology.csv")
    outcomes: dict[str, tuple[float, float]] = {}
    for ds, stop in ((gsm, N // 2), (mmlu, N)):
        for prompt, small, large in zip(ds.prompts, ds.small, ds.large, strict=True):
            if len(outcomes) == stop:
                break
            outcomes.setdefault(prompt, (float(small), float(large)))
    records = [
        {
            "schema_version": 1,
            "id": f"src-{i}",
            "time": 1.0,
            "prompt": prompt,
            "prompt_tokens": 50,
            "completion_tokens": 20,
        }
        for i, prompt in enumerate(outcomes)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return outcomes


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_trace_folder(tmp_path_factory.mktemp("loop"))


def build_trace_folder(root: Path) -> Path:
    """`root/traces`: the proxy's trace folder after N requests, 30 rated, LABELLED judged."""
    outcomes = _source_trace(root / "source.jsonl")
    folder = root / "traces"
    data = router_config_dict(
        root / "source.jsonl",
        threshold=0.55,
        traces={"path": str(folder / "requests.jsonl"), "include_prompt": True},
        signals={"enabled": False},
    )
    config = config_from_dict(data, environ={})
    sent: list[tuple[str, str, str]] = []  # (request id, tier, prompt)
    with ProxyThread(config) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        for prompt in outcomes:
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": prompt}]
            )
            raw.parse()
            sent.append((raw.headers["x-router-request-id"], raw.headers["x-router-tier"], prompt))
        # Users rate 30 answers (the outcome of the tier that answered).
        for rid, tier, prompt in sent[:30]:
            score = outcomes[prompt][0 if tier == "small" else 1]
            r = httpx.post(f"{proxy.url}/v1/feedback", json={"request_id": rid, "score": score})
            assert r.status_code == 200, r.text
        proxy.traces(expect=N)
    # A judge labels LABELLED requests (both tiers' outcomes); one line is half-written.
    with (folder / LABELS_FILE).open("wb") as fh:
        for rid, _tier, prompt in sent[:LABELLED]:
            small, large = outcomes[prompt]
            fh.write(
                LabelRecord(
                    request_id=rid,
                    judge="reference",
                    judge_version="1",
                    outcomes={"small": small, "large": large},
                ).line()
            )
        fh.write(b'{"request_id": "half-writ')
    (folder / "shadow-answers.jsonl").write_text('{"request_id": "x", "answer": "..."}\n')
    return folder


def test_side_files_are_not_traces(trace_dir: Path) -> None:
    assert (trace_dir / FEEDBACK_FILE).is_file() and (trace_dir / LABELS_FILE).is_file()
    assert [p.name for p in data_files(trace_dir)] == ["requests.jsonl"]
    ds = load_dataset(trace_dir, labelled_only=True)
    assert len(ds) == LABELLED and ds.unlabelled == N - LABELLED and ds.from_labels == LABELLED
    assert set(np.unique(ds.small)) <= {0.0, 1.0}
