"""`cost-router config check` on budget stores' Redis URLs: a URL the client cannot use is exit 2
naming its key, never a traceback (finding 4 of issue 12; the store on a real Redis Cluster is
tested in tests/policies/budgets/test_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from router.commands.common import EXIT_BAD_INPUT
from tests.policies.budgets.test_cluster import cli


def test_config_check_names_the_key_of_a_cluster_url_the_client_cannot_use(
    tmp_path: Path,
) -> None:
    """Before the fix `redis+cluster://` passed `config check` and `serve` then crashed."""
    base = {
        "tiers": [
            {
                "name": "t",
                "base_url": "http://127.0.0.1:9/v1",
                "model": "m",
                "price": {"input_per_mtok": 1, "output_per_mtok": 1},
            }
        ]
    }
    for budgets, says in [
        (
            {"store": "redis", "redis_url": "redis+cluster://127.0.0.1:7000"},
            "budgets.redis_url: Value error, unsupported scheme 'redis+cluster'",
        ),
        (
            {"store": "redis-cluster", "redis_url": "redis://127.0.0.1:7000/3"},
            "budgets.redis_url: Value error, a Redis Cluster has only db 0",
        ),
        (
            {"store": "redis", "redis_url": "redis://127.0.0.1:notaport"},
            "budgets.redis_url: Value error, not a valid URL",
        ),
    ]:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump({**base, "budgets": budgets}))
        result = cli("config", "check", str(path))
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert says in result.output and "Traceback" not in result.output
