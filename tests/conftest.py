"""Session-wide fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_cluster import RunningCluster, running_cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RunningCluster]:
    """One real 3-master, 3-replica Redis Cluster on loopback for the whole session (started
    on first use). Tests that kill nodes start their own with `running_cluster()`. No node of
    this one is ever killed, so it keeps Redis's default node timeout (15 s): with the 1 s that
    a failover test wants, a loaded machine (a master busy for a second) made replicas take
    over spuriously mid-test, and the old master's clients lost their connections."""
    with running_cluster(node_timeout_ms=15000) as cluster:
        yield cluster
