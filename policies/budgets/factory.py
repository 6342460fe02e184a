"""The one place that builds the configured budget store and, next to it, the run-time key store.

Run-time API keys live where the budgets live: in Redis when the budget store is Redis or a Redis
Cluster (sharing its client), in process otherwise. Adding a store kind is one builder in
STORE_KINDS plus its kit in `KITS` of tests/policies/budgets/test_store_conformance.py (the
suite fails without one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from policies.budgets.memory import InMemoryBudgetStore
from policies.budgets.store import BudgetStore, Clock
from policies.config import BudgetsConfig
from policies.keys import InMemoryKeyStore, KeyStore, RedisKeyStore
from trace_format.config_base import ConfigError

log = logging.getLogger("cost_router.budgets")

Stores = tuple[BudgetStore, KeyStore]


def _memory(settings: BudgetsConfig, clock: Clock) -> Stores:
    return InMemoryBudgetStore(settings.lease_s, settings.timezone, clock), InMemoryKeyStore()


def _redis(settings: BudgetsConfig, clock: Clock) -> Stores:
    # Imported here: the embedded default (store: memory) never loads redis-py.
    from policies.budgets.redis_store import RedisBudgetStore

    log.info(
        "budgets: Redis store at %s (prefix %r, fail_mode %s, lease %.0fs)",
        _redacted(settings.redis_url),
        settings.key_prefix,
        settings.fail_mode,
        settings.lease_s,
    )
    store = RedisBudgetStore(settings, clock=clock)
    return store, RedisKeyStore(store.redis, settings.key_prefix)


def _redis_cluster(settings: BudgetsConfig, clock: Clock) -> Stores:
    from policies.budgets.redis_cluster_store import RedisClusterBudgetStore

    log.info(
        "budgets: Redis Cluster store, seed node %s (prefix %r, fail_mode %s, lease %.0fs)",
        _redacted(settings.redis_url),
        settings.key_prefix,
        settings.fail_mode,
        settings.lease_s,
    )
    store = RedisClusterBudgetStore(settings, clock=clock)
    return store, RedisKeyStore(store.redis, settings.key_prefix)


# budgets.store -> builder: the one list of store kinds (the config accepts exactly these).
STORE_KINDS: dict[str, Callable[[BudgetsConfig, Clock], Stores]] = {
    "memory": _memory,
    "redis": _redis,
    "redis-cluster": _redis_cluster,
}
# The kinds whose state lives outside the proxy (shared by replicas, managed by the commands).
SHARED_KINDS = ("redis", "redis-cluster")


def check_store_kind(kind: str) -> None:
    """ConfigError naming `budgets.store` unless `kind` is one of STORE_KINDS."""
    if kind not in STORE_KINDS:
        raise ConfigError(
            f"budgets.store: unknown budget store {kind!r} (known: {sorted(STORE_KINDS)})"
        )


def build_stores(settings: BudgetsConfig, clock: Clock = time.time) -> Stores:
    """The budget store `settings.store` names and the key store that goes with it."""
    check_store_kind(settings.store)
    return STORE_KINDS[settings.store](settings, clock)


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest
