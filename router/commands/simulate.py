"""`cost-router tune|simulate|what-if|synth` (registered by router/cli.py).

The commands load the router config here and hand the simulator only the sections it replays
(`simulations.sim_config.SimConfig`); without --config, the simulator's defaults with the same
`COST_ROUTER__*` environment overrides as a config file. The work itself is in
simulations/*_report.py. Heavy imports (numpy work, onnxruntime, pyarrow, matplotlib) happen
inside the commands so the root CLI starts fast. Known bad input exits with status 2 and one
`error:` line naming the record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from backends.config import SignalsConfig
from classifiers.dataset import DatasetError, routellm_data_dir
from policies.registry import tiers_by_price
from router.commands.common import load_config_or_exit
from router.config import RouterConfig, sim_config_from, simulator_defaults, write_threshold
from simulations.sim_config import SimConfig
from trace_format.config_base import ConfigError

if TYPE_CHECKING:  # heavy modules (tiktoken, the replay) load inside the commands (see above)
    from simulations.trace import ReplayTrace
    from simulations.whatif import Levers

TRACES = typer.Option(
    ..., "--traces", "-t", help="trace files/folders: JSONL, RouteLLM CSV, Parquet"
)
CONFIG = typer.Option(None, "--config", "-c", help="router YAML (default: RouteLLM README prices)")
POLICY = typer.Option(None, "--policy", "-p", help="policy name (default: the config's default)")
COMPLETION = typer.Option(
    None, "--completion-tokens", help="completion tokens for records with no count or answer text"
)
SMALL_COL = typer.Option(None, "--small-column", help="outcome column/key of the small tier")
LARGE_COL = typer.Option(None, "--large-column", help="outcome column/key of the large tier")
RECORDED = typer.Option(False, "--recorded-scores", help="use the trace's scores, do not re-score")
SCORES = typer.Option(
    None,
    "--scores",
    help="scores by request id (JSONL, e.g. `classifier train`'s <model>.oof.jsonl): "
    "replayed instead of re-scoring",
)
JSON_OUT = typer.Option(None, "--json", help="write the full result as JSON here")
CHART = typer.Option(None, "--chart", help="write a chart (.png or .html)")
SESSIONS_OFFLINE = typer.Option(
    False,
    "--sessions",
    help="replay conversations in order (trace `session`, `turn`) with a prompt cache per tier, "
    "each session mode side by side (docs/simulator.md)",
)
CACHE_TTL = typer.Option(
    300.0, "--cache-ttl-s", min=0, help="--sessions: how long a tier keeps a prompt cached"
)
HIT_RATE = typer.Option(
    None,
    "--hit-rate",
    min=0,
    max=1,
    help="--sessions: share of a cacheable prefix that hits, every tier (default: measured from "
    "the trace's cached_tokens)",
)
CACHE_BLOCK = typer.Option(
    1, "--cache-block", min=1, help="--sessions: the providers cache blocks of this many tokens"
)


@contextmanager
def _clean_errors() -> Iterator[None]:
    """Expected failures (bad trace, config, target) -> one line on stderr, exit status 2."""
    from classifiers.inference import ModelLoadError
    from simulations.latency import LatencyModelError
    from simulations.replay import ReplayError
    from simulations.trace import TraceError
    from simulations.tune import TuneError

    try:
        yield
    except (
        DatasetError,
        ModelLoadError,
        ConfigError,
        LatencyModelError,
        ReplayError,
        TraceError,
        TuneError,
        ValueError,
    ) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _configs(path: Path | None) -> tuple[SimConfig, RouterConfig | None]:
    """The simulator's config from the router YAML at `path` (exit 2 if bad), else its defaults."""
    if path is None:
        return simulator_defaults(), None
    router_config = load_config_or_exit(path)
    return sim_config_from(router_config), router_config


