"""Live drift signals and the calibrating share through the real proxy: the score histogram,
PSI / KS against a reference, large share against its target and the threshold in force in
/metrics; two replicas on one Redis share the calibrated threshold, and a restarted replica
starts from it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.echo_upstream import running_echo_upstream
from classifiers.inference import DifficultyScorer
from classifiers.score_reference import ScoreReference
from policies.calibration import RedisCalibrationStore
from router.config import config_from_dict
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.waiting import wait_for
from trace_format.config_base import ConfigError

SUBJECTS = [
    "the French revolution",
    "photosynthesis",
    "binary search",
    "a haiku about rain",
    "the derivative of x^3 sin x",
    "tax law in Germany",
    "how to boil an egg",
    "quantum entanglement",
    "a SQL query joining three tables",
    "a birthday message",
    "the proof that sqrt 2 is irrational",
    "the causes of inflation",
]
FORMS = [
    "Explain {s}.",
    "hi, tell me about {s}",
    "{s}?",
    "Summarize {s} in {n} words.",
    "Write a detailed step by step analysis of {s} with examples and edge cases.",
    "Solve: a train leaves at {n} km/h and another at {m} km/h; when do they meet? "
    "Relate it to {s}.",
]
CALIBRATE = {
    "start_threshold": 0.9,
    "warmup_requests": 40,
    "every_n_requests": 10,
    "max_step": 0.05,
}


def prompts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        str(rng.choice(FORMS)).format(
            s=rng.choice(SUBJECTS), n=rng.integers(2, 90), m=rng.integers(2, 90)
        )
        for _ in range(n)
    ]


def samples(url: str) -> dict[tuple[str, str], float]:
    """(sample name, policy label) -> value, from the proxy's /metrics."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, s.labels.get("policy", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def ask(client: openai.OpenAI, model: str, text: str) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=4
    )
    return raw.headers["x-router-tier"]


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


def config(echo: str, tmp_path: Path, **extra: Any) -> Any:
    return make_config(
        [tier("small", echo, price=(0.1, 0.1)), tier("large", echo)],
        tmp_path,
        default_policy="cal",
        **extra,
    )


def test_gauges_follow_the_window_and_the_share_holds(echo: str, tmp_path: Path) -> None:
    texts = prompts(240)
    reference = tmp_path / "ref.scores.json"
    ScoreReference.from_scores(DifficultyScorer.load(None).score_texts(texts), "test").save(
        reference
    )
    cfg = config(
        echo,
        tmp_path,
        monitoring={"window_requests": 150, "reference": str(reference)},
        policies={
            "cal": {"type": "threshold", "target_large_share": 0.3, "calibrate": CALIBRATE},
            "hard": {"type": "threshold", "threshold": 0.5},
        },
    )
    with ProxyThread(cfg) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
        tiers = [ask(client, "auto", t) for t in texts]
        for t in ["hi"] * 30:  # the other policy sees traffic unlike the reference
            ask(client, "router:hard", t)
        m = samples(proxy.url)
    assert m[("cost_router_score_count", "cal")] == 240
    assert m[("cost_router_large_share_target", "cal")] == 0.3
    assert ("cost_router_large_share_target", "hard") not in m  # no target: no series
    threshold = m[("cost_router_calibrated_threshold", "cal")]
    assert threshold < 0.9 and m[("cost_router_calibrated_threshold", "hard")] == 0.5
    # The window is the last 150 requests; the calibrated share is held near its target.
    recent = np.mean([t == "large" for t in tiers[-150:]])
    assert m[("cost_router_large_share", "cal")] == pytest.approx(recent)
    assert abs(recent - 0.3) < 0.1, recent
    # Same prompts as the reference: no drift; only "hi": all in one bin, far from it.
    assert m[("cost_router_score_psi", "cal")] < 0.1
    assert m[("cost_router_score_drift_pvalue", "cal")] > 0.05
    assert m[("cost_router_score_psi", "hard")] > 1
    assert m[("cost_router_score_drift_pvalue", "hard")] < 1e-6
    hi_large = DifficultyScorer.load(None).score_texts(["hi"])[0] >= 0.5
    assert m[("cost_router_large_share", "hard")] == float(hi_large)


