"""`simulate`'s report: the replay summary against the all-small/all-large baselines, every
policy compared, team budgets over time (plain and paced), the per-request decisions file, and the
streaming summary of huge Parquet traces. Each function returns the text the command prints."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import orjson

from classifiers.inference import DifficultyScorer
from simulations import reports
from simulations.budget_replay import TeamTally, budget_replay
from simulations.replay import ReplayResult, TierPrices, replay, role_costs, trace_scores
from simulations.sim_config import SimConfig
from simulations.stream import stream_replay
from simulations.trace import ReplayTrace


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def replay_text(summary: dict[str, object], baselines: dict[str, float]) -> str:
    share = summary["share"]
    assert isinstance(share, dict)
    rows = [
        ("requests", summary["requests"]),
        *((f"share {t}", f"{v:.2%}") for t, v in share.items()),
        ("cost USD", f"{summary['cost_usd']:.4f}"),
        ("cost per 1k requests", f"${summary['cost_per_1k']:.4f}"),
        ("quality", "-" if summary.get("quality") is None else f"{summary['quality']:.4f}"),
        *(
            (label, summary[key])
            for key, label in (
                ("context_window_moved", "moved: context window"),
                ("context_window_refused", "refused: context window"),
            )
            if key in summary
        ),
        *((k, f"{v:.4f}") for k, v in baselines.items()),
    ]
    return reports.table(["", str(summary.get("policy", ""))], rows)


def budget_text(tallies: dict[str, TeamTally]) -> str:
    rows = []
    for t in tallies.values():
        d = t.as_dict()
        rows.append(
            (
                d["team"],
                "-" if d["limit_usd"] is None else f"{d['limit_usd']:g}",
                d["period"] or "-",
                d["requests"],
                d["large"],
                d["downgraded"],
                d["refused"],
                f"{d['spent_usd']:.4f}",
                _fmt_time(d["first_downgrade"]),
                _fmt_time(d["exhausted_at"]),
            )
        )
    return reports.table(
        [
            "team",
            "limit $",
            "period",
            "requests",
            "large",
            "downgraded",
            "refused",
            "spent $",
            "first downgrade",
            "exhausted",
        ],
        rows,
    )


def run_simulate(
    sim: SimConfig,
    trace: ReplayTrace,
    policy: str | None,
    recorded: bool,
    budgets: bool,
    pacing: tuple[float, float],
    json_out: Path | None,
    decisions: Path | None = None,
    compare: bool = False,
) -> str:
    scores = trace_scores(trace, sim.model_path, recorded)
    result = replay(sim, trace, scores, policy)
    if decisions:
        write_decisions(decisions, trace, result)
    summary = result.summary()
    baselines: dict[str, float] = {}
    prices = TierPrices.from_prices(sim.prices)
    cost = role_costs(prices, trace.prompt_tokens, trace.completion_tokens, trace.cache)
    for role, label in ((0, "all-small"), (1, "all-large")):
        baselines[f"{label} cost per 1k"] = float(cost[:, role].mean() * 1000)
        q = trace.quality[:, role]
        if not np.isnan(q).all():
            baselines[f"{label} quality"] = float(np.nanmean(q))
    out: dict[str, object] = {"summary": summary, "baselines": baselines}
    text = replay_text(summary, baselines)
    if compare:
        rows = [replay(sim, trace, scores, name).summary() for name in sim.policies]
        out["policies"] = rows
        text += "\n\nevery configured policy on this trace:\n" + compare_text(rows)
    if budgets:
        plain = budget_replay(sim, trace, scores, policy)
        with_pacing = budget_replay(sim, trace, scores, policy, pacing)
        text += "\n\nbudgets, as configured:\n" + budget_text(plain)
        if own := _own_policies(sim, trace, policy):
            # The headline replays one policy; a team with its own is replayed with its own.
            text += f"\n(teams with their own policy, not the headline's: {own})"
        text += (
            f"\n\nbudgets with budget_pacing (max_threshold {pacing[0]:g}, slack "
            f"{pacing[1]:g}):\n" + budget_text(with_pacing)
        )
        out["budgets"] = [t.as_dict() for t in plain.values()]
        out["budgets_paced"] = [t.as_dict() for t in with_pacing.values()]
    if json_out:
        reports.write_json(json_out, out)
    return text


def _own_policies(sim: SimConfig, trace: ReplayTrace, policy: str | None) -> str:
    """'team: policy, ...' for the trace's teams that the budget replay gives another policy
    than the headline's (empty when none does: then both count the same decisions)."""
    if policy is not None:
        return ""  # --policy replays every team with it
    teams = sorted({str(t) for t in trace.require_teams()})
    own = {t: sim.teams[t].policy for t in teams if t in sim.teams and sim.teams[t].policy}
    return ", ".join(f"{t}: {p}" for t, p in own.items() if p != sim.default_policy)


def compare_text(summaries: list[dict[str, object]]) -> str:
    rows = []
    for s in summaries:
        share = s["share"]
        assert isinstance(share, dict)
        q = s.get("quality")
        rows.append(
            (
                s["policy"],
                *(f"{v:.1%}" for v in share.values()),
                f"{s['cost_per_1k']:.4f}",
                "-" if q is None else f"{q:.4f}",
            )
        )
    tiers = list(summaries[0]["share"]) if summaries else []  # type: ignore[arg-type]
    return reports.table(["policy", *tiers, "$/1k", "quality"], rows)


def write_decisions(path: Path, trace: ReplayTrace, result: ReplayResult) -> None:
    """One JSON line per request: the simulator's decision, to diff against a proxy trace. Rows
    are in arrival order, which is not the order of a proxy's files (it writes a request when it
    finishes, each replica its own file), so each row names its request `id` to match by."""
    units = trace.units()
    with path.open("wb") as out:
        for i in range(len(trace)):
            q = float(result.quality[i])
            row = {
                "row": i,
                "id": units[i],
                "record": trace.record(i),
                "score": float(result.scores[i]),
                "tier": result.tiers[int(result.tier_idx[i])],
                "cost_usd": float(result.cost_usd[i]),
                "quality": None if np.isnan(q) else q,
            }
            out.write(orjson.dumps(row) + b"\n")


def run_stream(
    sim: SimConfig,
    path: Path,
    policy: str | None,
    recorded: bool,
    batch_rows: int,
    json_out: Path | None,
) -> str:
    scorer = DifficultyScorer.load(sim.model_path)
    totals = stream_replay(sim, path, scorer.score_texts, policy, batch_rows, use_recorded=recorded)
    summary = totals.summary()
    if json_out:
        reports.write_json(json_out, {"summary": summary, "sweep": totals.sweep_rows()})
    teams = summary.pop("team_cost_usd")
    assert isinstance(teams, dict)
    text = replay_text(summary, {})
    top = sorted(teams.items(), key=lambda kv: -kv[1])[:10]
    return (
        text
        + "\n\nspend by team (top 10):\n"
        + reports.table(["team", "USD"], [(k, f"{v:.2f}") for k, v in top])
    )