def _load(
    traces: list[Path],
    completion: int | None,
    small: str | None,
    large: str | None,
    config: Path | None,
    scores: Path | None = None,
    recorded: bool = False,
) -> tuple[SimConfig, RouterConfig | None, ReplayTrace]:
    """The config and the labelled requests of the traces (a proxy trace folder's labels and
    feedback merged in; unlabelled requests left out, said on stderr), with the scores of
    `scores` when given. Warns when the model would score prompts it was trained on."""
    from classifiers.model_files import model_file
    from classifiers.provenance import in_sample_note
    from simulations.trace_loader import load_labelled_trace, with_scores

    sim, router_config = _configs(config)
    trace, notes = load_labelled_trace(
        list(traces),
        small_column=small,
        large_column=large,
        default_completion_tokens=completion,
        context_turns=sim.context_turns,
    )
    for note in notes:
        typer.echo(note, err=True)
    if scores is not None:
        return sim, router_config, with_scores(trace, scores)
    if not recorded:
        note = in_sample_note(model_file(sim.model_path), trace.texts, "the results")
        if note:
            typer.echo(note, err=True)
    return sim, router_config, trace


def _experiment_note(config: RouterConfig | None, sim: SimConfig, policy: str | None) -> str:
    """A note when the config's experiments serve some requests with another policy than the
    one replayed: the live proxy's cost (what `budget show` charged) then differs from the
    replay's, and the note says why and how to replay an arm."""
    replayed = policy or sim.default_policy
    parts = []
    for exp in config.experiments if config is not None else []:
        arms = [f"{arm.policy} ({name})" for name, arm in sorted(exp.arms.items())]
        if any(arm.policy != replayed for arm in exp.arms.values()):
            who = f" to team(s) {', '.join(exp.teams)}" if exp.teams else ""
            parts.append(f"experiment {exp.name!r} serves its arms{who} with {', '.join(arms)}")
    if not parts:
        return ""
    return (
        f"note: {'; '.join(parts)}; this replay routes every request with policy {replayed!r} "
        "(--policy NAME replays another; `cost-router ab report` compares the arms as served)"
    )


def _measured(
    levers: Levers, sim: SimConfig, config: RouterConfig | None, source: str
) -> tuple[Levers, list[str]]:
    """Levers with the measured values of `--signals SOURCE`."""
    from simulations.signal_levers import apply_measurements, measured_levers, read_signals

    if config is not None:
        return measured_levers(levers, config.tiers, source, config.signals)
    # The simulator's default tiers: a snapshot names them; nothing to poll live.
    order = tiers_by_price(sim.prices)
    signals = read_signals(source, [], SignalsConfig())
    return apply_measurements(levers, signals, order[0], order[-1])


