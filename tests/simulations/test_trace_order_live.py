"""The newcomer's path on the proxy's own trace folder (issue 25, items 5 and 6): the real proxy
under concurrent load in front of the echo upstream writes a rotated trace folder (a small
`traces.max_bytes`) in completion order; `grades import` gives it outcomes; `what-if` (with and
without `--arrival-rate`), `simulate --budgets` and `tune` then read it as written."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import yaml
from typer.testing import CliRunner

from benchmarks.echo_upstream import running_echo_upstream
from classifiers.dataset import load_dataset
from policies.keys import hash_key
from router.cli import app
from router.config import config_from_dict
from tests.support.proxy import ProxyThread, tier
from tests.support.sim import GSM8K
from tests.support.waiting import wait_for
from trace_format.reader import data_files

N = 48
runner = CliRunner()


def _cli(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def _lines(folder: Path) -> list[dict[str, Any]]:
    if not folder.exists():
        return []
    return [json.loads(line) for f in data_files(folder) for line in f.read_text().splitlines()]


def test_the_offline_commands_read_a_concurrent_rotated_proxy_trace(tmp_path: Path) -> None:
    ds = load_dataset([GSM8K])
    rng = np.random.default_rng(5)
    rows = rng.choice(len(ds), size=N, replace=False).tolist()
    # Later requests may finish sooner: completion order is not arrival order.
    delays = rng.uniform(0, 800, size=N).tolist()
    folder = tmp_path / "traces"
    with running_echo_upstream() as url:
        data: dict[str, Any] = {
            "tiers": [
                tier("small", url, price=(0.6, 0.6)),
                tier("large", url, price=(10.0, 30.0)),
            ],
            "traces": {
                "path": str(folder / "requests.jsonl"),
                "max_bytes": 4096,
                "backups": 40,
                "include_prompt": True,
            },
            "signals": {"enabled": False},
            "keys": [
                {"key_sha256": hash_key("sk-alpha"), "team": "alpha"},
                {"key_sha256": hash_key("sk-beta"), "team": "beta"},
            ],
            "teams": {"alpha": {}, "beta": {}},
        }
        with ProxyThread(config_from_dict(data, environ={})) as proxy:
            clients = {
                k: openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=k, max_retries=0)
                for k in ("sk-alpha", "sk-beta")
            }

            def send(j: int) -> tuple[str, int]:
                client = clients["sk-alpha" if j % 2 else "sk-beta"]
                raw = client.chat.completions.with_raw_response.create(
                    model="auto",
                    messages=[{"role": "user", "content": ds.prompts[rows[j]]}],
                    max_tokens=16,
                    extra_body={"echo": {"delay_ms": delays[j]}},
                )
                raw.parse()
                return raw.headers["x-router-request-id"], rows[j]

            with ThreadPoolExecutor(12) as pool:
                sent = list(pool.map(send, range(N)))
            wait_for(lambda: len(_lines(folder)) >= N, 10, f"{N} trace records on disk")
    files = data_files(folder)
    records = _lines(folder)
    times = [r["time"] for r in records]
    assert len(files) > 2 and len(records) == N
    assert times != sorted(times), "the proxy wrote these in arrival order: no test"

    grades = tmp_path / "grades.jsonl"
    grades.write_text(
        "".join(
            json.dumps(
                {"request_id": rid, "outcomes": {"small": ds.small[i], "large": ds.large[i]}}
            )
            + "\n"
            for rid, i in sent
        )
    )
    code, out = _cli("grades", "import", str(grades), "--traces", str(folder))
    assert code == 0, out
    # Offline, alpha gets a budget it runs out of.
    data["teams"]["alpha"] = {"budget": {"limit_usd": 0.0005, "period": "daily"}}
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump(data))
    for extra in ((), ("--arrival-rate", "20")):
        code, out = _cli("what-if", "-t", str(folder), "-c", str(config), *extra)
        assert code == 0, out
        assert f"{N} requests, the trace's arrival times" in out
    out_json = tmp_path / "budgets.json"
    code, out = _cli(
        "simulate", "-t", str(folder), "-c", str(config), "--budgets", "--json", str(out_json)
    )
    assert code == 0, out
    budgets = {b["team"]: b for b in json.loads(out_json.read_text())["budgets"]}
    assert budgets["alpha"]["requests"] + budgets["beta"]["requests"] == N
    code, out = _cli("tune", "-t", str(folder), "-c", str(config), "--max-large-share", "0.5")
    assert code == 0, out
    assert f"{N} requests" in out
