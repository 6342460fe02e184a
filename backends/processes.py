"""Runs launch plans as child processes, waits until each answers GET /v1/models, stops them all.

Each child gets its own process group so stopping it also stops the workers it spawned (vLLM
starts an engine-core process per server). Output goes to a log file per tier rather than a pipe:
a chatty server would otherwise block once the pipe buffer filled.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from backends.launch import LaunchError, LaunchPlan

log = logging.getLogger(__name__)

ENGINE_MODULES = {"vllm": "vllm", "llama_cpp": "llama_cpp"}


def engine_available(engine: str) -> tuple[bool, str]:
    """Whether this machine can run `engine`, without importing it (vLLM imports take seconds)."""
    module = ENGINE_MODULES[engine]
    if importlib.util.find_spec(module) is None:
        extra = "vllm" if engine == "vllm" else "demo"
        return False, f"{module} is not installed (pip install 'cost-router[{extra}]')"
    if engine == "vllm" and _vllm_executable() is None:
        return False, "vllm is importable but the `vllm` command is not on PATH"
    return True, "installed"


def _vllm_executable() -> str | None:
    beside = Path(sys.executable).parent / "vllm"
    return str(beside) if beside.exists() else shutil.which("vllm")


def runnable_argv(plan: LaunchPlan) -> list[str]:
    if plan.argv[0] == "vllm":
        exe = _vllm_executable()
        if exe is None:
            raise LaunchError(f"tier {plan.tier!r}: the `vllm` command is not on PATH")
        return [exe, *plan.argv[1:]]
    return list(plan.argv)


def probe_ready(base_url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """One GET {base_url}/models: the readiness check every OpenAI-compatible server answers."""
    try:
        resp = httpx.get(f"{base_url}/models", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if resp.status_code == 200:
        return True, "ready"
    return False, f"GET /models answered {resp.status_code}"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ServerGroup:
    """Context manager: start every plan, wait for readiness, stop all children on exit."""

    def __init__(self, plans: list[LaunchPlan], log_dir: Path) -> None:
        self.plans = plans
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, tier: str) -> Path:
        return self.log_dir / f"{tier}.log"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for plan in self.plans:
            argv = runnable_argv(plan)
            with self.log_path(plan.tier).open("wb") as out:
                self.procs[plan.tier] = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **plan.env},
                    start_new_session=True,
                )
            log.info(
                "started tier %s (pid %d): %s", plan.tier, self.procs[plan.tier].pid, plan.shell()
            )

    def wait_ready(self, poll_s: float = 0.5) -> None:
        """Blocks until every server answers GET /v1/models; raises LaunchError on exit/timeout."""
        pending = {p.tier: p for p in self.plans}
        started = time.monotonic()
        while pending:
            for tier, plan in list(pending.items()):
                self._check_alive(tier)
                if probe_ready(plan.base_url)[0]:
                    log.info("tier %s ready at %s", tier, plan.base_url)
                    del pending[tier]
                elif time.monotonic() - started > plan.ready_timeout_s:
                    raise LaunchError(
                        f"tier {tier!r}: not ready after {plan.ready_timeout_s:.0f}s; "
                        f"log {self.log_path(tier)}:\n{_tail(self.log_path(tier))}"
                    )
            if pending:
                time.sleep(poll_s)

    def _check_alive(self, tier: str) -> None:
        code = self.procs[tier].poll()
        if code is not None:
            raise LaunchError(
                f"tier {tier!r}: server exited with status {code} before it was ready; "
                f"log {self.log_path(tier)}:\n{_tail(self.log_path(tier))}"
            )

    def stop(self, grace_s: float = 10.0) -> None:
        for tier, proc in self.procs.items():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
                log.info("stopping tier %s (pid %d)", tier, proc.pid)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    def __enter__(self) -> ServerGroup:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The child leads its own session (start_new_session), so its pid is its group id.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