def test_replicas_share_the_threshold_and_a_restart_keeps_it(echo: str, tmp_path: Path) -> None:
    prefix = random_prefix()
    cfg = config(
        echo,
        tmp_path,
        budgets={"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
        policies={"cal": {"type": "threshold", "target_large_share": 0.3, "calibrate": CALIBRATE}},
    )

    async def stored() -> float:
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            state = await RedisCalibrationStore(client, prefix).load("cal")
            assert state is not None
            return state.threshold
        finally:
            await client.aclose()

    try:
        with ProxyThread(cfg) as a, ProxyThread(cfg) as b:
            clients = [
                openai.OpenAI(base_url=f"{p.url}/v1", api_key="x", max_retries=0) for p in (a, b)
            ]
            for i, text in enumerate(prompts(120, seed=1)):
                ask(clients[i % 2], "auto", text)
            wait_for(
                lambda: a.state.drift is not None and not a.state.pending and not b.state.pending,
                5,
                "the last pushes",
            )
            ta, tb = (samples(p.url)[("cost_router_calibrated_threshold", "cal")] for p in (a, b))
            shared = asyncio.run(stored())
        # Each replica routes by the shared threshold as of its last push: one step apart at most.
        assert ta < 0.9 and tb < 0.9 and abs(ta - tb) <= CALIBRATE["max_step"] + 1e-9
        assert shared in (ta, tb)
        with ProxyThread(cfg) as restarted:  # a new process reads the state before traffic
            assert samples(restarted.url)[("cost_router_calibrated_threshold", "cal")] == shared
    finally:
        delete_prefix(prefix)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"window_requests": 5}, "monitoring.window_requests"),
        ({"window_s": 0}, "monitoring.window_s"),
        ({"windows": 10}, "monitoring.windows"),
    ],
)
def test_monitoring_config_mistakes_name_their_key(section: dict[str, Any], key: str) -> None:
    tiers = [tier("small", "http://s"), tier("large", "http://l")]
    with pytest.raises((ConfigError, ValueError), match=key.replace(".", r"\.")):
        config_from_dict({"tiers": tiers, "monitoring": section}, environ={})


