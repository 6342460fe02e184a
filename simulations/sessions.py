"""Replaying conversations: each session's requests in order, a prompt cache per tier, each
session mode side by side on the same trace (issue 23, item 6; docs/conversations.md).

The same code as the proxy decides: the policy's `decide_batch` (simulations/replay.py
`decide`), the session mode's plan and the store's update (policies/sessions/modes.py `plan`,
policies/sessions/store.py `choose` and `apply`, as the in-process store runs them), the
context-window rule (policies/context_window.py `fit_tier`) and the price (`Price.cost_nanos`,
with cached and cache-write tokens). Only the prompt cache is a model:

- **What a tier holds.** Per session and tier, the prompt of that session's latest request the
  tier served, for `ttl_s` after it (a provider's prompt cache, OpenAI's and the caching echo
  upstream's: a later prompt that extends it reads that prefix from the cache). A request's
  cacheable prefix is `min(that prompt, its own prompt)` while it is live, else 0, rounded down
  to whole blocks of `block` tokens where the provider caches in blocks (OpenAI: 128; vLLM:
  its KV block size; the caching echo upstream: 16).
- **How much of it hits.** `hit_rate` per tier: what the trace's own `cached_tokens` show, the
  tokens cached over the cacheable prefix the model gives the trace as it was served, on the
  requests that have one (`measure_cache`; block rounding and evictions land in it). A tier
  whose trace shows no `cached_tokens` (or no cacheable prefix) gets `default_hit_rate`.
- **What other sessions left.** A prompt that starts like other conversations' (a shared system
  prompt) hits the cache without a prefix of its own session: `shared_tokens` per tier, the mean
  cached tokens of the trace's requests without a cacheable prefix, is the least a request on
  that tier reads (no more than its prompt).
- **Writes.** A tier that prices cache writes (`price.cache_write_per_mtok` set: Anthropic) is
  charged a write for the prompt tokens it did not read from the cache; the others write for
  free (OpenAI's and vLLM's caches), so no write is counted.

The session's own inputs are the trace's: the requests' order (`session`, then `turn`, then
`time`), their token counts, the policy's score (`score`: a request without one named its
tier, which is kept) and whether it carried a tool result (`session_reason: tool_loop`).
cache_aware's quote is the proxy's own, recorded in the trace (`session_prompt_tokens`,
`session_prefix_tokens`: set by the messages alone, so the same under every mode); for a trace
without it, the conversation up to the last answer is the previous request's prompt plus its
completion tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.config import NANOS_PER_USD, Price
from policies.base import Policy, Tunable
from policies.context_window import fit_tier
from policies.registry import session_settings, tiers_by_price
from policies.sessions.config import DEFAULT_SESSION, MODES, Mode, SessionParams
from policies.sessions.modes import TOOL_LOOP, CacheQuote, plan
from policies.sessions.store import SessionState, apply, choose
from simulations.replay import ReplayError, TierPrices, decide, pick_policy
from simulations.sim_config import SimConfig
from simulations.trace import TraceError
from trace_format.reader import TraceFormatError, data_files, is_trace_file, iter_records

# OpenAI keeps a prompt prefix 5 to 10 minutes after its last use; the caching echo upstream 300 s.
DEFAULT_CACHE_TTL_S = 300.0
DEFAULT_HIT_RATE = 1.0


@dataclass(frozen=True)
class SessionTrace:
    """The requests of a trace that a session replay prices, grouped by session and in order."""

    ids: list[str]
    sessions: np.ndarray  # (n,) object: the session id (a request without one: its own)
    times: np.ndarray  # (n,) float64
    tiers: np.ndarray  # (n,) object: the tier that served it in the trace
    scores: np.ndarray  # (n,) float64, NaN: no policy scored it (the client named a tier)
    prompt_tokens: np.ndarray  # (n,) int64
    completion_tokens: np.ndarray  # (n,) int64
    cached_tokens: np.ndarray  # (n,) int64, -1: the trace does not say
    cost_usd: np.ndarray  # (n,) float64, what the proxy charged (NaN: not recorded)
    tool_loop: np.ndarray  # (n,) bool: it carried a tool result (session_reason tool_loop)
    # The proxy's estimate of the prompt and its prefix up to the last answer (trace fields
    # session_prompt_tokens / session_prefix_tokens), what cache_aware prices; -1: not recorded.
    quote_prompt: np.ndarray | None = None  # (n,) int64
    quote_prefix: np.ndarray | None = None  # (n,) int64
    source: str = "trace"

    def __len__(self) -> int:
        return len(self.ids)

    def session_rows(self) -> list[np.ndarray]:
        """Row indices of each session, in order (the rows are sorted by session already)."""
        if not len(self):
            return []
        change = np.flatnonzero(self.sessions[1:] != self.sessions[:-1]) + 1
        return np.split(np.arange(len(self)), change)


def load_session_trace(paths: Iterable[str | Path]) -> SessionTrace:
    """The served chat and completion requests of JSONL traces (files or folders), through the
    one trace reader; sorted by session, then turn, then time. Failed requests are left out
    (nothing was charged); a record without token counts is an error naming it."""
    rows: list[tuple[str, int, float, str, str, float, int, int, int, float, bool, int, int]] = []
    for path in paths:
        try:
            files = [f for f in data_files(path) if is_trace_file(f)]
        except TraceFormatError as exc:
            raise TraceError(str(exc)) from None
        for file in files:
            try:
                for where, r in iter_records(file):
                    if r.status not in (None, 200) or r.tier is None or r.endpoint == "embeddings":
                        continue
                    if r.prompt_tokens is None or r.completion_tokens is None:
                        raise TraceError(
                            f"{where}: missing field 'prompt_tokens' or 'completion_tokens'"
                        )
                    rows.append(
                        (
                            r.session or f"request:{r.id}",
                            -1 if r.turn is None else r.turn,
                            r.time,
                            r.id,
                            r.tier,
                            np.nan if r.score is None else r.score,
                            r.prompt_tokens,
                            r.completion_tokens,
                            -1 if r.cached_tokens is None else r.cached_tokens,
                            np.nan if r.cost_usd is None else r.cost_usd,
                            r.session_reason == TOOL_LOOP,
                            -1 if r.session_prompt_tokens is None else r.session_prompt_tokens,
                            -1 if r.session_prefix_tokens is None else r.session_prefix_tokens,
                        )
                    )
            except TraceFormatError as exc:
                raise TraceError(str(exc)) from None
    if not rows:
        raise TraceError("no served requests to replay in " + ", ".join(map(str, paths)))
    rows.sort(key=lambda row: (row[0], row[1], row[2]))
    cols = list(zip(*rows, strict=True))
    return SessionTrace(
        ids=list(cols[3]),
        sessions=np.asarray(cols[0], dtype=object),
        times=np.asarray(cols[2], dtype=np.float64),
        tiers=np.asarray(cols[4], dtype=object),
        scores=np.asarray(cols[5], dtype=np.float64),
        prompt_tokens=np.asarray(cols[6], dtype=np.int64),
        completion_tokens=np.asarray(cols[7], dtype=np.int64),
        cached_tokens=np.asarray(cols[8], dtype=np.int64),
        cost_usd=np.asarray(cols[9], dtype=np.float64),
        tool_loop=np.asarray(cols[10], dtype=bool),
        quote_prompt=np.asarray(cols[11], dtype=np.int64),
        quote_prefix=np.asarray(cols[12], dtype=np.int64),
    )


@dataclass(frozen=True)
class CacheModel:
    """Per tier: how long a served prompt stays cached, and the share of a cacheable prefix
    that hits (tiers not named: the defaults)."""

    ttl_s: Mapping[str, float] = field(default_factory=dict)
    hit_rate: Mapping[str, float] = field(default_factory=dict)
    shared_tokens: Mapping[str, int] = field(default_factory=dict)
    default_ttl_s: float = DEFAULT_CACHE_TTL_S
    default_hit_rate: float = DEFAULT_HIT_RATE
    block: Mapping[str, int] = field(default_factory=dict)
    default_block: int = 1

    def ttl(self, tier: str) -> float:
        return self.ttl_s.get(tier, self.default_ttl_s)

    def whole_blocks(self, tier: str, tokens: int) -> int:
        size = max(1, self.block.get(tier, self.default_block))
        return tokens // size * size

    def hits(self, tier: str) -> float:
        return self.hit_rate.get(tier, self.default_hit_rate)

    def cached(self, tier: str, prefix: int, prompt_tokens: int) -> int:
        """The tokens of a prompt read from the cache, given its cacheable prefix on `tier`."""
        own = round(self.hits(tier) * prefix)
        return max(own, min(self.shared_tokens.get(tier, 0), prompt_tokens))


class _TierCache:
    """One session's prompt caches: per tier, the latest prompt it served and when."""

    __slots__ = ("model", "held")

    def __init__(self, model: CacheModel) -> None:
        self.model = model
        self.held: dict[str, tuple[int, float]] = {}

    def prefix(self, tier: str, prompt_tokens: int, now: float) -> int:
        """The cacheable prefix of this prompt on `tier` (before the hit rate)."""
        held = self.held.get(tier)
        if held is None or now - held[1] > self.model.ttl(tier):
            return 0
        return self.model.whole_blocks(tier, min(held[0], prompt_tokens))

    def served(self, tier: str, prompt_tokens: int, now: float) -> None:
        self.held[tier] = (prompt_tokens, now)


