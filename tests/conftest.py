"""Session-wide fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_cluster import RunningCluster, running_cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RunningCluster]:
    """One real 3-master, 3-replica Redis Cluster on loopback for the whole session (started
    on first use). Tests that kill nodes start their own with `running_cluster()`. No node of
    this one is ever killed, so it keeps Redis's default node timeout (15 s), not the 1 s a
    failover test wants: on a loaded machine a master busy for a second must not be failed over
    under another test."""
    with running_cluster(node_timeout_ms=15000) as cluster:
        yield cluster