def test_an_unreadable_reference_is_named_at_startup(echo: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.scores.json"
    bad.write_text("{not json")
    cfg = config(
        echo,
        tmp_path,
        monitoring={"reference": str(bad)},
        policies={"cal": {"type": "threshold", "threshold": 0.5}},
    )
    from router.proxy.build import build_state

    with pytest.raises(ConfigError, match=r"monitoring\.reference: .*bad\.scores\.json"):
        build_state(cfg)


def test_quality_retained_from_shadow_pairs_and_labels(echo: str, tmp_path: Path) -> None:
    from router.learning.shadow_log import ShadowLog
    from trace_format.labels import LabelRecord, labels_path_for
    from trace_format.shadow import shadow_path_for

    cfg = config(echo, tmp_path, policies={"cal": {"type": "threshold", "threshold": 0.5}})
    trace = cfg.traces.path
    log = ShadowLog(shadow_path_for(trace), labels_path_for(trace))
    rng = np.random.default_rng(3)
    routed, large = [], []
    for i in range(60):
        primary, shadow = ("small", "large") if i % 2 else ("large", "small")
        out = {"small": float(rng.random() < 0.6), "large": float(rng.random() < 0.8)}
        if i == 0:  # a label written before its shadow record still counts
            log.append_label(LabelRecord(request_id="r0", judge="llm", outcomes=out))
        log.append(
            {
                "schema_version": 1,
                "request_id": f"r{i}",
                "time": 1e9 + i,
                "team": "t",
                "policy": "cal",
                "endpoint": "chat/completions",
                "primary": {"tier": primary},
                "shadow": {"tier": shadow},
            }
        )
        if i:
            log.append_label(LabelRecord(request_id=f"r{i}", judge="llm", outcomes=out))
        routed.append(out[primary])
        large.append(out["large"])
    log.append_label(LabelRecord(request_id="elsewhere", judge="feedback", outcomes={"small": 1}))
    with ProxyThread(cfg) as proxy:
        m = samples(proxy.url)
    assert m[("cost_router_quality_labels", "cal")] == 60
    value = m[("cost_router_quality_retained", "cal")]
    assert value == pytest.approx(np.mean(routed) / np.mean(large))
    assert m[("cost_router_quality_retained_low", "cal")] < value
    assert m[("cost_router_quality_retained_high", "cal")] > value


def test_downgrades_and_team_requests_are_counted(echo: str, tmp_path: Path) -> None:
    cfg = make_config(
        [tier("small", echo, price=(0.001, 0.001)), tier("large", echo, price=(1000, 1000))],
        tmp_path,
        default_policy="all",
        budgets={"downgrade": True},
        teams={"default": {"budget": {"limit_usd": 0.01, "period": "total"}}},
        policies={"all": {"type": "threshold", "threshold": 0.0}},
    )
    with ProxyThread(cfg) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
        assert ask(client, "auto", "hello there") == "small"  # large's worst case is over budget
        wait_for(lambda: not proxy.state.pending, 5, "the request's finish")
        text = httpx.get(f"{proxy.url}/metrics").text
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert (
        found[("cost_router_downgrades_total", (("from_tier", "large"), ("to_tier", "small")))] == 1
    )
    assert found[("cost_router_team_requests_total", (("team", "default"), ("tier", "small")))] == 1


def test_a_hot_reload_keeps_the_calibrated_threshold(echo: str, tmp_path: Path) -> None:
    import yaml

    from router.config import load_config

    def doc(target: float) -> dict[str, Any]:
        return {
            "tiers": [tier("small", echo, price=(0.1, 0.1)), tier("large", echo)],
            "traces": {"path": str(tmp_path / "requests.jsonl")},
            "signals": {"enabled": False},
            "server": {"reload_debounce_s": 0},
            "default_policy": "cal",
            "policies": {
                "cal": {"type": "threshold", "target_large_share": target, "calibrate": CALIBRATE}
            },
        }

    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(doc(0.3)))
    with ProxyThread(load_config(path, environ={}), config_path=path) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
        for text in prompts(80, seed=2):
            ask(client, "auto", text)
        wait_for(lambda: not proxy.state.pending, 5, "the last push")
        before = proxy.state.selector.policies["cal"]
        assert before.threshold < 0.9  # type: ignore[attr-defined]
        reloader = proxy.app.state.reloader
        applied = reloader.reloads
        path.write_text(yaml.safe_dump(doc(0.25)))
        wait_for(lambda: reloader.reloads > applied, 15, "the edit's reload")
        after = proxy.state.selector.policies["cal"]
        assert after is not before and after.target == 0.25  # type: ignore[attr-defined]
        assert after.threshold == before.threshold  # type: ignore[attr-defined]


def test_a_student_is_watched_against_its_teacher(tmp_path: Path) -> None:
    """A student a workflow routes to (issue 28), or a fixed student policy: its quality
    retained is over the teacher's answers on the shadow pairs, per tier and per policy (a
    one-tier policy is never compared with itself)."""
    from router.learning.shadow_log import ShadowLog
    from router.observability.drift_monitor import LabelledPairs
    from trace_format.labels import LabelRecord, labels_path_for
    from trace_format.shadow import shadow_path_for

    trace = str(tmp_path / "requests.jsonl")
    log = ShadowLog(shadow_path_for(trace), labels_path_for(trace))
    rng = np.random.default_rng(5)
    student, teacher = [], []
    for i in range(40):
        # Half under a threshold policy's workflow, half under a fixed student policy.
        policy = "auto" if i % 2 else "math-student"
        out = {"student": float(rng.random() < 0.5), "large": float(rng.random() < 0.9)}
        log.append(
            {
                "schema_version": 1,
                "request_id": f"r{i}",
                "time": 1e9 + i,
                "team": "t",
                "policy": policy,
                "endpoint": "chat/completions",
                "primary": {"tier": "student"},
                "shadow": {"tier": "large"},
            }
        )
        log.append_label(LabelRecord(request_id=f"r{i}", judge="reference", outcomes=out))
        student.append(out["student"])
        teacher.append(out["large"])
    pairs = LabelledPairs(trace, limit=100)
    pairs.poll()
    est = pairs.by_tier(None)[("student", "large")]
    assert est is not None and est.n == 40
    assert est.value == pytest.approx(np.mean(student) / np.mean(teacher))
    fixed, n = pairs.retained("math-student", None, None)
    assert n == 20 and fixed is not None
    assert fixed.value == pytest.approx(np.mean(student[0::2]) / np.mean(teacher[0::2]))
    assert fixed.value < 0.9  # was 1.0 when the fixed policy's only tier was its reference
