"""The Redis store on a Redis Cluster (`budgets.store: redis-cluster`), through redis-py's
cluster client.

The scripts and key layout are the single-Redis store's: every key a script or a multi-key
command touches carries one team's hash tag (`codec.py`), so each runs on the one master that
owns the team's slot, and the client follows MOVED/ASK redirections and refreshes its slot map
after a failover. Script objects load a script on whichever master answers NOSCRIPT. What a
failover can lose, and how `budgets.redis_wait_replicas` bounds it: docs/budgets.md.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from policies.budgets.redis_store import (
    DURABLE,
    UNREACHABLE,
    NotReplicated,
    RedisBudgetStore,
    connection_options,
    transport_race,
)
from policies.budgets.store import BudgetUnavailable
from policies.config import BudgetsConfig

log = logging.getLogger("cost_router.budgets.redis")

SLOTS = 16384


class RedisClusterBudgetStore(RedisBudgetStore):
    kind = "redis-cluster"

    def __init__(self, settings: BudgetsConfig, client: Any | None = None, **kwargs: Any) -> None:
        super().__init__(settings, client, **kwargs)
        # One plain client per master (host, port), for the WAIT of budgets.redis_wait_replicas.
        self._nodes: dict[tuple[str, int], aioredis.Redis] = {}

    def _connect(self, settings: BudgetsConfig) -> Any:
        return RedisCluster.from_url(
            settings.redis_url, require_full_coverage=True, **connection_options(settings)
        )

    def _node_client(self, key: str) -> Any:
        node = self.redis.get_node_from_key(key)
        client = self._nodes.get((node.host, node.port))
        if client is None:
            # The seed URL with this node's address: same credentials, TLS and timeouts.
            parts = urlsplit(self.settings.redis_url)
            userinfo, at, _ = parts.netloc.rpartition("@")
            url = urlunsplit(parts._replace(netloc=f"{userinfo}{at}{node.host}:{node.port}"))
            client = aioredis.Redis.from_url(
                url, **{**connection_options(self.settings), "max_connections": 64}
            )
            self._nodes[(node.host, node.port)] = client
        return client

    async def _run_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if not self.settings.redis_wait_replicas or name not in DURABLE:
            return await super()._run_script(name, keys, args)
        try:
            await self.redis.initialize()  # a no-op once the client has its slot map
            return await super()._run_script(name, keys, args)
        except NotReplicated:
            raise
        except (RedisError, RedisClusterException, AttributeError, TypeError) as exc:
            if isinstance(exc, (AttributeError, TypeError)) and not transport_race(exc):
                raise
            # MOVED (the slot changed hands: a failover) or the node went away. Run the script
            # through the cluster client, which follows the redirection and refreshes its slot
            # map (both scripts are idempotent by request id); that run is not WAITed, so it
            # counts as not replicated and the next try WAITs on the new master.
            log.warning(
                "%s of %s: node of the team's slot answered %s; retrying through the "
                "cluster client",
                name,
                args[0],
                type(exc).__name__,
            )
            await self._scripts[name](keys=keys, args=args)
            self.unreplicated += 1
            raise NotReplicated(f"{name} of {args[0]} ran on a new master unconfirmed") from exc

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
        except UNREACHABLE as exc:
            log.warning("budget store not ready: %s: %s", type(exc).__name__, exc)
            return False
        return True

    async def aclose(self) -> None:
        await super().aclose()
        for client in self._nodes.values():
            await client.aclose()
        self._nodes.clear()
