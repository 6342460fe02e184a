"""Hot reload of routing config (policies, experiments, default/team/key policy choice).

Triggered by SIGHUP or by the config file changing (polled: mtime, size, then content hash). A
changed file is applied only once it has stopped changing: the same stat and content hash for
`debounce_s` (server.reload_debounce_s), so an editor or a tool writing the file in several steps
is never applied half-written (docs/deployment.md: replace the file atomically); what is parsed
is the very bytes seen unchanged, never a second read a writer may have cut. The new file is
validated in full and its policies built (reference traces read, shares converted) before
anything changes; on any error the running config stays and the error is logged. A reload may
not take a limit away (`lost_limits`): one that drops a team's section without listing it under
`removed_teams`, or lifts a limit a team or key keeps, is refused like an invalid file, so a file
cut after its first team (written in place with a pause longer than the quiet period) never
leaves the other teams unlimited (docs/budgets.md, "Reloads that remove a team"). A reload logs
what it changed (sections, and the names of teams, keys, policies and experiments; never a key's
hash). Routing reloads, and so does the classifier section: the app's `build` loads the models
the new file names (router/proxy/build.py build_routing: a changed or replaced model file is loaded
again, off the event loop) before the swap. The `evaluation:` section reloads too (the shadow
service is reconfigured in place: router/learning/shadow.py `reload_shadow`); its judge
prompt file is read and checked here, before anything changes. Tiers, budgets, server and
traces need a restart, and a reload that changes them logs a warning and applies just its
routing part, merged onto the running config (so policies must name tiers that are running).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from policies.config import BudgetLimit
from policies.keys import key_id_of
from router.config import RouterConfig, config_from_dict, config_from_yaml
from router.learning.judges.prompt import load_prompt
from router.proxy.build import build_selector
from trace_format.config_base import ConfigError
from trace_format.tasks import stop_tasks

log = logging.getLogger("cost_router.reload")

Stat = tuple[int, int, int]  # a file's (mtime_ns, size, inode)

ROUTING_KEYS = (
    "default_policy",
    "policies",
    "experiments",
    "teams",
    "removed_teams",
    "keys",
    "classifier",
    "evaluation",
)


def merge_routing(running: RouterConfig, new: RouterConfig) -> RouterConfig:
    """The running config with the new file's routing sections; validated again as a whole."""
    merged = running.model_dump(mode="json")
    fresh = new.model_dump(mode="json")
    changed = [k for k in fresh if k not in ROUTING_KEYS and fresh[k] != merged.get(k)]
    if changed:
        log.warning(
            "config reload: changes to %s need a restart; applying routing only",
            ", ".join(sorted(changed)),
        )
    for key in ROUTING_KEYS:
        merged[key] = fresh[key]
    return config_from_dict(merged, source="reloaded routing config", environ={})


# The limits a budget may set; a reload must not unset one (lost_limits).
LIMIT_FIELDS = ("limit_usd", "rpm", "tpm")


def _lifted(was: BudgetLimit | None, now: BudgetLimit | None) -> list[str]:
    """The limits of `was` that `now` no longer sets ("budget" when the whole block goes: even
    an empty one makes the store's overrides apply)."""
    if was is None:
        return []
    if now is None:
        return ["budget"]
    return [
        f"budget.{f}"
        for f in LIMIT_FIELDS
        if getattr(was, f) is not None and getattr(now, f) is None
    ]


