"""Shared pieces of the budget tests: real Redis stores under a random key prefix, cleaned up."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.support.ports import free_port

REDIS_URL = os.environ.get("COST_ROUTER_TEST_REDIS", "redis://127.0.0.1:6379/0")


def random_prefix() -> str:
    return "test-" + uuid.uuid4().hex[:12]


def delete_prefix(prefix: str, url: str = REDIS_URL) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


class ManualClock:
    """A budget store's clock that moves only when the test moves it (starts at the real time,
    so period ids look like today's)."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wait_for_redis_time(client: redis.Redis, seconds: float, timeout_s: float = 10.0) -> None:
    """Return once the Redis server's own clock (what lease expiry is measured by) has moved
    `seconds` past now; a deadline instead of a fixed sleep, and no trust in the local clock."""

    def server_now() -> float:
        secs, micros = client.time()
        return secs + micros / 1e6

    target = server_now() + seconds
    deadline = time.monotonic() + timeout_s
    while server_now() <= target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Redis time did not advance {seconds}s within {timeout_s}s")
        time.sleep(0.005)


@contextmanager
def private_redis(tmp: Path) -> Iterator[PrivateRedis]:
    """A second redis-server on a free port with AOF on (appendfsync always), in `tmp`.

    Tests stop and restart this one; the shared server on 6379 is never touched.
    """
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed")
    server = PrivateRedis(tmp, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _end(proc: subprocess.Popen[bytes] | None, kill: bool = False, timeout_s: float = 10) -> None:
    """Stop a child we started: SIGKILL at once (`kill`), or SIGTERM then SIGKILL after a wait."""
    if proc is None or proc.poll() is not None:
        return
    if kill:
        proc.kill()
    else:
        proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class PrivateRedis:
    def __init__(self, directory: Path, port: int) -> None:
        self.dir = directory
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    client.close()
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"private redis on {self.port} did not start")

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything beyond what appendfsync already wrote."""
        _end(self.proc, kill=True)

    def stop(self) -> None:
        _end(self.proc)


class Proxy:
    """`cost-router serve --config FILE --port 0` as a subprocess (SIGKILL-able)."""

    def __init__(
        self, config_path: Path, log_dir: Path, name: str, env: dict[str, str] | None = None
    ) -> None:
        """env: variables set for this process only (a replica's `COST_ROUTER__TRACES__PATH`)."""
        self.config_path = config_path
        self.env = env or {}
        self.out = log_dir / f"{name}.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout_s: float = 60.0) -> Proxy:
        import sys

        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "router.cli",
                    "serve",
                    "--config",
                    str(self.config_path),
                    "--port",
                    "0",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.out.read_text(errors="replace")
            if "listening on " in text:
                self.url = text.split("listening on ", 1)[1].split()[0]
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited: {text[-2000:]}")
            time.sleep(0.05)
        else:
            raise RuntimeError("proxy did not start")
        import httpx

        while time.monotonic() < deadline:  # the socket is bound before the app is ready
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited: {self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("proxy did not become healthy")

    def kill(self) -> None:
        _end(self.proc, kill=True)

    def stop(self) -> None:
        _end(self.proc, timeout_s=15)

    def log(self) -> str:
        return self.out.read_text(errors="replace")


@contextmanager
def proxies(configs: list[Path], log_dir: Path) -> Iterator[list[Proxy]]:
    started: list[Proxy] = []
    try:
        for i, cfg in enumerate(configs):
            started.append(Proxy(cfg, log_dir, f"proxy{i}").start())
        yield started
    finally:
        for p in started:
            p.stop()
