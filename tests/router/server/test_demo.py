"""The embedded demo (`cost-router serve` with no config): two real llama.cpp servers behind the
proxy; it answers, and SIGTERM stops the proxy and both child servers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.proxy import stop_process
from tests.support.waiting import wait_for

pytest.importorskip("llama_cpp")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def test_demo_serves_then_sigterm_stops_children(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "serve", "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the demo's server logs stay in tmp_path
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            if m := re.search(r"demo is ready at (http://\S+)", line):
                url = m.group(1)
        assert url, "demo did not print its URL"
        for _ in range(100):  # printed as soon as the socket listens; startup follows
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=60,
            json={
                "model": "auto",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hi"}],
            },
        )
        assert r.status_code == 200 and r.headers["x-router-tier"] in ("small", "large")
        kids = children_of(proc.pid)
        assert len(kids) == 2  # the two llama.cpp servers
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        wait_for(
            lambda: not [k for k in kids if alive(k)],
            timeout_s=10,
            what="both llama.cpp servers to exit",
        )
    finally:
        stop_process(proc)
