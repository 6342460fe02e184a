"""schemathesis against the proxy's own OpenAPI schema (/openapi.json, router/http/openapi.py), over
real HTTP: every published operation, a bounded number of generated requests each, with the keys
of a limited and of an unlimited team. No response may be a 5xx, every error must be the
OpenAI-style error JSON, and every response must match what the schema publishes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case, CheckContext, Response
from schemathesis.specs.openapi.checks import positive_data_acceptance

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from router.server.app import create_app
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.proxy import ProxyThread, make_config, tier

KEYS = {"limited": "sk-test-fuzz-limited", "unlimited": "sk-test-fuzz-unlimited"}
ADMIN_KEY = "sk-test-fuzz-admin"  # the admin API's (/admin/v1/...), auth.admin_keys
EXAMPLES = 25  # per operation and key: ~50 generated requests per operation
ADMIN_EXAMPLES = 10  # per admin operation, with the admin key (team keys get a 403 there)
COUNTS: Counter[str] = Counter()  # requests made, by status class (reported at the end)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    tmp: Path = tmp_path_factory.mktemp("api-fuzz")
    prefix = random_prefix()
    with running_echo_upstream() as upstream:
        config = make_config(
            [tier("small", upstream), tier("large", upstream, price=(10, 30))],
            tmp,
            auth={"required": True, "admin_keys": [{"key_sha256": hash_key(ADMIN_KEY)}]},
            embeddings={"tier": "small"},
            teams={
                "limited": {"budget": {"limit_usd": 0.5, "period": "daily", "rpm": 10_000}},
                "unlimited": {},
            },
            keys=[{"key_sha256": hash_key(k), "team": team} for team, k in KEYS.items()],
            default_policy="fixed",
            policies={"fixed": {"type": "fixed", "tier": "small"}},
            budgets={"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
            server={"max_body_bytes": 256 * 1024},
        )
        with ProxyThread(config) as running:
            yield running
    delete_prefix(prefix)


def openai_error_body(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every 4xx/5xx carries {"error": {"message": str, "type": str, "param", "code"}}."""
    COUNTS[f"{response.status_code // 100}xx"] += 1
    if response.status_code < 400:
        return None
    body = response.json()
    err = body.get("error") if isinstance(body, dict) else None
    assert isinstance(err, dict), f"{response.status_code} without an error object: {body!r}"
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and isinstance(err["code"], str), err
    assert err["param"] is None or isinstance(err["param"], str), err
    return None


def _published_schema() -> dict[str, Any]:
    """The schema the proxy serves at /openapi.json (the routes do not depend on the config;
    test_schema_is_the_one_served checks the live one is the same)."""
    config = make_config([tier("small", "http://127.0.0.1:9/v1")], Path("unused"))
    return create_app(config).openapi()


PUBLISHED = _published_schema()
schema = schemathesis.openapi.from_dict(PUBLISHED)
# The admin API is fuzzed with the admin key; a team key is refused there before any body is
# read (tests/router/endpoints/test_admin_api.py checks the 403 of every kind of admin call).
team_schema = schema.exclude(path_regex="^/admin/")
admin_schema = schema.include(path_regex="^/admin/")


FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


class _Key:
    """The team's key as the schema's bearer auth: schemathesis's ignored_auth check then also
    sends each request without it and with a wrong key, and expects 401."""

    team = ""

    def get(self, case: Case, context: Any) -> str:
        return KEYS[self.team]

    def set(self, case: Case, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


class LimitedKey(_Key):
    team = "limited"


class UnlimitedKey(_Key):
    team = "unlimited"


class AdminKey(_Key):
    def get(self, case: Case, context: Any) -> str:
        return ADMIN_KEY


def _call(proxy: ProxyThread, case: Case) -> None:
    # positive_data_acceptance (every schema-valid body gets a 2xx) cannot hold here: a valid body
    # may name a model that does not exist (404), cost more than the team has (429), carry 5.0
    # where an integer is due (JSON Schema calls it an integer; the proxy refuses it with 400 so
    # that what it reserves is what the upstream reads) or a lone surrogate that no UTF-8 body can
    # hold (400). That valid bodies are answered is test_schema_fuzz.py's property.
    case.call_and_validate(
        base_url=proxy.url,
        timeout=30,
        additional_checks=[openai_error_body],
        excluded_checks=[positive_data_acceptance],
    )


def test_schema_is_the_one_served(proxy: ProxyThread) -> None:
    served = httpx.get(f"{proxy.url}/openapi.json", timeout=10)
    assert served.status_code == 200 and served.json() == PUBLISHED
    paths = {(p, m) for p, ops in PUBLISHED["paths"].items() for m in ops}
    assert {
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/models", "get"),
        ("/v1/feedback", "post"),
        ("/v1/budget", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/v1/embeddings", "post"),
        ("/admin/v1/keys", "get"),
        ("/admin/v1/keys", "post"),
        ("/admin/v1/keys/{key_id}/revoke", "post"),
        ("/admin/v1/budgets/{team}/limit", "put"),
        ("/admin/v1/budgets/{team}/ledger", "get"),
    } <= paths


@team_schema.parametrize()
@team_schema.auth(LimitedKey, refresh_interval=None)
@FUZZ
def test_api_as_a_limited_team(proxy: ProxyThread, case: Case) -> None:
    _call(proxy, case)


@team_schema.parametrize()
@team_schema.auth(UnlimitedKey, refresh_interval=None)
@FUZZ
def test_api_as_an_unlimited_team(proxy: ProxyThread, case: Case) -> None:
    _call(proxy, case)


@admin_schema.parametrize()
@admin_schema.auth(AdminKey, refresh_interval=None)
@settings(FUZZ, max_examples=ADMIN_EXAMPLES)
def test_admin_api_as_the_admin(proxy: ProxyThread, case: Case) -> None:
    _call(proxy, case)


def test_fuzz_made_requests_and_no_5xx() -> None:
    """Runs after the fuzzing above (pytest keeps the file's order): the run's numbers."""
    total = sum(COUNTS.values())
    print(f"\napi fuzz: {total} requests, by status class {dict(sorted(COUNTS.items()))}")
    assert total >= 100 and COUNTS["5xx"] == 0