def tune_cmd(
    traces: list[Path] = TRACES,
    target_quality: float = typer.Option(None, "--target-quality", help="e.g. 0.95 of all-large"),
    target_cost: float = typer.Option(None, "--target-cost", help="max USD per 1,000 requests"),
    max_large_share: float = typer.Option(None, "--max-large-share", help="e.g. 0.3"),
    config: Path = CONFIG,
    policy: str = POLICY,
    write: Path = typer.Option(None, "--write", help="write the threshold into this router YAML"),
    grid: int = typer.Option(1001, "--grid", min=2, help="thresholds swept in [0, 1]"),
    resamples: int = typer.Option(1000, "--bootstrap", min=0, help="bootstrap resamples"),
    seed: int = typer.Option(0, "--seed"),
    completion_tokens: int = COMPLETION,
    small_column: str = SMALL_COL,
    large_column: str = LARGE_COL,
    recorded_scores: bool = RECORDED,
    scores: Path = SCORES,
    json_out: Path = JSON_OUT,
    chart: Path = CHART,
    sessions: bool = SESSIONS_OFFLINE,
    cache_ttl_s: float = CACHE_TTL,
    hit_rate: float = HIT_RATE,
    cache_block: int = CACHE_BLOCK,
) -> None:
    """Pick the threshold meeting a target, with bootstrap 95% intervals; optionally write it.

    With --sessions: the threshold per session mode, conversations replayed with a prompt cache
    (no bootstrap); --write writes the threshold of the policy's own mode."""
    with _clean_errors():
        from simulations.tune_report import run_tune

        given = [
            (k, v)
            for k, v in (
                ("quality", target_quality),
                ("cost", target_cost),
                ("large_share", max_large_share),
            )
            if v is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of --target-quality, --target-cost, --max-large-share"
            )
        if sessions:
            from simulations.session_inputs import CacheOptions
            from simulations.tune_report import run_tune_sessions

            if scores is not None or chart is not None:
                # A session replay decides on the scores the trace recorded (sessions.py).
                raise ValueError(
                    "--sessions replays the trace's recorded scores: drop --scores and --chart"
                )

            sim, _ = _configs(config if config is not None else write)
            options = CacheOptions(cache_ttl_s, hit_rate, cache_block)
            text, tuned = run_tune_sessions(sim, traces, given[0], policy, options, json_out)
            mine = tuned.configured()
            if write and mine.threshold is not None:
                name = write_threshold(write, policy, mine.threshold, given[0])
                text += f"\nwrote policies.{name}.threshold = {mine.threshold:.6g} to {write}"
            elif write:
                raise ValueError(f"nothing written to {write}: {mine.mode}: {mine.best}")
            typer.echo(text)
            return
        sim, _, trace = _load(
            traces,
            completion_tokens,
            small_column,
            large_column,
            config if config is not None else write,
            scores,
            recorded_scores,
        )
        recorded = recorded_scores or scores is not None
        text, result = run_tune(
            sim, trace, given[0], policy, grid, resamples, seed, recorded, json_out, chart
        )
        if write:
            name = write_threshold(write, policy, result.threshold, given[0])
            text += f"\nwrote policies.{name}.threshold = {result.threshold:.6g} to {write}"
        typer.echo(text)


def simulate_cmd(
    traces: list[Path] = TRACES,
    config: Path = CONFIG,
    policy: str = POLICY,
    budgets: bool = typer.Option(False, "--budgets", help="replay team budgets over time"),
    pacing_max: float = typer.Option(1.0, "--pacing-max-threshold", min=0, max=1),
    pacing_slack: float = typer.Option(0.2, "--pacing-slack", min=0.01, max=1),
    stream: bool = typer.Option(False, "--stream", help="Parquet: stream in batches (huge files)"),
    batch_rows: int = typer.Option(262_144, "--batch-rows", min=1),
    completion_tokens: int = COMPLETION,
    small_column: str = SMALL_COL,
    large_column: str = LARGE_COL,
    recorded_scores: bool = RECORDED,
    scores: Path = SCORES,
    json_out: Path = JSON_OUT,
    decisions: Path = typer.Option(
        None, "--decisions", help="write each request's tier, score, cost (JSONL) here"
    ),
    compare: bool = typer.Option(False, "--compare", help="also replay every configured policy"),
    sessions: bool = typer.Option(
        False,
        "--sessions",
        help="replay conversations in order (trace `session`, `turn`) with a prompt cache per "
        "tier: every session mode side by side (needs no outcomes)",
    ),
    cache_ttl_s: float = typer.Option(
        300.0, "--cache-ttl-s", min=0, help="--sessions: how long a tier keeps a prompt cached"
    ),
    hit_rate: float = typer.Option(
        None,
        "--hit-rate",
        min=0,
        max=1,
        help="--sessions: share of a cacheable prefix that hits, every tier (default: measured "
        "from the trace's cached_tokens)",
    ),
    cache_block: int = typer.Option(
        1,
        "--cache-block",
        min=1,
        help="--sessions: the providers cache whole blocks of this many tokens (OpenAI 128, "
        "the echo upstream 16; 1 = exact)",
    ),
    equal_share: float = typer.Option(
        None,
        "--equal-share",
        min=0,
        max=1,
        help="--sessions: compare the modes at this share of large requests, each at the "
        "threshold that gives it (a threshold policy)",
    ),
) -> None:
    """Replay traces through a policy: tier shares, cost, quality; budgets over time."""
    with _clean_errors():
        from simulations.replay_report import run_simulate, run_stream

        if sessions:
            from simulations.session_report import run_sessions

            sim, _ = _configs(config)
            typer.echo(
                run_sessions(
                    sim, traces, policy, cache_ttl_s, hit_rate, json_out, cache_block, equal_share
                )
            )
            return
        if stream:
            if len(traces) != 1 or traces[0].suffix != ".parquet":
                raise ValueError("--stream takes exactly one .parquet trace")
            sim, _ = _configs(config)
            typer.echo(run_stream(sim, traces[0], policy, recorded_scores, batch_rows, json_out))
            return
        sim, router_config, trace = _load(
            traces, completion_tokens, small_column, large_column, config, scores, recorded_scores
        )
        if note := _experiment_note(router_config, sim, policy):
            typer.echo(note, err=True)
        typer.echo(
            run_simulate(
                sim,
                trace,
                policy,
                recorded_scores or scores is not None,
                budgets,
                (pacing_max, pacing_slack),
                json_out,
                decisions,
                compare,
            )
        )


