"""The Redis store on a Redis Cluster (`budgets.store: redis-cluster`).

The scripts and key layout are the single-Redis store's: every key a script or a multi-key
command touches carries one team's hash tag (`codec.py`), so each runs on the one master that
owns the team's slot. The scripts run on a plain client of their own per master, found in a slot
map this store keeps (CLUSTER SLOTS), not through redis-py's cluster client: that client shares
its connections' fate across nodes (on CLUSTERDOWN it closes every node's connections, those in
use by other tasks included, and on a node's connection error it re-maps for every caller), so
one master's failover reached teams on masters that stayed up (issue 24). Here a master's
trouble touches only its own client: when a script fails in a way that means the store is
unavailable, the map is read again, and a slot that changed hands (a failover, MOVED) is tried
once on its new owner. The cluster client still serves readiness, the key store and the
operator commands. What a failover can lose, and how `budgets.redis_wait_replicas` bounds it:
docs/budgets.md.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from policies.budgets.redis_store import (
    NotReplicated,
    RedisBudgetStore,
    StoreUnreachable,
    connection_options,
    store_unavailable,
)
from policies.budgets.store import BudgetUnavailable
from policies.config import BudgetsConfig

log = logging.getLogger("cost_router.budgets.redis")

SLOTS = 16384
# Many requests of a failed master's teams fail at once: they share one read of the slot map,
# and the map is read at most this often.
MIN_REMAP_S = 0.05

Node = tuple[str, int]  # (host, port)


class RedisClusterBudgetStore(RedisBudgetStore):
    kind = "redis-cluster"

    def __init__(self, settings: BudgetsConfig, client: Any | None = None, **kwargs: Any) -> None:
        super().__init__(settings, client, **kwargs)
        seed = urlsplit(settings.redis_url)
        self._seed: Node = (seed.hostname or "127.0.0.1", seed.port or 6379)
        # One plain client per node (host, port): the scripts of the teams it is master for.
        self._nodes: dict[Node, aioredis.Redis] = {}
        # The slot map: the first slot of each range (sorted) and the range's last slot and
        # master. Nodes seen in the map (masters and replicas) are where it is read again.
        self._starts: list[int] = []
        self._ranges: list[tuple[int, Node]] = []
        self._known: list[Node] = []
        self._answered: list[Node] = []
        self._mapped_at = float("-inf")
        self._map_lock = asyncio.Lock()
        self.remaps = 0  # reads of the slot map after the first (failovers, MOVED)

    def _connect(self, settings: BudgetsConfig) -> Any:
        return RedisCluster.from_url(
            settings.redis_url, require_full_coverage=True, **connection_options(settings)
        )

    def _client(self, node: Node) -> aioredis.Redis:
        client = self._nodes.get(node)
        if client is None:
            # The seed URL with this node's address: same credentials, TLS and timeouts.
            parts = urlsplit(self.settings.redis_url)
            userinfo, at, _ = parts.netloc.rpartition("@")
            host, port = node
            url = urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}:{port}", path="/0"))
            client = aioredis.Redis.from_url(url, **connection_options(self.settings))
            self._nodes[node] = client
        return client

    async def _owner(self, key: str) -> Node:
        """The master that owns `key`'s slot, by the last slot map read."""
        if not self._ranges:
            await self._remap(float("-inf"))
        slot = key_slot(key.encode())
        i = bisect.bisect_right(self._starts, slot) - 1
        if i < 0 or slot > self._ranges[i][0]:
            raise StoreUnreachable(f"slot {slot} is served by no master")
        return self._ranges[i][1]

    async def _remap(self, failed_at: float) -> None:
        """Read the slot map again, unless it was read since `failed_at` (another request's
        failure did it) or within MIN_REMAP_S. Asks the nodes it knows, the seed first, until
        one answers (the one that answered last first, the seed last: it may be the node that
        died); raises StoreUnreachable when none does."""
        async with self._map_lock:
            now = time.monotonic()
            if self._mapped_at > failed_at or now - self._mapped_at < MIN_REMAP_S:
                return
            last: BaseException | None = None
            for node in dict.fromkeys([*self._answered, *self._known, self._seed]):
                try:
                    reply = await self._client(node).execute_command("CLUSTER", "SLOTS")
                except Exception as exc:
                    if not store_unavailable(exc):
                        raise
                    last = exc
                    continue
                self._install(reply, node)
                self._answered = [node]
                return
            self._answered = []
            raise StoreUnreachable(f"no cluster node answered CLUSTER SLOTS: {last}") from last

    def _install(self, reply: list[Any], asked: Node) -> None:
        ranges: list[tuple[int, int, Node]] = []
        known: dict[Node, None] = {}
        for first, last, *nodes in reply:
            members = [(_text(n[0]) or asked[0], int(n[1])) for n in nodes]
            ranges.append((int(first), int(last), members[0]))
            known.update(dict.fromkeys(members))
        ranges.sort()
        if self._ranges:
            self.remaps += 1
        self._starts = [r[0] for r in ranges]
        self._ranges = [(r[1], r[2]) for r in ranges]
        self._known = list(known)
        self._mapped_at = time.monotonic()

    async def _run_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        node = await self._owner(keys[0])
        tried_at = time.monotonic()
        try:
            return await self._run_on(self._client(node), name, keys, args)
        except NotReplicated:
            raise
        except Exception as exc:
            if not store_unavailable(exc):
                raise
            # A failover or a resharding moves a slot (MOVED, READONLY, or its old master is
            # gone): ask the cluster who owns it now, and try once there. The scripts are
            # idempotent by request id, so one that ran before its answer was lost runs again
            # harmlessly. Its old owner down with no new one yet: the error stands (an outage).
            await self._remap(tried_at)
            owner = await self._owner(keys[0])
            if owner == node:
                raise
            log.warning(
                "%s of %s: slot moved from %s:%d to %s:%d (%s); trying there",
                name,
                args[0],
                *node,
                *owner,
                type(exc).__name__,
            )
            return await self._run_on(self._client(owner), name, keys, args)

    async def ping(self) -> bool:
        """Ready only when the cluster says cluster_state:ok with every slot served, and every
        master the client routes to answers. A reason is logged when not."""
        try:
            info = await self.redis.cluster_info()
            state = str(info.get("cluster_state", "?"))
            slots_ok = int(info.get("cluster_slots_ok", 0))
            if state != "ok" or slots_ok != SLOTS:
                raise BudgetUnavailable(
                    f"cluster_state {state}, {slots_ok} of {SLOTS} slots served"
                )
            await self.redis.ping(target_nodes=RedisCluster.PRIMARIES)
        except BudgetUnavailable as exc:
            log.warning("budget store not ready: %s", exc)
            return False
        except Exception as exc:
            if not store_unavailable(exc):
                raise
            log.warning("budget store not ready: %s: %s", type(exc).__name__, exc)
            return False
        return True

    async def aclose(self) -> None:
        await super().aclose()
        for client in self._nodes.values():
            await client.aclose()
        self._nodes.clear()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
