"""Which requests are a workflow, and where a policy sends one (its `workflows:` option).

`Selector` is the one definition of "these requests": teams, policies and `metadata` tags
(KEY=VALUE of the request body's `metadata` object), each empty meaning any. `cost-router distill
export` selects a workflow's rows with it; a policy's `workflows:` entry routes the same requests
to a tier (e.g. the student distilled from the teacher's answers), before any scoring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


@dataclass(frozen=True)
class Selector:
    """A workflow: requests of these teams and policies carrying these `metadata` tags (each
    empty: any). The same selector routes a workflow to a tier (`Workflow` below)."""

    teams: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)

    def matches(self, team: str | None, policy: str | None, metadata: Mapping[str, Any]) -> bool:
        if self.teams and team not in self.teams:
            return False
        if self.policies and policy not in self.policies:
            return False
        return all(str(metadata.get(k)) == v for k, v in self.tags.items())

    def describe(self) -> dict[str, Any]:
        return {"teams": list(self.teams), "policies": list(self.policies), "tags": dict(self.tags)}


class WorkflowParams(BaseModel):
    """One entry of a policy's `workflows:`: the requests it selects and the tier they go to."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="named in the decision reason")
    tier: str = Field(description="the tier the workflow's requests go to (e.g. the student)")
    teams: list[str] = Field(default_factory=list, description="only these teams; [] = any")
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="the request body's `metadata` must carry each KEY: VALUE (as "
        "`distill export --tag KEY=VALUE`)",
    )
    teacher: str | None = Field(
        default=None,
        description="the tier the workflow's answers are compared with (shadow pairs, the "
        "drift monitor's quality retained); None = the policy's priciest tier",
    )

    @model_validator(mode="after")
    def _selects(self) -> WorkflowParams:
        # An entry that selects everything would be a fixed policy in disguise.
        if not self.teams and not self.tags:
            raise ValueError("a workflow needs teams or tags (else use a fixed policy)")
        return self


@dataclass(frozen=True, slots=True)
class Workflow:
    name: str
    tier: str
    teacher: str
    selector: Selector

    @property
    def reason(self) -> str:
        return f"workflow {self.name} -> {self.tier}"


def build_workflows(
    entries: Sequence[WorkflowParams], policy: str, default_teacher: str
) -> tuple[Workflow, ...]:
    return tuple(
        Workflow(
            e.name,
            e.tier,
            e.teacher or default_teacher,
            Selector(tuple(e.teams), (policy,), dict(e.tags)),
        )
        for e in entries
    )


def match(
    workflows: Sequence[Workflow], team: str | None, policy: str | None, body: Mapping[str, Any]
) -> Workflow | None:
    """The first workflow the request belongs to (config order), else None."""
    meta = body.get("metadata")
    metadata = meta if isinstance(meta, dict) else {}
    for w in workflows:
        if w.selector.matches(team, policy, metadata):
            return w
    return None
