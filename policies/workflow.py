"""Which requests are a workflow, and where a policy sends one (its `workflows:` option).

`Selector` is the one definition of "these requests": teams, policies, `metadata` tags
(KEY=VALUE of the request body's `metadata` object) and prompt clusters (ids of a cluster model
`cost-router distill clusters` fitted, classifiers/prompt_clusters.py), each empty meaning any.
`cost-router distill export` selects a workflow's rows with it; a policy's `workflows:` entry
routes the same requests to a tier (e.g. the student distilled from the teacher's answers), before
any scoring. The clusters are asked last: only a request the cheap checks let through is
clustered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from classifiers.prompt_clusters import ClusterLoadError, PromptClusters
from trace_format.config_base import ConfigError


@dataclass(frozen=True)
class ClusterSelect:
    """Prompts of these clusters of one cluster model."""

    model: PromptClusters
    ids: frozenset[int]

    def matches(self, body: Mapping[str, Any]) -> bool:
        return self.model.of_body(body) in self.ids

    def describe(self) -> dict[str, Any]:
        return {**self.model.describe(), "ids": sorted(self.ids)}


def cluster_select(path: str, ids: Sequence[int], key: str) -> ClusterSelect:
    """Load the model and check the ids against it; ConfigError names `key` and the file."""
    try:
        model = PromptClusters.load(path)
    except ClusterLoadError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    bad = sorted(i for i in ids if not 0 <= i < model.k)
    if bad:
        raise ConfigError(f"{key}: {path} has clusters 0..{model.k - 1}, not {bad}")
    return ClusterSelect(model, frozenset(ids))


@dataclass(frozen=True)
class Selector:
    """A workflow: requests of these teams and policies carrying these `metadata` tags whose
    prompt falls in these clusters (each empty: any). The same selector routes a workflow to a
    tier (`Workflow` below)."""

    teams: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    clusters: ClusterSelect | None = None

    def matches(
        self,
        team: str | None,
        policy: str | None,
        metadata: Mapping[str, Any],
        body: Mapping[str, Any] | None = None,
    ) -> bool:
        """`body` (a chat body: its messages) is read only where clusters are selected."""
        if self.teams and team not in self.teams:
            return False
        if self.policies and policy not in self.policies:
            return False
        if not all(str(metadata.get(k)) == v for k, v in self.tags.items()):
            return False
        return self.clusters is None or self.clusters.matches(body or {})

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "teams": list(self.teams),
            "policies": list(self.policies),
            "tags": dict(self.tags),
        }
        if self.clusters is not None:
            out["clusters"] = self.clusters.describe()
        return out


class ClustersParams(BaseModel):
    """A workflow's prompt clusters: ids of a model `cost-router distill clusters` wrote."""

    model_config = ConfigDict(extra="forbid")
    file: str = Field(description="the cluster model (.onnx) `cost-router distill clusters` wrote")
    ids: list[int] = Field(min_length=1, description="the clusters of the workflow (its ids)")


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
    clusters: ClustersParams | None = Field(
        default=None,
        description="only prompts of these clusters (as `distill export --clusters F --cluster "
        "N`); None = any prompt",
    )
    teacher: str | None = Field(
        default=None,
        description="the tier the workflow's answers are compared with (shadow pairs, the "
        "drift monitor's quality retained); None = the policy's priciest tier",
    )

    @model_validator(mode="after")
    def _selects(self) -> WorkflowParams:
        # An entry that selects everything would be a fixed policy in disguise.
        if not self.teams and not self.tags and self.clusters is None:
            raise ValueError("a workflow needs teams, tags or clusters (else use a fixed policy)")
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
    """Raises ConfigError (naming `policies.<policy>.workflows.<i>.clusters`) for a cluster
    model that cannot be loaded or lacks an id."""
    out = []
    for i, e in enumerate(entries):
        clusters = None
        if e.clusters is not None:
            key = f"policies.{policy}.workflows.{i}.clusters"
            clusters = cluster_select(e.clusters.file, e.clusters.ids, key)
        selector = Selector(tuple(e.teams), (policy,), dict(e.tags), clusters)
        out.append(Workflow(e.name, e.tier, e.teacher or default_teacher, selector))
    return tuple(out)


def match(
    workflows: Sequence[Workflow], team: str | None, policy: str | None, body: Mapping[str, Any]
) -> Workflow | None:
    """The first workflow the request belongs to (config order), else None."""
    meta = body.get("metadata")
    metadata = meta if isinstance(meta, dict) else {}
    for w in workflows:
        if w.selector.matches(team, policy, metadata, body):
            return w
    return None