def measure_cache(
    trace: SessionTrace,
    ttl_s: Mapping[str, float] | None = None,
    default_ttl_s: float = DEFAULT_CACHE_TTL_S,
    default_hit_rate: float = DEFAULT_HIT_RATE,
    default_block: int = 1,
) -> CacheModel:
    """The cache model the trace shows, from its `cached_tokens` as it was served: per tier,
    the hit rate of a cacheable prefix (cached over prefix on the requests that have one,
    clipped to [0, 1]) and the shared tokens (mean cached of those that have none). Tiers
    without such requests get the defaults."""
    shape = CacheModel(ttl_s or {}, default_ttl_s=default_ttl_s, default_block=default_block)
    cached: dict[str, int] = {}
    eligible: dict[str, int] = {}
    shared: dict[str, list[int]] = {}
    for rows in trace.session_rows():
        cache = _TierCache(shape)
        for i in rows.tolist():
            tier, prompt, now = str(trace.tiers[i]), int(trace.prompt_tokens[i]), trace.times[i]
            hit = int(trace.cached_tokens[i])
            prefix = cache.prefix(tier, prompt, now)
            if hit >= 0 and prefix > 0:
                eligible[tier] = eligible.get(tier, 0) + prefix
                cached[tier] = cached.get(tier, 0) + hit
            elif hit >= 0:
                shared.setdefault(tier, []).append(hit)
            cache.served(tier, prompt, now)
    return CacheModel(
        ttl_s or {},
        {t: min(1.0, cached[t] / eligible[t]) for t in eligible},
        {t: round(sum(v) / len(v)) for t, v in shared.items() if v},
        default_ttl_s,
        default_hit_rate,
        default_block=default_block,
    )