def lost_limits(running: RouterConfig, new: RouterConfig) -> list[str]:
    """What `new` would take away that only an operator may, one line each (empty: nothing).

    Fail closed: a team's run-time keys outlive its section, and a key of a team without one
    is admitted with no limit. So a team's section may go only when `new` lists the team under
    `removed_teams` (its keys are then refused), a limit a team or a config key keeps may not be
    unset (raise it instead, or restart), and a team may not leave `removed_teams` unless it
    comes back under `teams` (its keys would be admitted again, unlimited)."""
    problems: list[str] = []
    removed = set(new.removed_teams)
    for name, team in running.teams.items():
        if name in new.teams:
            lifted = _lifted(team.budget, new.teams[name].budget)
            problems += [f"teams.{name}.{what}: would be lifted" for what in lifted]
        elif name not in removed:
            problems.append(f"teams.{name}: dropped, but not listed under removed_teams")
    now_keys = {k.key_sha256: k for k in new.keys}
    for key in running.keys:
        kept = now_keys.get(key.key_sha256)
        if kept is not None:
            lifted = _lifted(key.budget, kept.budget)
            problems += [f"keys {key_id_of(key.key_sha256)}: {w} would be lifted" for w in lifted]
    problems += [
        f"removed_teams: {name} dropped while not under teams (its keys would be admitted "
        "without a limit)"
        for name in running.removed_teams
        if name not in removed and name not in new.teams
    ]
    return problems


def _named(section: str, value: Any) -> dict[str, Any]:
    """A routing section as name -> entry. Keys are named by their public id (a hash prefix)."""
    if isinstance(value, Mapping):
        return dict(value)
    if section == "removed_teams":
        return {name: name for name in value}
    if section == "keys":
        return {key_id_of(k["key_sha256"]): k for k in value}
    if section == "experiments":
        return {e["name"]: e for e in value}
    return {"": value}


def describe_changes(old: RouterConfig, new: RouterConfig) -> str:
    """A one-line summary of what differs between two configs' routing sections, e.g.
    `teams +red -blue ~green; keys +3f9a0c...; default_policy main -> cheap`."""
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    parts = []
    for section in ROUTING_KEYS:
        a, b = before[section], after[section]
        if a == b:
            continue
        if section == "default_policy":
            parts.append(f"default_policy {a} -> {b}")
            continue
        was, now = _named(section, a), _named(section, b)
        marks = [f"+{n}" for n in now if n not in was]
        marks += [f"-{n}" for n in was if n not in now]
        marks += [f"~{n}" for n in now if n in was and now[n] != was[n]]
        parts.append(f"{section} {' '.join(marks)}")
    return "; ".join(parts) or "no routing changes"


