"""The `evaluation:` section: which requests get a shadow answer from another tier, what that may
spend, what is stored, and which judges label the pairs."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import Field

from trace_format.config_base import ConfigError, StrictModel

# The budget store scope that shadow and judge spend is charged to. Not a team anyone can be in:
# team names come from config keys and API keys, and this one is refused there.
SHADOW_SCOPE = "__shadow__"
ALL_TEAMS = "*"


class LlmJudgeConfig(StrictModel):
    tier: str = Field(
        description="the configured tier that judges (any backend kind, litellm "
        "included); its price is what judging costs"
    )
    mode: Literal["pairwise", "single"] = Field(
        default="pairwise",
        description="pairwise: which answer is better, asked in both orders (MT-Bench); "
        "single: each answer graded 1-10 on its own",
    )
    prompt: str | None = Field(
        default=None,
        description="file with the judge prompt ({question}, {answer_a}, {answer_b} or "
        "{answer}); None = the shipped prompts/pairwise_v1.txt or single_v1.txt",
    )
    max_tokens: int = Field(default=512, ge=1, description="per judge call")
    temperature: float = Field(default=0.0, ge=0, le=2)
    constrain: Literal["auto", "json_schema", "json_object", "grammar", "none"] = Field(
        default="auto",
        description="how the judge model is held to a readable verdict: json_schema = OpenAI "
        "structured outputs (response_format json_schema: hosted models, vLLM, llama.cpp's "
        "llama-server); json_object = the same schema in llama-cpp-python's response_format "
        "dialect; grammar = a GBNF `grammar` forcing the prompt's own [[A]] / [[7]] (llama.cpp "
        "servers, llama-cpp-python included); none = free text; auto = json_schema, then "
        "grammar, then none, moving on when the judge's server answers one with an error",
    )


class ReferenceJudgeConfig(StrictModel):
    match: Literal["auto", "numeric", "exact"] = Field(
        default="auto",
        description="numeric: the last number of the answer equals the reference's (GSM8K); "
        "exact: equal after trimming and case folding; auto: numeric when the reference is a "
        "number",
    )
    tolerance: float = Field(default=1e-6, ge=0, description="numeric match: absolute tolerance")
    metadata_key: str = Field(
        default="reference_answer", description="key of the request's `metadata` holding the answer"
    )


class JudgesConfig(StrictModel):
    llm: LlmJudgeConfig | None = Field(default=None, description="None = no llm judge")
    reference: ReferenceJudgeConfig | None = Field(
        default_factory=ReferenceJudgeConfig,
        description="labels requests that carry a reference answer; None = off",
    )


class EvaluationConfig(StrictModel):
    enabled: bool = Field(default=False, description="shadow comparisons on or off")
    sample_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="fraction of answered requests shadowed, chosen by "
        "a hash of the request id (the same on every replica)",
    )
    salt: str = Field(default="shadow", description="salt of the sampling hash")
    teams: list[str] | None = Field(default=None, description="only these teams; None = all")
    policies: list[str] | None = Field(
        default=None,
        description="only requests routed by these policies ('passthrough' = an explicit "
        "tier); None = all",
    )
    shadow_tier: str | None = Field(
        default=None,
        description="always shadow on this tier; None = the policy's counterpart (its cheapest "
        "tier when its priciest answered, else its priciest)",
    )
    rate_per_s: float | None = Field(
        default=None,
        gt=0,
        description="at most this many shadow requests per second per replica; None = no limit",
    )
    daily_cap_usd: float = Field(
        default=1.0,
        ge=0,
        description="shadow plus judge spend per day, across replicas: reserved in the budget "
        f"store under team {SHADOW_SCOPE!r} before each call",
    )
    queue_size: int = Field(
        default=256, ge=1, description="shadow jobs waiting; a full queue drops (and counts)"
    )
    workers: int = Field(default=2, ge=1, le=256, description="shadow and judge calls at once")
    path: str | None = Field(
        default=None, description="shadow record file; None = shadow.jsonl beside traces"
    )
    store_content_teams: list[str] = Field(
        default_factory=list,
        description=f"teams whose prompt and answer texts are stored ({ALL_TEAMS!r} = all); "
        "others get tokens, latency and cost only",
    )
    retention_days: float = Field(
        default=30.0, gt=0, description="shadow records older than this are pruned"
    )
    prune_interval_s: float = Field(
        default=3600.0, gt=0, description="how often old shadow records are pruned"
    )
    judges: JudgesConfig = Field(default_factory=JudgesConfig)

    def stores_content(self, team: str | None) -> bool:
        teams = self.store_content_teams
        return ALL_TEAMS in teams or (team is not None and team in teams)


def check_evaluation(
    ev: EvaluationConfig,
    tiers: Collection[str],
    teams: Collection[str],
    policies: Collection[str],
    traces_path: str | None,
) -> None:
    """The references of the section, each problem naming its key (raises ConfigError)."""
    problems: list[str] = []
    if SHADOW_SCOPE in teams:
        problems.append(f"teams: the team name {SHADOW_SCOPE!r} is reserved for shadow spend")
    if ev.shadow_tier is not None and ev.shadow_tier not in tiers:
        problems.append(f"evaluation.shadow_tier: unknown tier {ev.shadow_tier!r}")
    if ev.judges.llm is not None and ev.judges.llm.tier not in tiers:
        problems.append(f"evaluation.judges.llm.tier: unknown tier {ev.judges.llm.tier!r}")
    for i, name in enumerate(ev.policies or []):
        if name != "passthrough" and name not in policies:
            problems.append(f"evaluation.policies.{i}: unknown policy {name!r}")
    if ev.enabled and ev.path is None and traces_path is None:
        problems.append(
            "evaluation.path: needed when traces.path is null (shadow records and "
            "labels go beside the traces)"
        )
    if problems:
        raise ConfigError("; ".join(problems))