@dataclass(frozen=True)
class SessionReplay:
    """One mode replayed: each request's tier (None: refused, no tier holds it) and charge."""

    mode: str
    tiers: list[str | None]
    cached_tokens: np.ndarray  # (n,) int64
    cost_nanos: np.ndarray  # (n,) int64, with caching
    fresh_nanos: np.ndarray  # (n,) int64, every prompt token at the input price
    sessions: int
    switches: np.ndarray  # (sessions,) tier changes inside each session

    def summary(self, prompt_tokens: np.ndarray, large: str) -> dict[str, object]:
        n = len(self.tiers)
        served = [t for t in self.tiers if t is not None]
        return {
            "mode": self.mode,
            "requests": n,
            "sessions": self.sessions,
            "switches_per_session": float(self.switches.mean()) if self.sessions else 0.0,
            "sessions_switched": float((self.switches > 0).mean()) if self.sessions else 0.0,
            "large_share": served.count(large) / n if n else 0.0,
            "refused": n - len(served),
            "cached_share": float(self.cached_tokens.sum() / max(1, int(prompt_tokens.sum()))),
            "cost_usd": int(self.cost_nanos.sum()) / NANOS_PER_USD,
            "cost_without_cache_usd": int(self.fresh_nanos.sum()) / NANOS_PER_USD,
        }


