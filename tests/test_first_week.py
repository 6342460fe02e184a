"""The newcomer's first week, end to end (issue 25's acceptance): two echo upstream tiers, Redis
budgets, team keys and an A/B split assigned by the request body's `user`; two proxy replicas
(`cost-router serve` processes, one config file, each its own trace file in one folder through
`COST_ROUTER__TRACES__PATH`, as docs/deployment.md says) under concurrent load from the official
openai client; then the offline commands on that folder as written (completion order, rotated
files, two writers): `grades import`, `tune`, `simulate`, `simulate --budgets`, `what-if` and
`ab report`. Their numbers must agree with each other, with what was sent and with what Redis
charged."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import yaml
from typer.testing import CliRunner, Result

from benchmarks.echo_upstream import running_echo_upstream
from classifiers.dataset import RoutingDataset, load_dataset
from policies.keys import hash_key
from router.cli import app
from simulations.replay import score_texts
from tests.support.budgets import REDIS_URL, Proxy, delete_prefix, random_prefix
from tests.support.sim import GSM8K
from tests.support.waiting import wait_for
from trace_format.reader import data_files

N = 240  # requests, half through each replica
USERS = 40  # body users u0..u39: u0..u19 in team alpha, u20..u39 in team beta
TEAMS = {"alpha": "sk-first-week-alpha", "beta": "sk-first-week-beta"}
LIMIT_USD = {"alpha": 3.0, "beta": 2.5}  # never reached: every request is served and charged
PRICES = {"small": (0.6, 0.6), "large": (10.0, 30.0)}
EXPERIMENT = "routing-ab"
MAX_TOKENS = 16
USD = 1e-9  # one nano-USD: the proxy charges whole nanos

runner = CliRunner()


def invoke(*args: str) -> Result:
    """A `cost-router` command as typed, which must succeed."""
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, f"cost-router {' '.join(args)}: exit {res.exit_code}\n{res.output}"
    return res


def cli(*args: str) -> str:
    return invoke(*args).stdout


def cli_json(path: Path, *args: str) -> Any:
    cli(*args, "--json", str(path))
    return json.loads(path.read_text())


EXPERIMENT_NOTE = (
    "note: experiment 'routing-ab' serves its arms to team(s) beta with current (control), "
    "generous (treatment); this replay routes every request with policy 'current'"
)


def trace_records(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trace record in the folder by the file chain (replica) that wrote it."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if folder.exists():
        for f in data_files(folder):
            replica = f.name.split(".jsonl")[0]
            out[replica] += [json.loads(line) for line in f.read_text().splitlines()]
    return out


def lines_written(folder: Path) -> int:
    """Whole lines on disk so far, while the replicas may still be writing (and rotating)."""
    total = 0
    for f in data_files(folder) if folder.exists() else []:
        try:
            total += f.read_bytes().count(b"\n")
        except FileNotFoundError:  # rotated away since the listing: counted under its new name
            return 0
    return total


def user_of(j: int) -> int:
    return j % USERS


def team_of(user: int) -> str:
    return "alpha" if user < USERS // 2 else "beta"


def replica_of(j: int) -> int:
    # Rounds of USERS requests alternate replicas, so every user is served by both.
    return (j // USERS) % 2


def thresholds(ds: RoutingDataset, rows: list[int]) -> tuple[float, float]:
    """Two thresholds that split these prompts' scores (the shipped classifier's, as the proxy
    scores them) at about 60% and 35% small, each halfway between two scores (no ties)."""
    scores = np.sort(score_texts([ds.prompts[i] for i in rows], None))
    mid = [float((scores[k - 1] + scores[k]) / 2) for k in (int(0.6 * N), int(0.35 * N))]
    return mid[0], mid[1]


def router_config(
    path: Path, folder: Path, upstreams: list[str], prefix: str, ds: RoutingDataset, rows: list[int]
) -> dict[str, Any]:
    current, generous = thresholds(ds, rows)
    data: dict[str, Any] = {
        "tiers": [
            {
                "name": name,
                "base_url": url,
                "model": f"echo-{name}",
                "price": {"input_per_mtok": PRICES[name][0], "output_per_mtok": PRICES[name][1]},
                "timeout_s": 30,
            }
            for name, url in zip(PRICES, upstreams, strict=True)
        ],
        # One folder; each replica names its own file in it (COST_ROUTER__TRACES__PATH). A small
        # max_bytes so both chains rotate while the load runs.
        "traces": {
            "path": str(folder / "requests.jsonl"),
            "max_bytes": 16384,
            "backups": 200,
            "include_prompt": True,
        },
        "signals": {"enabled": False},
        "auth": {"required": True},
        # The key's user is 'ann' for everyone: the arms must come from the body's `user`.
        "keys": [{"key_sha256": hash_key(k), "team": t, "user": "ann"} for t, k in TEAMS.items()],
        "teams": {
            t: {"budget": {"limit_usd": LIMIT_USD[t], "period": "monthly"}} for t in LIMIT_USD
        },
        "budgets": {"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
        "default_policy": "current",
        "policies": {
            "current": {"type": "threshold", "threshold": current},
            "generous": {"type": "threshold", "threshold": generous},
        },
        "experiments": [
            {
                "name": EXPERIMENT,
                "unit": "user",
                "teams": ["beta"],  # alpha stays on the default policy
                "arms": {
                    "control": {"policy": "current", "weight": 1},
                    "treatment": {"policy": "generous", "weight": 1},
                },
            }
        ],
    }
    path.write_text(yaml.safe_dump(data))
    return data


@contextmanager
def replicas(config: Path, folder: Path, logs: Path) -> Iterator[list[Proxy]]:
    logs.mkdir(parents=True, exist_ok=True)
    started = [
        Proxy(config, logs, f"r{i}", env={"COST_ROUTER__TRACES__PATH": str(folder / f"r{i}.jsonl")})
        for i in range(2)
    ]
    try:
        with ThreadPoolExecutor(2) as pool:  # both start at once: startup is most of the wait
            list(pool.map(lambda p: p.start(), started))
        yield started
    finally:
        for p in started:
            p.stop()


def send_load(
    proxies: list[Proxy], ds: RoutingDataset, rows: list[int]
) -> dict[str, dict[str, Any]]:
    """N requests from 16 threads, a fifth of them streamed, with upstream delays that make later
    requests finish first; what the client saw, by request id."""
    rng = np.random.default_rng(25)
    delays = rng.uniform(0, 250, size=N).tolist()
    clients = {
        (i, team): openai.OpenAI(base_url=f"{p.url}/v1", api_key=key, max_retries=0)
        for i, p in enumerate(proxies)
        for team, key in TEAMS.items()
    }

    def one(j: int) -> tuple[str, dict[str, Any]]:
        user = user_of(j)
        client = clients[(replica_of(j), team_of(user))]
        kwargs: dict[str, Any] = {
            "model": "auto",
            "messages": [{"role": "user", "content": ds.prompts[rows[j]]}],
            "max_tokens": MAX_TOKENS,
            "user": f"u{user}",
            "extra_body": {"echo": {"delay_ms": delays[j]}},
        }
        stream = j % 5 == 0
        if stream:
            kwargs.update(stream=True, stream_options={"include_usage": True})
        raw = client.chat.completions.with_raw_response.create(**kwargs)
        parsed = raw.parse()
        # A stream, read to its end, carries usage in its last chunk.
        usage = [c.usage for c in parsed if c.usage][-1] if stream else parsed.usage
        h = raw.headers
        rid = h["x-router-request-id"]
        # A fifth of the requests rated, through the replica that served them (docs/experiments.md).
        feedback = round((j % 7) / 6, 4) if j % 5 == 1 else None
        if feedback is not None:
            res = httpx.post(
                f"{proxies[replica_of(j)].url}/v1/feedback",
                json={"request_id": rid, "score": feedback},
                headers={"authorization": f"Bearer {TEAMS[team_of(user)]}"},
                timeout=10,
            )
            assert res.status_code == 200, res.text
        return rid, {
            "j": j,
            "row": rows[j],
            "user": user,
            "team": team_of(user),
            "replica": replica_of(j),
            "tier": h["x-router-tier"],
            "arm": h.get("x-router-arm"),
            "usage": (usage.prompt_tokens, usage.completion_tokens),
            # Known before a stream's body: only a whole answer's header has it.
            "cost_header": None if stream else float(h["x-router-cost-usd"]),
            "feedback": feedback,
        }

    with ThreadPoolExecutor(16) as pool:
        return dict(pool.map(one, range(N)))


def budget_standing(config: Path) -> dict[str, dict[str, Any]]:
    out = cli("budget", "show", "-c", str(config), "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    return {r["team"]: r for r in rows if r["scope"] == "team"}


def write_grades(path: Path, sent: dict[str, dict[str, Any]], ds: RoutingDataset) -> None:
    """The dataset's real outcomes of each prompt, as offline grades by request id."""
    lines = (
        {"request_id": rid, "outcomes": {"small": ds.small[s["row"]], "large": ds.large[s["row"]]}}
        for rid, s in sent.items()
    )
    path.write_text("".join(json.dumps(g) + "\n" for g in lines))


