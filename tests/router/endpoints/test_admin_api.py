"""The admin API (/admin/v1/..., router/endpoints/admin.py) against the real proxy and real Redis,
with the official HTTP client (httpx): a round trip through every operation, authorization (admin
key only: a team key is 403, no key 401), bad bodies (400 naming the field), and the CLI seeing what
the API did (one implementation, policies/admin.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest
import redis
from typer.testing import CliRunner

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import KeyRecord, RedisKeyStore, hash_key
from router.cli import app as cli_app
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.proxy import ProxyThread, make_config, tier

ADMIN_KEY = "sk-test-admin-key"
TEAM_KEY = "sk-test-team-alpha"


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    p = random_prefix()
    yield p
    delete_prefix(p)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, prefix: str) -> Iterator[ProxyThread]:
    tmp: Path = tmp_path_factory.mktemp("admin-api")
    with running_echo_upstream() as upstream:
        config = make_config(
            [tier("small", upstream)],
            tmp,
            auth={
                "required": True,
                "admin_keys": [{"key_sha256": hash_key(ADMIN_KEY), "name": "ops"}],
            },
            teams={"alpha": {"budget": {"limit_usd": 2.0, "period": "daily"}}, "beta": {}},
            keys=[{"key_sha256": hash_key(TEAM_KEY), "team": "alpha"}],
            default_policy="fixed",
            policies={"fixed": {"type": "fixed", "tier": "small"}},
            budgets={
                "store": "redis",
                "redis_url": REDIS_URL,
                "key_prefix": prefix,
                "key_cache_s": 0,
            },
        )
        with ProxyThread(config) as running:
            yield running


@pytest.fixture
def admin(proxy: ProxyThread) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=f"{proxy.url}/admin/v1",
        timeout=10,
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    ) as client:
        yield client


def ok(resp: httpx.Response) -> Any:
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_round_trip_keys_limits_spend_ledger_and_revocation(
    proxy: ProxyThread, admin: httpx.Client
) -> None:
    created = ok(admin.post("/keys", json={"team": "beta", "user": "bob", "name": "ci"}))
    raw, key_id = created["key"], created["key_id"]
    assert raw.startswith("sk-cr-") and created["team"] == "beta" and created["revoked"] is None
    listed = ok(admin.get("/keys"))["data"]
    assert {k["key_id"]: k["source"] for k in listed}[key_id] == "runtime"
    assert hash_key(TEAM_KEY)[:16] in {k["key_id"] for k in listed}  # config keys too
    assert all("key" not in k for k in listed)  # the raw key is shown once, at creation

    limit = ok(admin.put("/budgets/beta/limit", json={"limit_usd": 3.5, "period": "weekly"}))
    assert limit["limit"]["limit_usd"] == 3.5
    # The new key works on the models; its spend shows in the standing and the ledger.
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=raw, max_retries=0)
    answer = client.chat.completions.create(
        model="auto", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices
    teams = {t["team"]: t["configured"] for t in ok(admin.get("/teams"))["data"]}
    assert teams["alpha"] and teams["beta"]

    def beta_spent() -> float:
        standing = ok(admin.get("/budgets/beta"))["data"]
        assert standing[0]["limit_usd"] == 3.5 and standing[0]["period"] == "weekly"
        return float(standing[0]["spent_usd"])

    proxy.traces(1)  # the charge is settled before the trace is written
    assert beta_spent() > 0
    assert {r["team"] for r in ok(admin.get("/budgets"))["data"]} >= {"alpha", "beta"}
    ledger = ok(admin.get("/budgets/beta/ledger"))
    assert [e["kind"] for e in ledger["data"]] == ["settle"] and ledger["total_usd"] > 0

    wiped = ok(admin.post("/budgets/beta/reset", json={}))
    assert wiped["wiped_usd"] == ledger["total_usd"] and beta_spent() == 0
    assert ok(admin.get("/audit", params={"team": "beta"}))["ok"] is True
    cleared = ok(admin.delete("/budgets/beta/limit"))
    assert cleared["limit"] is None

    revoked = ok(admin.post(f"/keys/{key_id}/revoke"))
    assert revoked["revoked"] is not None
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])


def test_only_an_admin_key_may_use_it(proxy: ProxyThread) -> None:
    url = f"{proxy.url}/admin/v1/keys"
    for headers, status in [
        ({}, 401),
        ({"Authorization": "Bearer sk-nobody"}, 401),
        ({"Authorization": f"Bearer {TEAM_KEY}"}, 403),
    ]:
        resp = httpx.get(url, headers=headers, timeout=10)
        assert resp.status_code == status, resp.text
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    forbidden = httpx.post(
        url, json={"team": "alpha"}, timeout=10, headers={"Authorization": f"Bearer {TEAM_KEY}"}
    )
    assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "permission_error"
    # An admin key is not a team key: it cannot spend on the models.
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ADMIN_KEY, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("post", "/keys", {}, "team"),
        ("post", "/keys", {"team": 5}, "team"),
        ("post", "/keys", {"team": "alpha", "colour": "red"}, "colour"),
        ("put", "/budgets/alpha/limit", {"limit_usd": -1}, "limit_usd"),
        ("put", "/budgets/alpha/limit", {"limit_usd": 1, "period": "yearly"}, "period"),
        ("put", "/budgets/alpha/limit", {"period": "daily"}, "limit_usd"),
        ("put", "/budgets/alpha/limit", {"limit_usd": 1, "key_id": "abc"}, "key_id"),
        ("post", "/budgets/alpha/reset", {"key_id": 7}, "key_id"),
        ("post", "/keys/abc/revoke", None, "key_id"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    admin: httpx.Client, method: str, path: str, body: Any, param: str
) -> None:
    resp = admin.request(method.upper(), path, json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.text


def test_a_key_of_an_unlisted_team_is_a_conflict(admin: httpx.Client) -> None:
    """Well formed (the schema cannot list the config's teams), so not a 400: the config lists no
    such team and a key of it would have no limit, so 409, and no key is made."""
    before = admin.get("/keys").json()["data"]
    resp = admin.post("/keys", json={"team": "nosuchteam"})
    assert resp.status_code == 409, resp.text
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == (
        "unlisted_team",
        "team",
    ) and "allow_unlisted_team" in err["message"]
    assert admin.get("/keys").json()["data"] == before


def test_unreadable_bodies_and_unknown_keys(admin: httpx.Client) -> None:
    not_json = admin.post("/keys", content=b"{nope", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"
    text = admin.post("/keys", content=b'{"team": "alpha"}', headers={"content-type": "text/plain"})
    assert text.status_code == 415
    unknown = admin.post("/keys/0123456789abcdef/revoke")
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "key_id"


def test_the_cli_sees_what_the_api_did(admin: httpx.Client, prefix: str) -> None:
    created = ok(admin.post("/keys", json={"team": "alpha", "name": "from-api"}))
    env = {
        "COST_ROUTER_CONFIG": None,
        "COST_ROUTER__BUDGETS__STORE": "redis",
        "COST_ROUTER__BUDGETS__KEY_PREFIX": prefix,
    }
    listed = CliRunner().invoke(
        cli_app, ["keys", "list", "--json", "--redis-url", REDIS_URL], env=env
    )
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    api_rows = {k["key_id"]: k for k in ok(admin.get("/keys"))["data"] if k["source"] == "runtime"}
    # Same records, same JSON (the API adds only "object").
    for row in rows:
        assert {**row, "object": "api_key"} == api_rows[row["key_id"]]
    assert created["key_id"] in {r["key_id"] for r in rows}


# Names policies/names.py refuses, with the words each refusal must say: the shadow spend's
# reserved scope, NUL, braces that split the Redis Cluster hash tag, 10,000 characters.
BAD_NAMES = [
    ("__shadow__", "must not start with '__' (reserved for internal scopes)"),
    ("a\x00b", "'a\\x00b': must start with a letter or digit"),
    ("x}y{z", "'x}y{z': must start with a letter or digit"),
    ("t" * 10_000, "(10000 characters): must be at most 128 characters"),
]
CLI_ENV = {"COST_ROUTER_CONFIG": None, "COST_ROUTER__BUDGETS__STORE": "redis"}


def _refused(resp: httpx.Response, param: str, words: str) -> None:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_request", error
    assert words in error["message"], error
    assert "\x00" not in error["message"] and len(error["message"]) < 500


@pytest.mark.parametrize(("name", "words"), BAD_NAMES)
def test_a_key_of_a_bad_or_reserved_team_is_refused_even_when_unlisted_is_allowed(
    admin: httpx.Client, name: str, words: str
) -> None:
    before = ok(admin.get("/keys"))["data"]
    for field, body in [
        ("team", {"team": name, "allow_unlisted_team": True}),
        ("user", {"team": "alpha", "user": name}),
        ("name", {"team": "alpha", "name": name}),
    ]:
        _refused(admin.post("/keys", json=body), field, words)
    assert ok(admin.get("/keys"))["data"] == before  # nothing was created


@pytest.mark.parametrize(("name", "words"), BAD_NAMES)
def test_limits_and_resets_of_a_bad_or_reserved_team_are_refused(
    admin: httpx.Client, name: str, words: str
) -> None:
    team = quote(name, safe="")
    # An override on `__shadow__` would lift the shadow cap evaluation.daily_cap_usd sets.
    _refused(admin.put(f"/budgets/{team}/limit", json={"rpm": 5}), "team", words)
    _refused(admin.delete(f"/budgets/{team}/limit"), "team", words)
    _refused(admin.post(f"/budgets/{team}/reset"), "team", words)
    if name != "__shadow__":
        _refused(admin.get(f"/budgets/{team}"), "team", words)
        _refused(admin.get(f"/budgets/{team}/ledger"), "team", words)
    else:  # the shadow spend may be read like a team's
        assert admin.get(f"/budgets/{team}").status_code == 200
        assert admin.get(f"/budgets/{team}/ledger").status_code == 200


@pytest.mark.parametrize(("name", "words"), BAD_NAMES)
def test_the_cli_refuses_the_same_names(
    admin: httpx.Client, prefix: str, name: str, words: str
) -> None:
    before = ok(admin.get("/keys"))["data"]
    env = {**CLI_ENV, "COST_ROUTER__BUDGETS__KEY_PREFIX": prefix}
    for option, args in [
        ("--team", ["--team", name, "--allow-unlisted-team"]),
        ("--user", ["--team", "alpha", "--user", name]),
        ("--name", ["--team", "alpha", "--name", name]),
    ]:
        refused = CliRunner().invoke(
            cli_app, ["keys", "create", *args, "--redis-url", REDIS_URL], env=env
        )
        assert refused.exit_code == 2, refused.output
        assert refused.stdout == ""  # no key printed
        assert f"error: {option}: " in refused.stderr and words in refused.stderr
        assert "warning" not in refused.stderr  # refused before the unlisted-team warning
    reset = CliRunner().invoke(
        cli_app,
        ["budget", "reset", "--team", name, "--yes", "--redis-url", REDIS_URL],
        env=env,
    )
    assert reset.exit_code == 2 and words in reset.stderr, reset.output
    assert ok(admin.get("/keys"))["data"] == before


def test_key_ids_that_are_not_hex_are_a_400(admin: httpx.Client) -> None:
    _refused(admin.post("/keys/0123456z/revoke"), "key_id", "hex digits")
    _refused(
        admin.put("/budgets/alpha/limit", json={"rpm": 5, "key_id": "zzzzzzzz"}),
        "key_id",
        "hex digits",
    )


def test_a_stored_key_of_a_reserved_team_is_refused(proxy: ProxyThread, prefix: str) -> None:
    """A run-time key of `__shadow__` made before names were checked would spend against the
    shadow cap: it is refused (401), not served."""
    raw = "sk-test-made-before-names-were-checked"
    record = KeyRecord(hash_key(raw), "__shadow__", created=1.0)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.hset(
            RedisKeyStore(client, prefix).bucket(record.key_sha256),
            record.key_sha256,
            record.to_json(),
        )
    finally:
        client.close()
    models = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=raw, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        models.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])
    assert refused.value.body["code"] == "reserved_team"  # type: ignore[index]
