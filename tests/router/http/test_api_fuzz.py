"""schemathesis against the proxy's own OpenAPI schema (/openapi.json, router/http/openapi.py), over
real HTTP: every published operation, a bounded number of generated requests each, with the keys
of a limited and of an unlimited team, and the admin API with the admin key. No response may be a
5xx, every error must be the OpenAI-style error JSON, every response must match what the schema
publishes, and (schemathesis's positive_data_acceptance, on for every operation) no request the
schema allows may be refused as malformed (400): the schema states every rule the server checks.
The requests schemathesis once found refused though the schema allowed them are kept below as
explicit cases (test_the_schema_and_the_server_agree)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
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
METRICS_TOKEN_ENV = "COST_ROUTER_TEST_FUZZ_METRICS_TOKEN"
METRICS_TOKEN = "fuzz-metrics-token"  # /metrics's own bearer token (monitoring.metrics_token_env)
# Per operation and key (~50 generated requests per team operation, 25 per admin one): ~40 s on
# the 2-core dev machine, derandomized so CI runs the same cases. COST_ROUTER_FUZZ_EXAMPLES
# raises it for a longer, randomized search (e.g. 500 before a release).
EXAMPLES = int(os.environ.get("COST_ROUTER_FUZZ_EXAMPLES", "25"))
ADMIN_EXAMPLES = EXAMPLES  # per admin operation, with the admin key (team keys get a 403 there)
DERANDOMIZE = "COST_ROUTER_FUZZ_EXAMPLES" not in os.environ
COUNTS: Counter[str] = Counter()  # requests made, by status class (reported at the end)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    tmp: Path = tmp_path_factory.mktemp("api-fuzz")
    prefix = random_prefix()
    with pytest.MonkeyPatch.context() as env, running_echo_upstream() as upstream:
        env.setenv(METRICS_TOKEN_ENV, METRICS_TOKEN)
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
            monitoring={"metrics_token_env": METRICS_TOKEN_ENV},
        )
        with ProxyThread(config) as running:
            yield running
    delete_prefix(prefix)


def openai_error_body(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every 4xx/5xx carries {"error": {"message": str, "type": str, "param", "code"}}; on
    /v1/messages Anthropic's {"type": "error", "error": {"type": str, "message": str}}."""
    COUNTS[f"{response.status_code // 100}xx"] += 1
    if response.status_code < 400:
        return None
    body = response.json()
    if case.operation.path == "/v1/messages":
        assert isinstance(body, dict) and body.get("type") == "error", body
        err = body.get("error")
        assert isinstance(err, dict) and set(err) == {"type", "message"}, err
        assert isinstance(err["type"], str) and isinstance(err["message"], str) and err["message"]
        return None
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
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=list(HealthCheck),
)


class _Key:
    """The team's key as the schema's bearer auth: schemathesis's ignored_auth check then also
    sends each request without it and with a wrong key, and expects 401."""

    team = ""

    def get(self, case: Case, context: Any) -> str:
        return KEYS[self.team]

    def set(self, case: Case, data: str, context: Any) -> None:
        # /metrics takes the metrics token, not an API key (its security scheme says so).
        token = METRICS_TOKEN if case.operation.path == "/metrics" else data
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}


class LimitedKey(_Key):
    team = "limited"


class UnlimitedKey(_Key):
    team = "unlimited"


class AdminKey(_Key):
    def get(self, case: Case, context: Any) -> str:
        return ADMIN_KEY


