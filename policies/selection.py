"""Which policy (or experiment arm) serves a request.

Order, first match wins:
1. `model` names a tier (or a tier's upstream model): explicit passthrough, no policy.
2. `model: "router:<name>"`: that policy (unknown name -> UnknownPolicyError, a 404).
3. An active experiment that covers the request's unit: the assigned arm's policy.
4. The API key's policy, 5. the team's policy, 6. `default_policy`.

Any other `model` (e.g. "auto" or a hosted model name a drop-in client hard-codes) is routed.
A selector is immutable; hot reload swaps in a new one (router/proxy/reload.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.config import TierConfig
from policies.base import Policy
from policies.config import ExperimentConfig, KeyConfig, TeamConfig
from policies.experiments import ExperimentSet, UnitContext
from policies.keys import key_id_of
from policies.sessions.config import DEFAULT_SESSION, SessionParams
from policies.workflow import Workflow, match

ROUTER_PREFIX = "router:"


class UnknownPolicyError(LookupError):
    """`model: "router:<name>"` names no configured policy."""

    status = 404
    code = "model_not_found"

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown routing policy {name!r}; known: {', '.join(sorted(known))}")
        self.name = name


@dataclass(frozen=True, slots=True)
class Selection:
    policy: Policy | None  # None: passthrough to `tier`
    source: str  # passthrough | request | experiment | key | team | default
    tier: str | None = None
    experiment: str | None = None
    arm: str | None = None
    unit: str | None = None  # the experiment's unit kind and the unit's traced id (Assignment)
    unit_id: str | None = None
    workflow: Workflow | None = None  # the policy's workflow the request matched (route)

    @property
    def policy_name(self) -> str | None:
        return self.policy.name if self.policy is not None else None


class PolicySelector:
    """Built from the routing sections: the built policies by name, the default policy's name,
    the tiers (for passthrough), teams, keys and experiments (router/proxy/build.py's build_selector
    takes them from a RouterConfig)."""

    def __init__(
        self,
        policies: Mapping[str, Policy],
        default_policy: str,
        *,
        tiers: Sequence[TierConfig] = (),
        teams: Mapping[str, TeamConfig] | None = None,
        keys: Sequence[KeyConfig] = (),
        experiments: Sequence[ExperimentConfig] = (),
        sessions: Mapping[str, SessionParams] | None = None,
        workflows: Mapping[str, Sequence[Workflow]] | None = None,
    ) -> None:
        self.policies = dict(policies)
        self.workflows = {name: tuple(w) for name, w in (workflows or {}).items() if w}
        self._sessions = dict(sessions or {})
        self.default_policy = default_policy
        self.experiments = ExperimentSet(experiments)
        self._passthrough = {t.name: t.name for t in tiers}
        for t in tiers:
            # A tier name wins over another tier's upstream model name.
            self._passthrough.setdefault(t.model, t.name)
        self._key_policy = {key_id_of(k.key_sha256): k.policy for k in keys if k.policy}
        self._team_policy = {n: t.policy for n, t in (teams or {}).items() if t.policy}

    def policy(self, name: str) -> Policy:
        try:
            return self.policies[name]
        except KeyError:
            raise UnknownPolicyError(name, list(self.policies)) from None

    def session(self, policy_name: str | None) -> SessionParams:
        """The policy's `session:` option (the default for one that sets none)."""
        return self._sessions.get(policy_name or "", DEFAULT_SESSION)

    def workflow(
        self, policy: str | None, team: str | None, body: Mapping[str, Any]
    ) -> Workflow | None:
        """The policy's workflow the request belongs to, if any (one dict lookup without)."""
        mine = self.workflows.get(policy or "")
        return match(mine, team, policy, body) if mine else None

    def select(
        self,
        model: str | None,
        *,
        team: str | None = None,
        key_id: str | None = None,
        user: str | None = None,
        headers: Mapping[str, str] | None = None,
        now: float | None = None,
        session: str | None = None,
    ) -> Selection:
        """key_id: the key's public id (Identity.key_id); user: the request body's `user` field;
        headers: lower-case names (Starlette's Headers are case-insensitive already);
        session: the conversation's id, for experiments by session."""
        if model is not None:
            tier = self._passthrough.get(model)
            if tier is not None:
                return Selection(None, "passthrough", tier=tier)
            if model.startswith(ROUTER_PREFIX):
                return Selection(self.policy(model[len(ROUTER_PREFIX) :]), "request")
        units = UnitContext(team=team, key=key_id, user=user, headers=headers, session=session)
        assigned = self.experiments.assign(units, time.time() if now is None else now)
        if assigned is not None:
            return Selection(
                self.policy(assigned.policy),
                "experiment",
                experiment=assigned.experiment,
                arm=assigned.arm,
                unit=assigned.unit,
                unit_id=assigned.unit_id,
            )
        if key_id is not None and key_id in self._key_policy:
            return Selection(self.policy(self._key_policy[key_id]), "key")
        if team is not None and team in self._team_policy:
            return Selection(self.policy(self._team_policy[team]), "team")
        return Selection(self.policy(self.default_policy), "default")