class ConfigReloader:
    """Watches `path`; on a valid change calls `apply(build(merged_config), merged_config)`.

    `build` (default: the policies alone, router.proxy.build.build_selector) runs in a worker thread
    and returns something with the built `policies`; the app's builds its models too."""

    def __init__(
        self,
        path: str | Path,
        current: Callable[[], RouterConfig],
        apply: Callable[[Any, RouterConfig], None],
        interval_s: float = 2.0,
        debounce_s: float = 1.0,
        build: Callable[[RouterConfig], Any] = build_selector,
    ) -> None:
        self.path = Path(path)
        self._current = current
        self._apply = apply
        self._build = build
        self.interval_s = interval_s
        self.debounce_s = debounce_s
        self._stat: Stat | None = None
        self._digest: str | None = None
        # A change seen but not applied yet: ((stat, digest), monotonic time first seen).
        self._pending: tuple[tuple[Stat | None, str], float] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._signal_loop: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.reloads = 0  # successful reloads (for tests and /metrics)
        self.failures = 0
        self.last_error: str | None = None  # why the last reload was rejected (None: applied)
        self._remember_file()

    @property
    def settling(self) -> bool:
        """A change was seen and waits for its quiet period before it is applied."""
        return self._pending is not None

    def _stat_now(self) -> Stat | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _remember_file(self) -> None:
        self._stat = self._stat_now()
        self._pending = None
        with contextlib.suppress(OSError):
            self._digest = hashlib.sha256(self.path.read_bytes()).hexdigest()

    def prepare(self, data: bytes | None = None) -> tuple[Any, RouterConfig]:
        """Validate and build the file's content `data` (default: read now); blocking, no effect
        on the running config. Raises ConfigError when the file is bad or takes a limit away."""
        if data is None:
            data = self.path.read_bytes()
        running = self._current()
        merged = merge_routing(running, config_from_yaml(data.decode("utf-8"), self.path))
        lost = lost_limits(running, merged)
        if lost:
            raise ConfigError(
                f"{self.path} would take limits away: {'; '.join(lost)}. Remove a team on "
                "purpose by listing it under removed_teams (its keys are then refused); lift "
                "a limit by restarting with the file (docs/budgets.md)"
            )
        llm = merged.evaluation.judges.llm
        if merged.evaluation.enabled and llm is not None:
            load_prompt(llm.mode, llm.prompt)  # a missing or broken prompt file rejects the file
        return self._build(merged), merged

    async def reload(
        self, reason: str = "request", seen: tuple[Stat | None, bytes] | None = None
    ) -> bool:
        """Validate and apply the file now (or `seen`: its stat and the content read with it).
        False (old config kept, error logged) if it is bad or takes a limit away."""
        async with self._lock:
            running = self._current()
            try:
                # The stat before the read: a write that lands during it shows up as a change.
                stat, data = (
                    seen if seen is not None else (self._stat_now(), self.path.read_bytes())
                )
                # Remembered, applied or not: a rejected file is not retried until it changes.
                self._stat, self._digest = stat, hashlib.sha256(data).hexdigest()
                self._pending = None
                built, merged = await asyncio.to_thread(self.prepare, data)
            except (ConfigError, ValueError, OSError) as exc:
                self.failures += 1
                self.last_error = str(exc)
                log.error(
                    "config reload (%s) rejected, keeping the running config: %s", reason, exc
                )
                return False
            self._apply(built, merged)
            self.reloads += 1
            self.last_error = None
            log.info(
                "config reloaded (%s): %s; %d policies, %d experiments",
                reason,
                describe_changes(running, merged),
                len(built.policies),
                len(merged.experiments),
            )
            return True

    async def check_file(self) -> bool | None:
        """Reload if the file changed since last applied and has then stayed the same (stat and
        content) for `debounce_s`. None when unchanged or still settling; else reload()'s result."""
        stat = self._stat_now()
        if stat == self._stat and self._pending is None:
            return None
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            log.error("config reload: cannot read %s: %s", self.path, exc)
            self._stat, self._pending = stat, None
            return False
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest:
            self._stat, self._pending = stat, None  # touched, or changed back
            return None
        seen, now = (stat, digest), time.monotonic()
        if self._pending is None or self._pending[0] != seen:
            self._pending = (seen, now)  # (re)start the quiet period
            if self.debounce_s > 0:
                log.debug(
                    "config file %s changed; applying once unchanged for %.1f s",
                    self.path,
                    self.debounce_s,
                )
                return None
        elif now - self._pending[1] < self.debounce_s:
            return None
        # These bytes are the ones seen unchanged for the quiet period: parse them, not a new read.
        return await self.reload("file changed", (stat, data))

    def _next_poll_s(self) -> float:
        if self._pending is None:
            return self.interval_s
        # Settling: look again when the quiet period ends (and once within it, to see writes).
        return max(0.01, min(self.interval_s, self.debounce_s / 2))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._next_poll_s())
            try:
                await self.check_file()
            except Exception:  # the watcher must outlive any one bad reload
                log.exception("config watcher error")

    def request_reload(self, reason: str = "request") -> concurrent.futures.Future[bool]:
        """reload() on the reloader's own loop, from any other thread (an embedding program, a
        test); the future has reload()'s result."""
        if self._loop is None:
            raise RuntimeError("the reloader is not started")
        return asyncio.run_coroutine_threadsafe(self.reload(reason), self._loop)

    def _on_sighup(self) -> None:
        asyncio.get_running_loop().create_task(self.reload("SIGHUP"))

    def start(self) -> None:
        """Start polling and listen for SIGHUP (when running in the main thread's loop)."""
        loop = self._loop = asyncio.get_running_loop()
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
        await stop_tasks(self._task)
        self._task = None