def _charge(price: Price, prompt: int, completion: int, cached: int) -> tuple[int, int]:
    """(with caching, without) in nano-USD: writes only where the tier prices them."""
    written = prompt - cached if price.cache_write_per_mtok is not None else 0
    return (
        price.cost_nanos(prompt, completion, cached, written),
        price.cost_nanos(prompt, completion),
    )


def proposals_of(policy: Policy, sim: SimConfig, trace: SessionTrace) -> list[str | None]:
    """The policy's tier per request (None: no score, the client named its tier)."""
    prices = TierPrices.from_prices(sim.prices)
    scored = np.flatnonzero(~np.isnan(trace.scores))
    out: list[str | None] = [None] * len(trace)
    if scored.size:
        units = [trace.ids[i] for i in scored.tolist()]
        tier_idx, _ = decide(
            policy, trace.scores[scored], prices, lambda k: trace.ids[int(scored[k])], units
        )
        for i, t in zip(scored.tolist(), tier_idx.tolist(), strict=True):
            out[i] = prices.names[t]
    return out


def replay_sessions(
    sim: SimConfig,
    trace: SessionTrace,
    mode: Mode,
    cache: CacheModel,
    policy_name: str | None = None,
    proposals: Sequence[str | None] | None = None,
    policy: Policy | None = None,
) -> SessionReplay:
    """Every session in order under `mode` (the named policy's `session:` gives its ttl_s and
    tool_loop); `proposals` overrides the policy's choices (e.g. every request large), `policy`
    the policy itself (the named one at another threshold)."""
    name = policy_name or sim.default_policy
    settings: SessionParams = session_settings(sim.policies).get(name, DEFAULT_SESSION)
    policy = policy or pick_policy(sim, policy_name)
    mine = policy.tiers()
    candidates = {t: sim.prices[t] for t in mine}
    order = tiers_by_price(sim.prices)
    chosen = list(proposals) if proposals is not None else proposals_of(policy, sim, trace)
    n = len(trace)
    tiers: list[str | None] = [None] * n
    cached = np.zeros(n, dtype=np.int64)
    cost = np.zeros(n, dtype=np.int64)
    fresh = np.zeros(n, dtype=np.int64)
    switches = []
    for rows in trace.session_rows():
        state: SessionState | None = None
        tier_cache = _TierCache(cache)
        previous: tuple[int, int] | None = None  # the last request's prompt and completion
        last_served: str | None = None
        changes = 0
        for i in rows.tolist():
            prompt, completion = int(trace.prompt_tokens[i]), int(trace.completion_tokens[i])
            now = float(trace.times[i])
            proposal = chosen[i]
            if proposal is None:  # the client named its tier: no session rule, no window move
                tier: str | None = str(trace.tiers[i])
            else:
                if state is not None and now - state.last_seen >= settings.ttl_s:
                    state = None  # the store forgot the session
                quote = None
                if mode == "cache_aware":
                    quote = _quote(trace, i, prompt, previous, sim.prices)
                tool = settings.tool_loop and bool(trace.tool_loop[i])
                the_plan = plan(
                    mode, proposal, order, tool_loop=tool, cache=quote, policy_tiers=mine
                )
                move = choose(the_plan, state.last_tier if state is not None else None)
                state = state or SessionState()
                apply(state, move, prompt, now)
                tier = fit_tier(move.tier, prompt + completion, sim.context_windows, candidates)
            previous = (prompt, completion)
            if tier is None:
                continue  # the proxy's 400: nothing served, nothing charged
            if tier not in sim.prices:
                raise ReplayError(f"{trace.ids[i]}: tier {tier!r} is not in the config's tiers")
            hit = cache.cached(tier, tier_cache.prefix(tier, prompt, now), prompt)
            tiers[i], cached[i] = tier, hit
            cost[i], fresh[i] = _charge(sim.prices[tier], prompt, completion, hit)
            tier_cache.served(tier, prompt, now)
            if last_served is not None and tier != last_served:
                changes += 1
            last_served = tier
        switches.append(changes)
    return SessionReplay(
        mode, tiers, cached, cost, fresh, len(switches), np.asarray(switches, dtype=np.int64)
    )