def decisions(path: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["id"]: r for r in rows}


@pytest.fixture()
def redis_prefix() -> Iterator[str]:
    prefix = random_prefix()
    yield prefix
    delete_prefix(prefix)


def test_the_first_week_on_two_replicas_and_redis(tmp_path: Path, redis_prefix: str) -> None:
    ds = load_dataset([GSM8K])
    rows = np.random.default_rng(7).choice(len(ds), size=N, replace=False).tolist()
    folder = tmp_path / "traces"
    config = tmp_path / "router.yaml"
    with ExitStack() as stack:
        upstreams = [stack.enter_context(running_echo_upstream()) for _ in PRICES]
        router_config(config, folder, upstreams, redis_prefix, ds, rows)
        proxies = stack.enter_context(replicas(config, folder, tmp_path / "logs"))
        sent = send_load(proxies, ds, rows)
        wait_for(lambda: lines_written(folder) >= N, 20, f"{N} trace records on disk")
        # Charged once settled: nothing left reserved in Redis.
        wait_for(
            lambda: all(s["reserved_usd"] == 0 for s in budget_standing(config).values()),
            20,
            "every reservation settled",
        )

    # --- what the replicas wrote, and what Redis charged
    by_replica = trace_records(folder)
    records = {r["id"]: r for chain in by_replica.values() for r in chain}
    assert set(records) == set(sent) and len(records) == N
    assert sorted(by_replica) == ["r0", "r1"]
    for i in (0, 1):
        chain = by_replica[f"r{i}"]
        assert {r["id"] for r in chain} == {k for k, s in sent.items() if s["replica"] == i}
        assert len([f for f in data_files(folder) if f.name.startswith(f"r{i}.")]) > 2  # rotated
    assert any(
        [r["time"] for r in chain] != sorted(r["time"] for r in chain)
        for chain in by_replica.values()
    ), "written in arrival order: the readers' ordering is untested"
    for rid, s in sent.items():
        r = records[rid]
        assert r["status"] == 200 and r["team"] == s["team"] and r["tier"] == s["tier"], r
        assert (r["prompt_tokens"], r["completion_tokens"]) == s["usage"], (r, s)
        if s["cost_header"] is not None:
            assert r["cost_usd"] == pytest.approx(s["cost_header"], abs=USD)
        assert (r.get("arm"), r.get("ab_unit")) == (
            (s["arm"], "user") if s["team"] == "beta" else (None, None)
        )
    standing = budget_standing(config)
    assert "MISMATCH" not in cli("budget", "audit", "-c", str(config))  # exit 0: ledger = spend
    traced_cost = {t: sum(r["cost_usd"] for r in records.values() if r["team"] == t) for t in TEAMS}
    for team in TEAMS:
        assert (standing[team]["limit_usd"], standing[team]["period"]) == (
            LIMIT_USD[team],
            "monthly",
        )
        assert standing[team]["spent_usd"] == pytest.approx(traced_cost[team], abs=N * USD)

    # --- grades: three quarters first, tune sees exactly those
    ids = list(sent)  # send order
    graded, rest = ids[: 3 * N // 4], ids[3 * N // 4 :]
    grades = tmp_path / "grades.jsonl"
    write_grades(grades, {k: sent[k] for k in graded}, ds)
    out = cli("grades", "import", str(grades), "--traces", str(folder), "--config", str(config))
    assert f"imported {len(graded)} grades" in out
    assert f"large {len(graded)}, small {len(graded)}" in out
    res = invoke("tune", "-t", str(folder), "-c", str(config), "--max-large-share", "0.5")
    assert f"{len(graded)} requests" in res.stdout
    assert f"replaying {len(graded)} labelled requests; left out {len(rest)}" in res.stderr
    write_grades(grades, {k: sent[k] for k in rest}, ds)
    assert f"imported {len(rest)} grades" in cli(
        "grades", "import", str(grades), "--traces", str(folder), "--config", str(config)
    )
    large_grade = float(np.mean([ds.large[s["row"]] for s in sent.values()]))
    small_grade = float(np.mean([ds.small[s["row"]] for s in sent.values()]))

    # --- simulate at the current policy = what the proxy did (alpha and beta's control arm)
    t, c = str(folder), str(config)
    simulated = invoke(
        "simulate", "-t", t, "-c", c,
        "--decisions", str(tmp_path / "d.jsonl"), "--json", str(tmp_path / "sim.json"),
    )  # fmt: skip
    # The replay routes beta's treatment arm as the default policy, not as served: it says so.
    assert EXPERIMENT_NOTE in simulated.stderr
    sim = json.loads((tmp_path / "sim.json").read_text())
    summary, baselines = sim["summary"], sim["baselines"]
    assert summary["requests"] == N and summary["quality_known"] == N
    current = decisions(tmp_path / "d.jsonl")
    cli(
        "simulate",
        "-t",
        t,
        "-c",
        c,
        "--policy",
        "generous",
        "--decisions",
        str(tmp_path / "g.jsonl"),
    )
    generous = decisions(tmp_path / "g.jsonl")
    assert set(current) == set(generous) == set(sent)
    for rid, s in sent.items():
        mine = generous if s["arm"] == "treatment" else current
        assert mine[rid]["tier"] == records[rid]["tier"], (rid, s)
        assert mine[rid]["cost_usd"] == pytest.approx(records[rid]["cost_usd"], abs=USD)
    spent = sum(standing[team]["spent_usd"] for team in TEAMS)
    replayed = sum(
        (generous if s["arm"] == "treatment" else current)[rid]["cost_usd"]
        for rid, s in sent.items()
    )
    assert replayed == pytest.approx(spent, abs=N * USD)
    assert summary["cost_usd"] == pytest.approx(sum(d["cost_usd"] for d in current.values()))
    large_now = sum(d["tier"] == "large" for d in current.values())
    assert summary["share"]["large"] == pytest.approx(large_now / N)
    assert baselines["all-large quality"] == pytest.approx(large_grade)
    assert baselines["all-small quality"] == pytest.approx(small_grade)

    # --- simulate --budgets: the config's limits, the headline's decisions, Redis's alpha
    budgets = cli_json(tmp_path / "b.json", "simulate", "-t", t, "-c", c, "--budgets")
    assert budgets["summary"] == summary
    plain = {b["team"]: b for b in budgets["budgets"]}
    assert set(plain) == set(TEAMS)
    for team, b in plain.items():
        mine = [d for rid, d in current.items() if sent[rid]["team"] == team]
        assert (b["limit_usd"], b["period"]) == (LIMIT_USD[team], "monthly")
        assert b["requests"] == len(mine) == N // 2
        assert (b["downgraded"], b["refused"], b["exhausted_at"]) == (0, 0, None)
        assert b["large"] == sum(d["tier"] == "large" for d in mine)
        assert b["spent_usd"] == pytest.approx(sum(d["cost_usd"] for d in mine), abs=N * USD)
    assert sum(b["large"] for b in plain.values()) == large_now  # the headline's share
    # alpha is all on the current policy: the replay spends what Redis charged.
    assert plain["alpha"]["spent_usd"] == pytest.approx(standing["alpha"]["spent_usd"], abs=N * USD)
    # Offline, alpha gets half the budget it spent: the replay keeps it within that limit.
    tight = yaml.safe_load(config.read_text())
    half = plain["alpha"]["spent_usd"] / 2
    tight["teams"]["alpha"]["budget"]["limit_usd"] = half
    (tmp_path / "tight.yaml").write_text(yaml.safe_dump(tight))
    squeezed = cli_json(
        tmp_path / "b2.json", "simulate", "-t", t, "-c", str(tmp_path / "tight.yaml"), "--budgets"
    )
    capped = {b["team"]: b for b in squeezed["budgets"]}
    assert capped["beta"] == plain["beta"]
    alpha = capped["alpha"]
    alpha_times = [r["time"] for r in records.values() if r["team"] == "alpha"]
    assert alpha["limit_usd"] == half and alpha["requests"] == N // 2
    assert alpha["spent_usd"] <= half + USD and alpha["served"] == N // 2 - alpha["refused"]
    assert alpha["downgraded"] + alpha["refused"] > 0 and alpha["large"] < plain["alpha"]["large"]
    first = alpha["first_downgrade"] or alpha["exhausted_at"]
    assert min(alpha_times) <= first <= max(alpha_times)

    # --- what-if at identity lever settings = simulate
    whatif_run = invoke(
        "what-if", "-t", t, "-c", c, "--json", str(tmp_path / "w.json"),
        "--quant-speed", "1", "--quant-quality", "1", "--quant-cost", "1",
    )  # fmt: skip
    assert EXPERIMENT_NOTE in whatif_run.stderr
    assert f"{N} requests, the trace's arrival times" in whatif_run.stdout
    whatif = json.loads((tmp_path / "w.json").read_text())
    rows_by = {r["scenario"]: r for r in whatif}
    routed = rows_by["routed"]
    assert routed["cost_per_1k"] == pytest.approx(summary["cost_per_1k"])
    assert routed["quality"] == pytest.approx(summary["quality"])
    assert routed["large_share"] == pytest.approx(summary["share"]["large"])
    same = rows_by["routed + quantized small"]
    for k in ("cost_per_1k", "quality", "large_share", "p50_s", "p95_s"):
        assert same[k] == pytest.approx(routed[k]), k
    for label in ("all-large", "all-small"):
        assert rows_by[label]["cost_per_1k"] == pytest.approx(baselines[f"{label} cost per 1k"])
        assert rows_by[label]["quality"] == pytest.approx(baselines[f"{label} quality"])

    # --- tune on every grade; the threshold it writes, simulated, gives what tune said
    tuned_config = tmp_path / "tuned.yaml"
    tuned_config.write_text(config.read_text())
    tune = cli_json(
        tmp_path / "tune.json",
        "tune", "-t", t, "-c", c, "--max-large-share", "0.5", "--write", str(tuned_config),
    )  # fmt: skip
    for label, grade in (("all-large", large_grade), ("all-small", small_grade)):
        side = tune[label.replace("-", "_")]
        assert side["quality"] == pytest.approx(grade)
        assert side["cost_per_1k"] == pytest.approx(baselines[f"{label} cost per 1k"])
    retuned = cli_json(tmp_path / "s2.json", "simulate", "-t", t, "-c", str(tuned_config))
    assert retuned["summary"]["requests"] == N
    assert retuned["summary"]["share"]["large"] == pytest.approx(tune["large_share"])
    assert retuned["summary"]["cost_per_1k"] == pytest.approx(tune["cost_per_1k"])
    assert retuned["summary"]["quality"] == pytest.approx(tune["quality"])

    # --- ab report: the arms the trace recorded, by the body's users, sticky across replicas
    arms_of_user: dict[int, set[str]] = defaultdict(set)
    replicas_of_user: dict[int, set[int]] = defaultdict(set)
    for s in sent.values():
        if s["team"] == "beta":
            arms_of_user[s["user"]].add(s["arm"])
            replicas_of_user[s["user"]].add(s["replica"])
    assert all(len(a) == 1 for a in arms_of_user.values()), arms_of_user
    assert all(r == {0, 1} for r in replicas_of_user.values())
    assigned = cli(
        "ab", "assign", "-c", c, "--experiment", EXPERIMENT, *(f"u{u}" for u in arms_of_user)
    )
    assert {f"u{u}": next(iter(a)) for u, a in arms_of_user.items()} == {
        line.split("\t")[0]: line.split("\t")[1] for line in assigned.splitlines()
    }
    users_per_arm = Counter(next(iter(a)) for a in arms_of_user.values())
    in_arm = {arm: [r for r in records.values() if r.get("arm") == arm] for arm in users_per_arm}
    ab_json = tmp_path / "ab.json"
    text = cli(
        "ab", "report", "--traces", t, "--experiment", EXPERIMENT, "--config", c,
        "--json", str(ab_json),
    )  # fmt: skip
    report = json.loads(ab_json.read_text())
    assert report["unit"] == "user"
    arms = {a["arm"]: a for a in report["arms"]}
    assert set(arms) == {"control", "treatment"}
    for arm, recs in in_arm.items():
        a = arms[arm]
        assert a["requests"] == len(recs) == sum(s["arm"] == arm for s in sent.values())
        assert a["units"] == users_per_arm[arm]
        assert a["large_share"]["value"] == pytest.approx(
            sum(r["tier"] == "large" for r in recs) / len(recs)
        )
        assert a["cost_per_1k"]["value"] == pytest.approx(
            1000 * sum(r["cost_usd"] for r in recs) / len(recs)
        )
        rated = [
            s["feedback"] for s in sent.values() if s["arm"] == arm and s["feedback"] is not None
        ]
        assert a["feedback"]["n"] == len(rated) > 0
        assert a["feedback"]["value"] == pytest.approx(np.mean(rated))
        for metric in ("large_share", "cost_per_1k"):
            low, high = a[metric]["lo"], a[metric]["hi"]
            assert math.isfinite(low) and low < high, (arm, metric)
    # Only one user in five rates: an arm with fewer than 2 rating users has no feedback spread
    # between users, and the report says so instead of giving the difference an interval.
    raters = {
        arm: len(
            {s["user"] for s in sent.values() if s["arm"] == arm and s["feedback"] is not None}
        )
        for arm in users_per_arm
    }
    (diff,) = [c for c in report["comparisons"] if c["metric"] == "feedback"]
    if min(raters.values()) < 2:
        assert diff["diff"]["lo"] is None and diff["p_value"] is None
        assert diff["note"].startswith("not computed: 1 user with a value in arm")
        assert diff["note"] in text
    else:
        assert diff["diff"]["lo"] < diff["diff"]["hi"]
    users_line = next(line for line in text.splitlines() if line.startswith("users"))
    assert users_line.split()[1:] == [
        str(users_per_arm["control"]),
        str(users_per_arm["treatment"]),
    ]
    assert sum(a["requests"] for a in arms.values()) == N // 2  # beta's requests
