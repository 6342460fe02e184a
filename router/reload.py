"""Hot reload of routing config (policies, experiments, default/team/key policy choice).

Triggered by SIGHUP or by the config file changing (polled: mtime, size, then content hash).
The new file is validated in full and its policies built (reference traces read, shares
converted) before anything changes; on any error the running config stays and the error is
logged. Only routing reloads: tiers, budgets, server, traces and classifier need a restart, and
a reload that changes them logs a warning and applies just its routing part, merged onto the
running config (so policies must name tiers that are running).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from policies.config import ConfigError
from policies.selection import PolicySelector
from router.config import RouterConfig, config_from_dict, load_config
from router.state import build_selector

log = logging.getLogger("cost_router.reload")

ROUTING_KEYS = ("default_policy", "policies", "experiments", "teams", "keys")


def merge_routing(running: RouterConfig, new: RouterConfig) -> RouterConfig:
    """The running config with the new file's routing sections; validated again as a whole."""
    merged = running.model_dump(mode="json")
    fresh = new.model_dump(mode="json")
    changed = [k for k in fresh if k not in ROUTING_KEYS and fresh[k] != merged.get(k)]
    if changed:
        log.warning("config reload: changes to %s need a restart; applying routing only",
                    ", ".join(sorted(changed)))
    for key in ROUTING_KEYS:
        merged[key] = fresh[key]
    return config_from_dict(merged, source="reloaded routing config", environ={})


class ConfigReloader:
    """Watches `path`; on a valid change calls `apply(selector, merged_config)`."""

    def __init__(
        self,
        path: str | Path,
        current: Callable[[], RouterConfig],
        apply: Callable[[PolicySelector, RouterConfig], None],
        interval_s: float = 2.0,
    ) -> None:
        self.path = Path(path)
        self._current = current
        self._apply = apply
        self.interval_s = interval_s
        self._stat: tuple[int, int, int] | None = None
        self._digest: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._signal_loop: asyncio.AbstractEventLoop | None = None
        self.reloads = 0  # successful reloads (for tests and /metrics)
        self.failures = 0
        self._remember_file()

    def _stat_now(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _remember_file(self) -> None:
        self._stat = self._stat_now()
        with contextlib.suppress(OSError):
            self._digest = hashlib.sha256(self.path.read_bytes()).hexdigest()

    def prepare(self) -> tuple[PolicySelector, RouterConfig]:
        """Load, validate and build (blocking; no effect on the running config)."""
        merged = merge_routing(self._current(), load_config(self.path))
        return build_selector(merged), merged

    async def reload(self, reason: str = "request") -> bool:
        """Validate and apply the file now. False (old config kept, error logged) if it is bad."""
        async with self._lock:
            self._remember_file()
            try:
                selector, merged = await asyncio.to_thread(self.prepare)
            except (ConfigError, ValueError, OSError) as exc:
                self.failures += 1
                log.error("config reload (%s) rejected, keeping the running config: %s",
                          reason, exc)
                return False
            self._apply(selector, merged)
            self.reloads += 1
            log.info("config reloaded (%s): %d policies, %d experiments", reason,
                     len(selector.policies), len(merged.experiments))
            return True

    async def check_file(self) -> bool | None:
        """Reload if the file changed since last seen; None when unchanged."""
        if self._stat_now() == self._stat:
            return None
        try:
            digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError as exc:
            log.error("config reload: cannot read %s: %s", self.path, exc)
            self._stat = self._stat_now()
            return False
        if digest == self._digest:
            self._stat = self._stat_now()  # touched, not changed
            return None
        return await self.reload("file changed")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check_file()
            except Exception:  # the watcher must outlive any one bad reload
                log.exception("config watcher error")

    def _on_sighup(self) -> None:
        asyncio.get_running_loop().create_task(self.reload("SIGHUP"))

    def start(self) -> None:
        """Start polling and listen for SIGHUP (when running in the main thread's loop)."""
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._watch())
        try:
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
            self._signal_loop = loop
        except (RuntimeError, ValueError, NotImplementedError):
            log.info("SIGHUP reload unavailable here (not the main thread); polling %s", self.path)

    async def stop(self) -> None:
        if self._signal_loop is not None:
            self._signal_loop.remove_signal_handler(signal.SIGHUP)
            self._signal_loop = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