def _quote(
    trace: SessionTrace,
    i: int,
    prompt: int,
    previous: tuple[int, int] | None,
    prices: Mapping[str, Price],
) -> CacheQuote:
    """cache_aware's quote for request i: the proxy's own (recorded in the trace) where there is
    one, so the decision is the proxy's; else the previous request's prompt and answer as the
    prefix (a conversation re-sends them)."""
    if trace.quote_prompt is not None and trace.quote_prefix is not None:
        quoted, prefix = int(trace.quote_prompt[i]), int(trace.quote_prefix[i])
        if quoted >= 0 and prefix >= 0:
            return CacheQuote(quoted, prefix, prices)
    return CacheQuote(prompt, sum(previous) if previous is not None else 0, prices)


def as_served(trace: SessionTrace, sim: SimConfig, cache: CacheModel) -> SessionReplay:
    """The trace's own routing through the cache model (what the replicas did, re-priced)."""
    return replay_sessions(sim, trace, "per_request", cache, proposals=[None] * len(trace))


def compare_modes(
    sim: SimConfig,
    trace: SessionTrace,
    cache: CacheModel,
    policy_name: str | None = None,
    modes: Sequence[Mode] = MODES,
    target_share: float | None = None,
) -> list[dict[str, object]]:
    """Each mode's summary on the same trace, then every request on the priciest tier and the
    trace as it was served, each with `share_of_all_large` (cost with caching). With
    `target_share`, each mode at the threshold giving it that large share (`at_equal_share`;
    its row says which threshold)."""
    large = tiers_by_price(sim.prices)[-1]
    thresholds: dict[str, float] = {}
    if target_share is None:
        runs = [replay_sessions(sim, trace, m, cache, policy_name) for m in modes]
    else:
        tuned = at_equal_share(sim, trace, cache, target_share, policy_name, modes)
        runs = [t.run for t in tuned]
        thresholds = {t.mode: t.threshold for t in tuned}
    all_large = replay_sessions(
        sim, trace, "per_request", cache, policy_name, proposals=[large] * len(trace)
    )
    served = as_served(trace, sim, cache)
    rows = []
    for run, label in [*((r, r.mode) for r in runs), (all_large, "all-large"), (served, "trace")]:
        row = run.summary(trace.prompt_tokens, large)
        row["mode"] = label
        if label in thresholds:
            row["threshold"] = thresholds[label]
        rows.append(row)
    base = float(rows[-2]["cost_usd"])  # type: ignore[arg-type]
    for row in rows:
        cost = float(row["cost_usd"])  # type: ignore[arg-type]
        row["share_of_all_large"] = cost / base if base else None
    recorded = trace.cost_usd[~np.isnan(trace.cost_usd)]
    rows[-1]["recorded_cost_usd"] = float(recorded.sum()) if recorded.size else None
    return rows


@dataclass(frozen=True)
class EqualShare:
    """A mode at the threshold that gives it the target large share (as near as the trace's
    scores allow)."""

    mode: str
    threshold: float
    run: SessionReplay


def at_equal_share(
    sim: SimConfig,
    trace: SessionTrace,
    cache: CacheModel,
    target_share: float,
    policy_name: str | None = None,
    modes: Sequence[Mode] = MODES,
    steps: int = 20,
) -> list[EqualShare]:
    """Each mode with the named (two-tier) policy's threshold moved until its share of requests
    on the large tier is the target: modes compared at one share, not one threshold. The share
    falls as the threshold rises in every mode, so a bisection finds it; the nearest of the
    thresholds tried wins."""
    base = pick_policy(sim, policy_name)
    if not isinstance(base, Tunable):
        raise ReplayError(f"policy {base.name!r} has no threshold to move (use a threshold policy)")
    large = base.large
    out = []
    for mode in modes:
        lo, hi = 0.0, 1.0
        best: tuple[float, float, SessionReplay] | None = None
        for _ in range(steps):
            mid = (lo + hi) / 2
            run = replay_sessions(
                sim, trace, mode, cache, policy_name, policy=base.with_threshold(mid)
            )
            share = run.tiers.count(large) / max(1, len(run.tiers))
            if best is None or abs(share - target_share) < best[0]:
                best = (abs(share - target_share), mid, run)
            if share > target_share:
                lo = mid
            else:
                hi = mid
        assert best is not None
        out.append(EqualShare(mode, best[1], best[2]))
    return out