def _call(proxy: ProxyThread, case: Case) -> None:
    # Every default check runs, positive_data_acceptance among them: a schema-valid request may
    # get a 2xx, or 401/403/404/409/429 (a model or key that does not exist, a team over its
    # budget, a team the config does not list), never a 400. JSON Schema calls 5.0 an integer,
    # and schemathesis sends it: integer fields take it (router/http/schemas.py `Whole`).
    case.call_and_validate(
        base_url=proxy.url,
        timeout=30,
        additional_checks=[openai_error_body, positive_data_acceptance],
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
        ("/v1/responses", "post"),
        ("/v1/messages", "post"),
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


# What schemathesis found refused with 400 though the schema allowed it (issue 24, finding 5),
# and the neighbours of each: (method, path, body, the schema allows it). The schema must say
# what the server does: allowed -> not refused as malformed; not allowed -> a 400.
CHAT = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}
RESPONSE = {"model": "small", "input": "hi"}
MESSAGE = {"model": "small", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
AGREEMENT_CASES: list[tuple[str, str, Any, bool]] = [
    ("POST", "/v1/embeddings", {"model": "small", "input": []}, False),
    ("POST", "/v1/embeddings", {"model": "small", "input": ["a"] * 2049}, False),
    ("POST", "/v1/embeddings", {"model": "small", "input": [[]]}, True),
    ("POST", "/v1/embeddings", {"model": "small", "input": [1.0, 2]}, True),
    ("POST", "/v1/embeddings", {"model": "small", "input": "a", "stream": False}, False),
    ("POST", "/v1/embeddings", {"model": "small", "input": "a", "dimensions": 8.0}, True),
    ("POST", "/v1/completions", {"model": "small", "prompt": [2**64]}, False),
    ("POST", "/v1/completions", {"model": "small", "prompt": [[2**63 - 1]]}, False),
    ("POST", "/v1/completions", {"model": "small", "prompt": [-1]}, False),
    ("POST", "/v1/completions", {"model": "small", "prompt": [[0, 2**31 - 1]]}, True),
    ("POST", "/v1/completions", {"model": "small", "prompt": "hi", "best_of": 2.0}, True),
    ("POST", "/v1/chat/completions", {**CHAT, "max_completion_tokens": 1.0}, True),
    ("POST", "/v1/chat/completions", {**CHAT, "max_completion_tokens": 2**31 - 1}, True),
    ("POST", "/v1/chat/completions", {**CHAT, "max_completion_tokens": 2**31}, False),
    ("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 8.0, "n": 2.0}, True),
    ("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 8.5}, False),
    # Parsed as a float that rounds to -(2**63): still refused, as the schema says.
    ("POST", "/v1/chat/completions", {**CHAT, "seed": -(2**63) - 1}, False),
    ("POST", "/v1/chat/completions", {**CHAT, "seed": -(2**63)}, True),
    # The Responses API (router/apis/responses_schema.py): stateless, function tools only, an
    # input chat can read.
    ("POST", "/v1/responses", {**RESPONSE, "previous_response_id": "resp_1"}, False),
    ("POST", "/v1/responses", {**RESPONSE, "previous_response_id": None, "store": True}, True),
    ("POST", "/v1/responses", {**RESPONSE, "max_output_tokens": 8.0}, True),
    ("POST", "/v1/responses", {**RESPONSE, "max_output_tokens": 2**31}, False),
    ("POST", "/v1/responses", {**RESPONSE, "input": []}, False),
    ("POST", "/v1/responses", {**RESPONSE, "input": [{"type": "reasoning"}]}, False),
    (
        "POST",
        "/v1/responses",
        {**RESPONSE, "input": [{"type": "reasoning"}, {"role": "user", "content": "hi"}]},
        True,
    ),
    ("POST", "/v1/responses", {**RESPONSE, "tools": [{"type": "web_search"}]}, False),
    # The Anthropic Messages API (router/apis/messages_schema.py).
    ("POST", "/v1/messages", {**MESSAGE, "messages": [{"role": "user", "content": ""}]}, False),
    ("POST", "/v1/messages", {**MESSAGE, "tool_choice": {"type": "tool"}}, False),
    ("POST", "/v1/messages", {**MESSAGE, "max_tokens": 8.0}, True),
    ("POST", "/admin/v1/keys", {"team": "not-in-the-config"}, True),
    ("POST", "/admin/v1/keys", {"team": "limited"}, True),
    ("PUT", "/admin/v1/budgets/limited/limit", {}, False),
    ("PUT", "/admin/v1/budgets/limited/limit", {"limit_usd": None, "period": "daily"}, False),
    ("PUT", "/admin/v1/budgets/limited/limit", {"rpm": 1000.0}, True),
    ("PUT", "/admin/v1/budgets/limited/limit", {"limit_usd": 1.5, "key_id": "abc"}, False),
    ("POST", "/admin/v1/keys/abc/revoke", None, False),
    ("POST", "/admin/v1/keys/0123abcd/revoke", None, True),
]
# A schema-valid request may be refused for what it names or costs, never as malformed.
MALFORMED = {400, 413, 415, 422}


def _schema_allows(method: str, path: str, body: Any) -> bool:
    """Whether the published schema allows the request: its path parameters and its body."""
    for template, ops in PUBLISHED["paths"].items():
        parts, given = template.split("/"), path.split("/")
        if len(parts) != len(given) or method.lower() not in ops:
            continue
        params = {p[1:-1]: v for p, v in zip(parts, given, strict=True) if p.startswith("{")}
        if any(p != v for p, v in zip(parts, given, strict=True) if not p.startswith("{")):
            continue
        op = ops[method.lower()]
        checks = [
            (p["schema"], params[p["name"]]) for p in op.get("parameters", []) if p["in"] == "path"
        ]
        if body is not None:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            checks.append(({"$ref": ref}, body))
        return all(
            jsonschema.Draft202012Validator(
                {**schema, "components": PUBLISHED["components"]}
            ).is_valid(value)
            for schema, value in checks
        )
    raise AssertionError(f"{method} {path} is not in the published schema")


@pytest.mark.parametrize(("method", "path", "body", "allowed"), AGREEMENT_CASES)
def test_the_schema_and_the_server_agree(
    proxy: ProxyThread, method: str, path: str, body: Any, allowed: bool
) -> None:
    assert _schema_allows(method, path, body) is allowed, "the published schema changed"
    key = ADMIN_KEY if path.startswith("/admin/") else KEYS["unlimited"]
    # stdlib json writes integers of any size, as a client's JSON library would.
    content = b"" if body is None else json.dumps(body).encode()
    r = httpx.request(
        method,
        f"{proxy.url}{path}",
        content=content,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=30,
    )
    if allowed:
        assert r.status_code not in MALFORMED, (r.status_code, r.text)
    else:
        assert r.status_code == 400, (r.status_code, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_fuzz_made_requests_and_no_5xx() -> None:
    """Runs after the fuzzing above (pytest keeps the file's order): the run's numbers."""
    total = sum(COUNTS.values())
    print(f"\napi fuzz: {total} requests, by status class {dict(sorted(COUNTS.items()))}")
    assert total >= 100 and COUNTS["5xx"] == 0