def what_if_cmd(
    traces: list[Path] = TRACES,
    config: Path = CONFIG,
    policy: str = POLICY,
    arrival_rate: float = typer.Option(
        None, "--arrival-rate", help="requests/s of Poisson arrivals for traces without times"
    ),
    small_ttft_ms: float = typer.Option(120.0, "--small-ttft-ms"),
    small_token_ms: float = typer.Option(8.0, "--small-token-ms"),
    small_concurrency: int = typer.Option(16, "--small-concurrency", min=1),
    large_ttft_ms: float = typer.Option(400.0, "--large-ttft-ms"),
    large_token_ms: float = typer.Option(25.0, "--large-token-ms"),
    large_concurrency: int = typer.Option(16, "--large-concurrency", min=1),
    prefill_token_ms: float = typer.Option(
        0.0, "--prefill-token-ms", help="extra TTFT per prompt token (large tier)"
    ),
    spec_acceptance: float = typer.Option(0.7, "--spec-acceptance", min=0, max=1),
    spec_k: int = typer.Option(
        None, "--spec-k", min=1, help="draft length (default: the large tier's launch config, or 5)"
    ),
    draft_cost: float = typer.Option(0.0, "--draft-cost", min=0),
    quant_speed: float = typer.Option(1.6, "--quant-speed"),
    quant_quality: float = typer.Option(0.98, "--quant-quality", min=0),
    quant_cost: float = typer.Option(1.0, "--quant-cost", min=0),
    seed: int = typer.Option(0, "--seed"),
    completion_tokens: int = COMPLETION,
    small_column: str = SMALL_COL,
    large_column: str = LARGE_COL,
    recorded_scores: bool = RECORDED,
    json_out: Path = JSON_OUT,
    chart: Path = CHART,
    signals: str = typer.Option(
        None,
        "--signals",
        help="measured TTFT/per-token/acceptance: a snapshot JSON from `cost-router backends "
        "signals --save`, or 'live' to poll the config's tiers now",
    ),
    levers_file: Path = typer.Option(
        None,
        "--levers",
        help="measured lever factors (quantized speed, quality and price; speculative "
        "acceptance and speed-up): the levers.json of `cost-router levers trial`",
    ),
    sessions: bool = SESSIONS_OFFLINE,
    cache_ttl_s: float = CACHE_TTL,
    hit_rate: float = HIT_RATE,
    cache_block: int = CACHE_BLOCK,
) -> None:
    """Cost, quality, p50/p95 latency: all-large, all-small, each lever alone, then combined."""
    with _clean_errors():
        from simulations.latency import TierLatency
        from simulations.trace import MissingTimesError
        from simulations.whatif import DEFAULT_DRAFT_LENGTH, Levers
        from simulations.whatif_report import run_whatif

        levers = Levers(
            small=TierLatency(small_ttft_ms / 1e3, small_token_ms / 1e3, small_concurrency),
            large=TierLatency(
                large_ttft_ms / 1e3, large_token_ms / 1e3, large_concurrency, prefill_token_ms / 1e3
            ),
            spec_acceptance=spec_acceptance,
            draft_cost=draft_cost,
            quant_speed=quant_speed,
            quant_quality=quant_quality,
            quant_cost=quant_cost,
        )
        if sessions:
            from simulations.session_inputs import CacheOptions
            from simulations.whatif_report import run_whatif_sessions

            if signals is not None or levers_file is not None or chart is not None:
                raise ValueError(
                    "--sessions takes the tiers' latency options (--small-ttft-ms ...), not "
                    "--signals, --levers or --chart"
                )

            sim, _ = _configs(config)
            options = CacheOptions(cache_ttl_s, hit_rate, cache_block)
            typer.echo(run_whatif_sessions(sim, traces, policy, levers, options, json_out))
            return
        sim, router_config, trace = _load(
            traces, completion_tokens, small_column, large_column, config, None, recorded_scores
        )
        if note := _experiment_note(router_config, sim, policy):
            typer.echo(note, err=True)
        levers = replace(levers, spec_k=spec_k or sim.draft_length or DEFAULT_DRAFT_LENGTH)
        if signals is not None:
            levers, notes = _measured(levers, sim, router_config, signals)
            typer.echo("\n".join(notes))
        if levers_file is not None:
            from simulations.levers.levers_file import apply_levers

            levers, notes = apply_levers(levers, levers_file)
            typer.echo("\n".join(notes))
        try:
            text = run_whatif(
                sim, trace, policy, recorded_scores, levers, arrival_rate, seed, json_out, chart
            )
        except MissingTimesError as exc:
            raise MissingTimesError(
                f"{exc}; what-if replays requests at their arrival times: give --arrival-rate "
                "REQUESTS_PER_S to replay this trace with Poisson arrivals instead"
            ) from None
        typer.echo(text)


