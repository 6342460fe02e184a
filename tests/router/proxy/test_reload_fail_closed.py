"""A hot reload never turns a limited team unlimited unless the operator says so (issue 24,
finding 2): the real proxy over HTTP with the official `openai` client, real Redis, the echo
upstream, and the config file edited as an operator or a careless tool would.

- A reload that drops a team's section without listing it under `removed_teams` is refused
  (the running config, and so the team's limit, stays in force); so is one that lifts a limit.
- A file written in place with a pause longer than `server.reload_debounce_s`, cut after its
  first team, is refused for the same reason: no team loses its limit, no config key its team.
- `removed_teams` removes a team on purpose: the reload applies, the team's run-time keys are
  refused (401 team_removed) and no new key is made for it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from typer.testing import CliRunner

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from router.cli import app as cli_app
from router.config import load_config
from router.proxy.reload import ConfigReloader
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.proxy import ProxyThread, tier
from tests.support.waiting import wait_for
from trace_format.config_base import ConfigError

ADMIN = "sk-test-reload-admin"
BLUE = "sk-test-reload-blue"  # a config key of the team no edit is meant to touch
RED_LIMIT_USD = 0.02  # about ten requests at the tier's price below
DEBOUNCE_S = 0.3


def _doc(
    url: str, prefix: str, traces: Path, teams: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """The config, `teams` then `keys` last: a file cut after its first team loses both."""
    return {
        "server": {"reload_debounce_s": DEBOUNCE_S},
        "tiers": [tier("small", url, price=(100.0, 100.0))],
        "default_policy": "only",
        "policies": {"only": {"type": "fixed", "tier": "small"}},
        "auth": {"required": True, "admin_keys": [{"key_sha256": hash_key(ADMIN)}]},
        "budgets": {
            "store": "redis",
            "redis_url": REDIS_URL,
            "key_prefix": prefix,
            "key_cache_s": 0.2,
        },
        "traces": {"path": str(traces / "requests.jsonl")},
        "signals": {"enabled": False},
        **extra,
        "teams": teams,
        "keys": [{"key_sha256": hash_key(BLUE), "team": "blue"}],
    }


BLUE_TEAM = {"budget": {"limit_usd": 100.0, "period": "total"}}
RED_TEAM = {"budget": {"limit_usd": RED_LIMIT_USD, "period": "total"}}


def _dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)  # the order above: teams, then keys, last


def _replace(path: Path, text: str) -> None:
    """As docs/deployment.md says to: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


@pytest.fixture()
def deployment(tmp_path: Path) -> Iterator[dict[str, Any]]:
    prefix = random_prefix()
    with running_echo_upstream() as url:
        path = tmp_path / "router.yaml"
        traces = tmp_path / "traces"

        def doc(teams: dict[str, Any], **extra: Any) -> dict[str, Any]:
            return _doc(url, prefix, traces, teams, **extra)

        path.write_text(_dump(doc({"blue": BLUE_TEAM, "red": RED_TEAM})))
        try:
            with ProxyThread(load_config(path, environ={}), config_path=path) as proxy:
                yield {"proxy": proxy, "path": path, "doc": doc}
        finally:
            delete_prefix(prefix)


def _runtime_key(proxy: ProxyThread, team: str, **extra: Any) -> httpx.Response:
    """`POST /admin/v1/keys`, as `cost-router keys create` does: the key lives in Redis only."""
    return httpx.post(
        f"{proxy.url}/admin/v1/keys",
        json={"team": team, **extra},
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )


def _ask(proxy: ProxyThread, key: str) -> tuple[int, str | None]:
    """One chat request with the official client: (status, error code)."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0, timeout=10)
    try:
        client.chat.completions.create(
            model="auto", max_tokens=8, messages=[{"role": "user", "content": "hello there"}]
        )
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return exc.status_code, body.get("code")
    finally:
        client.close()
    return 200, None


def _spent_usd(proxy: ProxyThread, team: str) -> float:
    """The team's spend and what it still holds, as the budget store has them (admin API)."""
    r = httpx.get(
        f"{proxy.url}/admin/v1/budgets/{team}",
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    rows = [row for row in r.json()["data"] if row["team"] == team and row["scope"] == "team"]
    assert rows, r.text
    return sum(row["spent_usd"] + row["reserved_usd"] for row in rows)


def _judged(reloader: ConfigReloader, before: int) -> bool:
    """The watcher has judged one more version of the file (applied or refused)."""
    return reloader.reloads + reloader.failures > before


def test_a_runtime_key_keeps_its_limit_when_its_section_is_removed(
    deployment: dict[str, Any],
) -> None:
    """The issue's first case: a run-time key of a $0.02 team, then the team's section removed
    by an atomic replace, then 60 requests. Before: the reload applied, all 60 answered 200 and
    the team spent $0.15. Now the reload is refused and the limit holds."""
    proxy, path, doc = deployment["proxy"], deployment["path"], deployment["doc"]
    reloader: ConfigReloader = proxy.app.state.reloader
    created = _runtime_key(proxy, "red")
    assert created.status_code == 200, created.text
    red = created.json()["key"]
    assert _ask(proxy, red) == (200, None)

    before = reloader.reloads + reloader.failures
    _replace(path, _dump(doc({"blue": BLUE_TEAM})))
    wait_for(lambda: _judged(reloader, before), 20, "the reload of the file without team red")

    answers = [_ask(proxy, red) for _ in range(60)]
    spent = _spent_usd(proxy, "red")
    assert spent <= RED_LIMIT_USD + 1e-9, f"team red spent ${spent} of ${RED_LIMIT_USD}"
    refused = [a for a in answers if a != (200, None)]
    assert refused and all(a == (429, "budget_exceeded") for a in refused), set(answers)
    assert _ask(proxy, BLUE) == (200, None)

    assert reloader.failures == 1 and reloader.reloads == 0, "the reload was applied"
    assert reloader.last_error is not None
    assert "teams.red: dropped, but not listed under removed_teams" in reloader.last_error
    assert list(proxy.state.config.teams) == ["blue", "red"]  # the running config stays


def test_lifting_a_limit_in_place_is_refused_raising_it_is_applied(
    deployment: dict[str, Any],
) -> None:
    """The team stays, its limit goes (as a file cut right after `budget:` would have it):
    refused. A new, higher limit is the operator saying so: applied."""
    proxy, path, doc = deployment["proxy"], deployment["path"], deployment["doc"]
    reloader: ConfigReloader = proxy.app.state.reloader
    before = reloader.reloads + reloader.failures
    _replace(path, _dump(doc({"blue": BLUE_TEAM, "red": {"budget": None}})))
    wait_for(lambda: _judged(reloader, before), 20, "the reload that lifts red's limit")
    assert reloader.reloads == 0 and "teams.red.budget: would be lifted" in (
        reloader.last_error or ""
    )
    assert proxy.state.config.teams["red"].budget is not None

    before = reloader.reloads + reloader.failures
    raised = {"budget": {"limit_usd": 5.0, "period": "total"}}
    _replace(path, _dump(doc({"blue": BLUE_TEAM, "red": raised})))
    wait_for(lambda: _judged(reloader, before), 20, "the reload that raises red's limit")
    assert reloader.reloads == 1, reloader.last_error
    budget = proxy.state.config.teams["red"].budget
    assert budget is not None and budget.limit_usd == 5.0


def test_a_file_written_in_place_with_a_long_pause_is_never_half_applied(
    deployment: dict[str, Any],
) -> None:
    """The issue's second case: the file rewritten in place, its first part (cut after the
    first team, so without team red and without the `keys:` section) left alone longer than
    the quiet period, then the rest. Before: the first part was applied, every config key went
    (401 for team blue) and red's run-time key spent without a limit. Now the first part is
    refused: red stays limited, blue's key keeps working, and the whole file applies."""
    proxy, path, doc = deployment["proxy"], deployment["path"], deployment["doc"]
    reloader: ConfigReloader = proxy.app.state.reloader
    red = _runtime_key(proxy, "red").json()["key"]
    whole = _dump(doc({"blue": BLUE_TEAM, "red": RED_TEAM}))
    first_part = whole[: whole.index("  red:")]  # teams: {blue: ...}, nothing after
    assert "\nkeys:" not in first_part and "\nkeys:" in whole

    answers: dict[str, list[tuple[int, str | None]]] = {"red": [], "blue": []}
    done = threading.Event()

    def load() -> None:
        while not done.is_set():
            answers["red"].append(_ask(proxy, red))
            answers["blue"].append(_ask(proxy, BLUE))

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        wait_for(lambda: len(answers["blue"]) >= 3, 20, "requests before the edit")
        before = reloader.reloads + reloader.failures
        with path.open("w") as fh:  # in place, as `cat > file` or a slow tool writes it
            fh.write(first_part)
            fh.flush()
            # Longer than the quiet period: the watcher judges the first part on its own...
            wait_for(lambda: _judged(reloader, before), 20, "the watcher to judge the first part")
            seen = len(answers["red"])
            # ...and traffic goes on under whatever it decided, red's limit and beyond.
            wait_for(lambda: len(answers["red"]) >= seen + 15, 60, "requests after the first part")
            judged = reloader.reloads + reloader.failures
            fh.write(whole[len(first_part) :])
        wait_for(lambda: _judged(reloader, judged), 20, "the whole file to be judged")
    finally:
        done.set()
        worker.join(timeout=30)

    blue_refused = [a for a in answers["blue"] if a != (200, None)]
    spent = _spent_usd(proxy, "red")
    assert not blue_refused, (
        f"{len(blue_refused)} of team blue's requests refused: {blue_refused[:3]}"
    )
    assert spent <= RED_LIMIT_USD + 1e-9, f"team red spent ${spent} of ${RED_LIMIT_USD}"
    assert set(answers["red"]) <= {(200, None), (429, "budget_exceeded")}, set(answers["red"])
    assert (429, "budget_exceeded") in answers["red"]
    assert reloader.reloads == 1 and reloader.failures == 1, reloader.last_error
    assert list(proxy.state.config.teams) == ["blue", "red"] and proxy.state.config.keys


def test_removed_teams_removes_a_team_on_purpose(deployment: dict[str, Any]) -> None:
    """Listed under `removed_teams`, the team's section may go: the reload applies, its
    run-time keys are refused with a clear 401 (never admitted unlimited), no new key is made
    for it, and other teams are not affected. Taking it off `removed_teams` again without
    giving it a section back is refused (its keys would be admitted unlimited)."""
    proxy, path, doc = deployment["proxy"], deployment["path"], deployment["doc"]
    reloader: ConfigReloader = proxy.app.state.reloader
    red = _runtime_key(proxy, "red").json()["key"]
    assert _ask(proxy, red) == (200, None)

    before = reloader.reloads + reloader.failures
    _replace(path, _dump(doc({"blue": BLUE_TEAM}, removed_teams=["red"])))
    wait_for(lambda: _judged(reloader, before), 20, "the reload that removes red")
    assert reloader.reloads == 1, reloader.last_error
    assert "red" not in proxy.state.config.teams

    assert _ask(proxy, red) == (401, "team_removed")
    assert _ask(proxy, BLUE) == (200, None)
    # Not even as a team the config does not list, on purpose: a removed team's keys are dead.
    again = _runtime_key(proxy, "red", allow_unlisted_team=True)
    assert again.status_code == 400, again.text
    assert "listed under removed_teams" in again.json()["error"]["message"]

    before = reloader.reloads + reloader.failures
    _replace(path, _dump(doc({"blue": BLUE_TEAM})))
    wait_for(lambda: _judged(reloader, before), 20, "the reload that un-removes red")
    assert reloader.reloads == 1 and "removed_teams: red dropped" in (reloader.last_error or "")
    assert _ask(proxy, red) == (401, "team_removed")


def test_a_config_naming_a_removed_team_is_refused(tmp_path: Path) -> None:
    """A removed team may not also be configured, own a config key or be the default team."""
    doc = _doc("http://127.0.0.1:9/v1", "unused", tmp_path, {"blue": BLUE_TEAM})
    path = tmp_path / "router.yaml"
    for removed, line in [
        ("blue", "removed_teams: 'blue' is also under teams"),
        ("blue", "keys.0.team: 'blue' is listed under removed_teams"),
        ("default", "auth.default_team: 'default' is under removed_teams"),
    ]:
        path.write_text(_dump({**doc, "removed_teams": [removed]}))
        with pytest.raises(ConfigError, match=line.replace(".", r"\.")):
            load_config(path, environ={})


def test_keys_create_refuses_a_removed_team(tmp_path: Path) -> None:
    """`cost-router keys create` refuses a removed team (exit 2), even with
    --allow-unlisted-team: the proxy would refuse every key of it."""
    doc = _doc("http://127.0.0.1:9/v1", random_prefix(), tmp_path, {"blue": BLUE_TEAM})
    path = tmp_path / "router.yaml"
    path.write_text(_dump({**doc, "removed_teams": ["red"]}))
    args = ["keys", "create", "--team", "red", "-c", str(path), "--allow-unlisted-team"]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 2, result.output
    assert "lists team 'red' under removed_teams: its keys are refused" in result.output
