"""Session-wide fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_cluster import RunningCluster, running_cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RunningCluster]:
    """One real 3-master, 3-replica Redis Cluster on loopback for the whole session (started
    on first use). Tests that kill nodes start their own with `running_cluster()`."""
    with running_cluster() as cluster:
        yield cluster