def synth_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Parquet file to write"),
    rows: int = typer.Option(1_000_000, "--rows", "-n", min=1),
    source: list[Path] = typer.Option(
        [routellm_data_dir()], "--from", help="prompt pool: CSV/JSONL traces"
    ),
    rate: float = typer.Option(50.0, "--rate", help="mean requests per second"),
    teams: int = typer.Option(20, "--teams", min=1),
    seed: int = typer.Option(0, "--seed"),
    completion_tokens: int = typer.Option(
        1, "--completion-tokens", help="for pool prompts with no count or answer (MMLU: 1)"
    ),
    with_scores: bool = typer.Option(
        False, "--with-scores", help="add a `score` column (the shipped classifier's)"
    ),
) -> None:
    """Write a large synthetic trace (real prompts and outcomes, Poisson arrivals, Zipf teams)."""
    with _clean_errors():
        import time

        from simulations.synth import SynthSpec, pool_from_trace, write_synthetic
        from simulations.trace_loader import load_trace

        t0 = time.perf_counter()
        pool = pool_from_trace(
            load_trace(list(source), default_completion_tokens=completion_tokens)
        )
        if with_scores:
            from simulations.replay import score_texts

            pool = replace(pool, scores=score_texts(pool.texts, None))
        n = write_synthetic(
            pool, SynthSpec(rows=rows, rate_per_s=rate, teams=teams, seed=seed), out
        )
        typer.echo(
            f"wrote {n} requests ({len(pool)} distinct prompts) to {out} "
            f"in {time.perf_counter() - t0:.1f} s"
        )


def register_simulation_commands(app: typer.Typer) -> None:
    """Adds the simulator's top-level commands to the root app."""
    commands: dict[str, Callable[..., None]] = {
        "tune": tune_cmd,
        "simulate": simulate_cmd,
        "what-if": what_if_cmd,
        "synth": synth_cmd,
    }
    for name, fn in commands.items():
        app.command(name)(fn)
