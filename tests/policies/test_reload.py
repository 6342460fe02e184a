"""Hot reload: a valid file swaps policies/experiments; a bad file keeps the old config; a file
is applied only once it has stopped changing; a reload logs what it changed."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.selection import PolicySelector
from router.config import RouterConfig, load_config
from router.proxy.build import build_selector
from router.proxy.reload import ConfigReloader, describe_changes
from tests.support.waiting import wait_for

TIERS = [
    {
        "name": "small",
        "base_url": "http://s",
        "model": "s",
        "price": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
    },
    {
        "name": "large",
        "base_url": "http://l",
        "model": "l",
        "price": {"input_per_mtok": 10, "output_per_mtok": 30},
    },
]


def _doc(threshold: float, **extra: Any) -> dict[str, Any]:
    return {
        "tiers": TIERS,
        "default_policy": "main",
        "policies": {"main": {"type": "threshold", "threshold": threshold}},
        **extra,
    }


class Holder:
    """Stands in for the app: what a request would read."""

    def __init__(self, path: Path) -> None:
        self.config = load_config(path)
        self.selector = build_selector(self.config)

    def apply(self, selector: PolicySelector, config: RouterConfig) -> None:
        self.selector, self.config = selector, config

    def threshold(self) -> float:
        return self.selector.policies["main"].threshold  # type: ignore[attr-defined]


@pytest.fixture()
def env(tmp_path: Path):
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_doc(0.5)))
    holder = Holder(path)
    # No quiet period: each check_file() applies what it sees (the debounce has its own tests).
    return (
        path,
        holder,
        ConfigReloader(path, lambda: holder.config, holder.apply, interval_s=0.05, debounce_s=0),
    )


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    # Make sure the mtime moves even on coarse-timestamp file systems.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


BAD_FILES = [
    ("tiers: [unclosed", "not valid YAML"),
    (yaml.safe_dump(_doc(1.7)), "policies.main.threshold"),
    (yaml.safe_dump({**_doc(0.5), "policies": {"main": {"type": "nope"}}}), "policies.main.type"),
    (yaml.safe_dump(_doc(0.5, teams={"red": {"policy": "ghost"}})), "teams.red.policy"),
    (
        yaml.safe_dump(
            {
                **_doc(0.5),
                "policies": {
                    "main": {
                        "type": "threshold",
                        "target_large_share": 0.3,
                        "reference_trace": "/nonexistent.jsonl",
                    }
                },
            }
        ),
        "policies.main.reference_trace",
    ),
]


@pytest.mark.parametrize(("text", "key"), BAD_FILES)
def test_bad_file_keeps_old_config(env, caplog, text: str, key: str) -> None:
    path, holder, reloader = env
    before = holder.selector
    _write(path, text)
    with caplog.at_level(logging.ERROR, logger="cost_router.reload"):
        assert asyncio.run(reloader.check_file()) is False
    assert holder.selector is before and holder.threshold() == 0.5
    assert "keeping the running config" in caplog.text and key in caplog.text
    # Fixing the file applies it.
    _write(path, yaml.safe_dump(_doc(0.3)))
    assert asyncio.run(reloader.check_file()) is True
    assert holder.threshold() == 0.3


def test_watcher_and_sighup(env) -> None:
    path, holder, reloader = env
    experiment = {"name": "e", "arms": {"a": {"policy": "main", "weight": 1}}}

    async def until(condition: Callable[[], object], what: str) -> None:
        # The reloader runs on this loop: wait in a thread so the loop keeps running it.
        await asyncio.to_thread(wait_for, condition, 10, what)

    async def scenario() -> None:
        reloader.start()
        try:
            _write(path, yaml.safe_dump(_doc(0.2, experiments=[experiment])))
            await until(lambda: reloader.reloads >= 1, "the watcher's reload of the edit")
            assert holder.threshold() == 0.2
            assert holder.selector.select("auto", team="t").experiment == "e"
            # SIGHUP reloads even when the file looks unchanged to the poller.
            holder.selector = build_selector(holder.config)
            before = holder.selector
            # Without our handler SIGHUP would end the test process: check it is installed.
            assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL
            os.kill(os.getpid(), signal.SIGHUP)
            await until(lambda: reloader.reloads >= 2, "the SIGHUP reload")
            assert reloader.reloads == 2 and holder.selector is not before
        finally:
            await reloader.stop()

    asyncio.run(scenario())


def test_touch_without_change_does_not_reload(env) -> None:
    path, _, reloader = env
    _write(path, path.read_text())
    assert asyncio.run(reloader.check_file()) is None
    assert reloader.reloads == 0


def test_non_routing_change_is_not_applied(env, caplog) -> None:
    path, holder, reloader = env
    doc = _doc(0.4)
    doc["server"] = {"port": 9999}
    _write(path, yaml.safe_dump(doc))
    with caplog.at_level(logging.WARNING, logger="cost_router.reload"):
        assert asyncio.run(reloader.check_file()) is True
    assert holder.threshold() == 0.4
    assert holder.config.server.port == 8080
    assert "server need a restart" in caplog.text


def test_sighup_reloads_real_server(tmp_path: Path) -> None:
    """`cost-router serve` in its own process: SIGHUP applies a good file, ignores a bad one."""
    import subprocess
    import sys

    import httpx

    from benchmarks.echo_upstream import running_echo_upstream
    from tests.support.ports import free_port
    from tests.support.proxy import stop_process, tier, wait_http

    def doc(fixed: str, url: str) -> str:
        return yaml.safe_dump(
            {
                "tiers": [tier("small", url, price=(1, 1)), tier("large", url, price=(10, 10))],
                "traces": {"path": str(tmp_path / "traces" / "requests.jsonl")},
                "signals": {"enabled": False},
                "default_policy": "a",
                "policies": {"a": {"type": "fixed", "tier": fixed}},
            }
        )

    with running_echo_upstream() as url:
        config_file = tmp_path / "router.yaml"
        config_file.write_text(doc("small", url))
        port = free_port()
        log = (tmp_path / "proxy.log").open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "router.cli",
                "serve",
                "--config",
                str(config_file),
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/healthz", 60, proc)

            def tier_now() -> str:
                r = httpx.post(
                    f"{base}/v1/chat/completions",
                    timeout=10,
                    json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
                )
                return r.headers["x-router-tier"]

            assert tier_now() == "small"
            config_file.write_text(doc("large", url))
            proc.send_signal(signal.SIGHUP)
            wait_for(
                lambda: tier_now() == "large", 10, "the SIGHUP reload to route to large", poll_s=0.1
            )
            config_file.write_text("policies: [broken")
            proc.send_signal(signal.SIGHUP)
            wait_for(
                lambda: "rejected" in (tmp_path / "proxy.log").read_text(),
                10,
                "the SIGHUP reload to reject the broken file",
            )
            assert tier_now() == "large"
            assert "keeping the running config" in (tmp_path / "proxy.log").read_text()
        finally:
            stop_process(proc)
            log.close()


def test_a_change_is_applied_only_once_the_file_stops_changing(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_doc(0.5)))
    holder = Holder(path)
    reloader = ConfigReloader(path, lambda: holder.config, holder.apply, debounce_s=0.3)
    _write(path, yaml.safe_dump(_doc(0.4)))
    assert asyncio.run(reloader.check_file()) is None and reloader.settling  # just seen: wait
    _write(path, yaml.safe_dump(_doc(0.3)))  # still being written: the quiet period restarts
    assert asyncio.run(reloader.check_file()) is None and holder.threshold() == 0.5
    applied: list[bool | None] = []
    wait_for(
        lambda: applied.append(asyncio.run(reloader.check_file())) or applied[-1],
        10,
        "the settled file to be applied",
    )
    assert holder.threshold() == 0.3 and reloader.reloads == 1 and not reloader.settling
    assert applied[:-1] and set(applied[:-1]) == {None}  # never before the quiet period ended


def test_reload_logs_what_changed_without_key_hashes(env, caplog) -> None:
    path, holder, reloader = env
    digest = "ab" * 32
    doc = _doc(
        0.3,
        teams={"red": {"policy": "main"}},
        keys=[{"key_sha256": digest, "team": "red", "name": "ci"}],
    )
    doc["policies"]["cheap"] = {"type": "fixed", "tier": "small"}
    _write(path, yaml.safe_dump(doc))
    with caplog.at_level(logging.INFO, logger="cost_router.reload"):
        assert asyncio.run(reloader.check_file()) is True
    line = next(r.getMessage() for r in caplog.records if "config reloaded" in r.getMessage())
    assert "teams +red" in line and f"keys +{digest[:16]}" in line
    assert "policies +cheap ~main" in line
    assert digest not in line  # the public key id (a hash prefix), never the whole hash
    before = holder.config
    doc["teams"] = {"blue": {}}
    doc["keys"] = [{"key_sha256": digest, "team": "blue"}]
    after = holder.config.model_validate(
        {**before.model_dump(mode="json"), "teams": doc["teams"], "keys": doc["keys"]}
    )
    assert describe_changes(before, after) == f"teams +blue -red; keys ~{digest[:16]}"
    assert describe_changes(before, before) == "no routing changes"


def test_a_file_written_in_two_steps_never_drops_teams_and_keys(tmp_path: Path) -> None:
    """The proxy polls its config file; a tool writes it in place in two steps, the first valid
    YAML without `teams:` and `keys:`. Requests keep succeeding and the final file is applied."""
    import threading

    import httpx

    from benchmarks.echo_upstream import running_echo_upstream
    from policies.keys import hash_key
    from tests.support.proxy import ProxyThread, tier

    key = "sk-test-reload"

    def doc(url: str, fixed: str, with_keys: bool) -> dict[str, Any]:
        data: dict[str, Any] = {
            "server": {"reload_debounce_s": 2.0},
            "tiers": [tier("small", url), tier("large", url, price=(10, 10))],
            "traces": {"path": str(tmp_path / "traces" / "requests.jsonl")},
            "signals": {"enabled": False},
            "auth": {"required": True},
            "default_policy": "a",
            "policies": {"a": {"type": "fixed", "tier": fixed}},
        }
        if with_keys:
            data["teams"] = {"alpha": {}}
            data["keys"] = [{"key_sha256": hash_key(key), "team": "alpha"}]
        return data

    with running_echo_upstream() as url:
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump(doc(url, "small", True)))
        with ProxyThread(load_config(path), config_path=path) as proxy:
            reloader: ConfigReloader = proxy.app.state.reloader
            statuses: list[tuple[int, str]] = []
            done = threading.Event()

            def load() -> None:
                with httpx.Client(base_url=proxy.url, timeout=10) as client:
                    while not done.is_set():
                        r = client.post(
                            "/v1/chat/completions",
                            headers={"authorization": f"Bearer {key}"},
                            json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
                        )
                        statuses.append((r.status_code, r.headers.get("x-router-tier", "")))

            worker = threading.Thread(target=load, daemon=True)
            worker.start()
            try:
                wait_for(lambda: len(statuses) >= 5, 20, "requests before the edit")
                final = yaml.safe_dump(doc(url, "large", True))
                first = yaml.safe_dump(doc(url, "large", False))  # valid, but no teams/keys yet
                with path.open("w") as fh:  # in place, as an editor or `cat > file` does
                    fh.write(first)
                    fh.flush()
                    # The watcher has seen the first step (or, without a debounce, applied it).
                    wait_for(
                        lambda: reloader.reloads > 0 or getattr(reloader, "settling", False),
                        20,
                        "the watcher to see the first step",
                    )
                    fh.seek(0)
                    fh.write(final)
                    fh.truncate()
                wait_for(lambda: statuses[-1] == (200, "large"), 20, "the final file to be applied")
            finally:
                done.set()
                worker.join(timeout=15)
    rejected = [s for s in statuses if s[0] != 200]
    assert not rejected, f"{len(rejected)} of {len(statuses)} requests failed: {rejected[:3]}"
    assert reloader.reloads == 1 and reloader.failures == 0
