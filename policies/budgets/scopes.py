"""Whose budget a request draws on: its team and, when it has one, its API key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.config import BudgetLimit, KeyConfig, TeamConfig
from policies.keys import key_id_of

TEAM_SCOPE = "team"


def key_scope(key_id: str) -> str:
    return f"key:{key_id}"


def scope_name(key_id: str | None) -> str:
    """The scope an operator command acts on: the team's, or one key's."""
    return TEAM_SCOPE if key_id is None else key_scope(key_id)


@dataclass(frozen=True, slots=True)
class BudgetScope:
    team: str
    key_id: str | None = None
    team_limit: BudgetLimit | None = None  # from config; a store override takes precedence
    key_limit: BudgetLimit | None = None

    def scope_limits(self) -> list[tuple[str, BudgetLimit | None]]:
        """(scope name, configured limit): the team scope first, then the key's."""
        out: list[tuple[str, BudgetLimit | None]] = [(TEAM_SCOPE, self.team_limit)]
        if self.key_id is not None:
            out.append((key_scope(self.key_id), self.key_limit))
        return out

    def label(self, name: str) -> str:
        """How a refusal names the scope: ``team`` or ``team/key:<id>``."""
        return self.team if name == TEAM_SCOPE else f"{self.team}/{name}"


class ScopeLimits:
    """The configured limits of every team and key (the `teams` and `keys` sections)."""

    def __init__(self, teams: Mapping[str, TeamConfig], keys: Sequence[KeyConfig]) -> None:
        self.team_names = list(teams)  # every configured team, limited or not
        self._team_limits = {name: t.budget for name, t in teams.items()}
        self._key_limits = {key_id_of(k.key_sha256): k.budget for k in keys}
        self.limited_teams = frozenset(n for n, b in self._team_limits.items() if b is not None)
        self.any_key_limited = any(b is not None for b in self._key_limits.values())

    def scope(self, team: str, key_id: str | None = None) -> BudgetScope:
        key_limit = self._key_limits.get(key_id) if key_id else None
        return BudgetScope(team, key_id, self._team_limits.get(team), key_limit)

    def may_be_limited(self, team: str) -> bool:
        """False when no limit can apply to the team (no team limit, no key limit at all)."""
        return team in self.limited_teams or self.any_key_limited
