"""An admin key (auth.admin_keys) on the model endpoints is told it is an admin key, not that it
is incorrect: it serves the admin API only. Real proxy, echo upstream, the official client."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from tests.support.proxy import ProxyThread, make_config, tier

ADMIN_KEY = "sk-test-admin-key-h10"
TEAM_KEY = "sk-test-team-key-h10"


@pytest.fixture(scope="module", params=[True, False], ids=["auth-required", "auth-optional"])
def proxy(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyThread]:
    with running_echo_upstream() as upstream:
        config = make_config(
            [tier("small", upstream)],
            tmp_path_factory.mktemp("admin-key"),
            auth={
                "required": request.param,
                "admin_keys": [{"key_sha256": hash_key(ADMIN_KEY), "name": "ops"}],
            },
            teams={"alpha": {}},
            keys=[{"key_sha256": hash_key(TEAM_KEY), "team": "alpha"}],
        )
        with ProxyThread(config) as running:
            yield running


def test_an_admin_key_on_chat_is_named_an_admin_key(proxy: ProxyThread) -> None:
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ADMIN_KEY, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(
            model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    message = refused.value.body["message"]  # type: ignore[index]
    assert "admin key" in message and "Incorrect" not in message, message
    assert refused.value.code == "admin_key_not_allowed"
    # A team's key still works beside it.
    team = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    answer = team.chat.completions.create(
        model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.choices[0].message.content
