"""The simulator's predictions against the live proxy on the same trace (replay backend).

200 real prompts go through the real proxy (uvicorn, real classifier, real policy, replay tiers
answering with the trace's token counts) with the official `openai` client; the simulator replays
the same trace offline. Routing decisions must match exactly, predicted cost within 1%. The same
prompts then go through a `random` policy, and the simulator, replaying the proxy's own trace,
must make the same draw for every request id.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest

from router.config import config_from_dict, sim_config_from
from simulations.replay import replay, trace_scores
from simulations.trace_loader import load_trace
from tests.support.proxy import ProxyThread
from tests.support.sim import router_config_dict, write_jsonl_trace

N = 200


@pytest.fixture()
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    write_jsonl_trace(path, N, seed=7)
    return path


def _threshold_splitting(trace_path: Path) -> float:
    """A threshold that sends a real share of this trace to each tier."""
    scores = trace_scores(load_trace([trace_path]), None)
    return float(np.quantile(scores, 0.6))


def test_proxy_matches_simulator(trace_file: Path, tmp_path: Path) -> None:
    threshold = _threshold_splitting(trace_file)
    proxy_trace = tmp_path / "proxy.jsonl"
    data = router_config_dict(
        trace_file,
        threshold=threshold,
        traces={"path": str(proxy_trace), "include_prompt": True},
        signals={"enabled": False},
    )
    data["policies"]["coin"] = {"type": "random", "p": 0.4}
    config = config_from_dict(data, environ={})
    sim = sim_config_from(config)  # what `cost-router simulate --config` replays with

    trace = load_trace([trace_file])
    predicted = replay(sim, trace, trace_scores(trace, sim.model_path), "balanced")
    predicted_tiers = [predicted.tiers[i] for i in predicted.tier_idx]
    assert 0.2 < np.mean([t == "large" for t in predicted_tiers]) < 0.6

    with ProxyThread(config) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        ids, tiers, header_costs = [], [], []
        for text in trace.texts:
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": text}]
            )
            raw.parse()
            ids.append(raw.headers["x-router-request-id"])
            tiers.append(raw.headers["x-router-tier"])
            header_costs.append(float(raw.headers["x-router-cost-usd"]))
        coin_ids, coin_tiers = [], []
        for text in trace.texts:
            raw = client.chat.completions.with_raw_response.create(
                model="router:coin", messages=[{"role": "user", "content": text}]
            )
            raw.parse()
            coin_ids.append(raw.headers["x-router-request-id"])
            coin_tiers.append(raw.headers["x-router-tier"])
        records = {r["id"]: r for r in proxy.traces(expect=2 * N)}

    assert tiers == predicted_tiers
    assert [records[i]["tier"] for i in ids] == predicted_tiers
    proxy_cost = sum(records[i]["cost_usd"] for i in ids)
    assert proxy_cost == pytest.approx(predicted.cost_usd.sum(), rel=0.01)  # the acceptance bar
    # In fact equal per request: same prices, same token counts, same formula.
    np.testing.assert_allclose([records[i]["cost_usd"] for i in ids], predicted.cost_usd, rtol=1e-9)
    assert sum(header_costs) == pytest.approx(predicted.cost_usd.sum(), rel=0.01)
    # Same scores too: the proxy scored each request with the same model and text.
    proxy_scores = np.array([records[i]["score"] for i in ids])
    np.testing.assert_allclose(proxy_scores, predicted.scores, atol=1e-6)

    # `random` draws on the request id: replaying the proxy's trace reproduces every draw.
    assert 0.2 < np.mean([t == "large" for t in coin_tiers]) < 0.6
    served = load_trace([proxy_trace], require_outcomes=False)
    assert served.ids is not None and set(coin_ids) <= set(served.ids)
    replayed = replay(sim, served, np.zeros(len(served)), "coin")  # random ignores scores
    by_id = dict(zip(served.ids, (replayed.tiers[i] for i in replayed.tier_idx), strict=True))
    assert [by_id[i] for i in coin_ids] == coin_tiers


def test_replay_backend_streams_recorded_usage_and_rejects_unknown_prompts(
    trace_file: Path, tmp_path: Path
) -> None:
    data = router_config_dict(
        trace_file,
        threshold=0.0,  # everything to the large tier
        traces={"path": str(tmp_path / "proxy.jsonl")},
        signals={"enabled": False},
    )
    config = config_from_dict(data, environ={})
    trace = load_trace([trace_file])
    with ProxyThread(config) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="auto",
                messages=[{"role": "user", "content": trace.texts[3]}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage = chunks[-1].usage
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (
            int(trace.prompt_tokens[3]),
            int(trace.completion_tokens[3, 1]),
        )
        assert "replay large" in "".join(
            c.choices[0].delta.content or "" for c in chunks if c.choices
        )
        with pytest.raises(openai.BadRequestError, match="not in trace"):
            client.chat.completions.create(
                model="auto", messages=[{"role": "user", "content": "a prompt nobody recorded"}]
            )
