"""The embedded demo (`cost-router serve` with no config): two real llama.cpp servers behind the
proxy; it answers, and SIGTERM stops the proxy and both child servers."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from router.cli import app
from router.server.demo import example_python, usage_text
from tests.support.ports import free_port
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
    small_port, large_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "router.cli",
            "serve",
            "--port",
            "0",
            "--tier-ports",
            f"{small_port},{large_port}",
        ],
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
        usage = []
        while not (line := proc.stdout.readline()).startswith("Traces:"):
            usage.append(line)
        # The example names the interpreter that has the openai client: the demo's own.
        assert f"  {sys.executable} - <<'EOF'" in "".join(usage), "".join(usage)
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
        for tier_port in (small_port, large_port):  # on the ports --tier-ports named
            models = httpx.get(f"http://127.0.0.1:{tier_port}/v1/models", timeout=5)
            assert models.status_code == 200
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        wait_for(
            lambda: not [k for k in kids if alive(k)],
            timeout_s=10,
            what="both llama.cpp servers to exit",
        )
    finally:
        stop_process(proc)


REPO = Path(__file__).resolve().parents[3]


def _serve(*args: str) -> Result:
    """`cost-router serve ARGS` in process: each case below ends before any server starts."""
    return CliRunner().invoke(app, ["serve", *args])


def test_tier_ports_in_use_or_malformed_are_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    """Checked before a server starts (no llama.cpp is launched): fast."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = _serve("--port", "0", "--tier-ports", f"{busy},{free_port()}")
    assert done.exit_code == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error:") and str(busy) in line and "small tier" in line, line
    assert "--tier-ports SMALL,LARGE" in line and "SMALL_PORT" in line, line
    for bad in ("8101,x", "8101,8101"):
        done = _serve("--tier-ports", bad)
        assert done.exit_code == 2 and done.stderr.startswith("error: --tier-ports"), done.stderr
    config = tmp_path / "router.yaml"
    config.write_text("tiers: []\n")
    done = _serve("--config", str(config), "--tier-ports", "1,2")
    assert done.exit_code == 2 and "--tier-ports is for the embedded demo" in done.stderr


def test_make_demo_passes_the_ports() -> None:
    if shutil.which("make") is None:
        pytest.skip("no make")
    dry = subprocess.run(
        ["make", "-n", "demo", "PORT=9080", "SMALL_PORT=9101", "LARGE_PORT=9102"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    recipe = " ".join(dry.stdout.replace("\\\n", " ").split())
    assert "cost-router serve --port 9080 --tier-ports 9101,9102" in recipe, dry.stdout
    only_large = subprocess.run(
        ["make", "-n", "demo", "LARGE_PORT=9102"], cwd=REPO, capture_output=True, text=True
    )
    recipe = " ".join(only_large.stdout.replace("\\\n", " ").split())
    assert "cost-router serve --tier-ports 8101,9102" in recipe, only_large.stdout


def test_the_python_example_names_the_venv_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "executable", str(REPO / ".venv" / "bin" / "python"))
    assert example_python() == ".venv/bin/python"
    assert "  .venv/bin/python - <<'EOF'" in usage_text("http://127.0.0.1:8080")
