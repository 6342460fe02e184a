"""`cost-router distill export`: a distillation set from what the proxy stored.

The teacher's answers come from the shadow file (`shadow.jsonl`, trace_format/shadow.py): it is
the only place the proxy keeps answer text, and only for the teams of
`evaluation.store_content_teams`. A shadow record whose primary or shadow tier is the teacher
gives one row: the request's messages (from its trace record, else the stored prompt as one
user message) and the teacher's answer. The trace record, joined by request id, says who sent
it (team, policy, `metadata`), its conversation (`session`) and how it ended; the label file
(the judges) and the feedback file say how good the answer was.

Dropped, each counted under its reason in the card:
- `no stored content`: no prompt or teacher answer text (content storage off for the team), or
  a team the config does not store content for (`--config`: fail closed even if text is there);
- `error`: the request failed (status >= 400 or an error code);
- `truncated`: a stream that broke off (`upstream_truncated`, `upstream_error`);
- `empty`, `refusal`: no answer, or one that opens as a refusal;
- `judged worse`: a judge scored the teacher below the other tier of the pair, or below
  `min_teacher_score` (a reference judge's wrong answer: 0);
- `negative feedback`: the mean user feedback below `min_feedback`;
- `duplicate`: the same messages seen before (the first kept);
- `not selected`: outside the workflow (`team`, `policy`, `metadata` tags, prompt clusters).

Train and held-out parts are split by conversation (the trace's `session`, else the request
itself), never by row, so no turn of a held-out conversation is trained on. The held-out part is
also written as trace records (`heldout-traces/requests.jsonl`, with `metadata`) for
`cost-router levers trial --traces`.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from policies.workflow import Selector
from trace_format.feedback import FEEDBACK_FILE, load_feedback
from trace_format.jsonl import read_objects
from trace_format.labels import LABELS_FILE, merged_outcomes
from trace_format.reader import TraceFormatError, is_trace_file
from trace_format.request_text import text_of_content
from trace_format.shadow import SHADOW_FILE

CARD_FILE, TRAIN_FILE, HELDOUT_FILE, PARQUET_FILE = (
    "card.json",
    "train.jsonl",
    "heldout.jsonl",
    "distill.parquet",
)
HELDOUT_TRACES = "heldout-traces"
TRUNCATED_ERRORS = frozenset({"upstream_truncated", "upstream_error"})
# An answer that opens like this declines the task: a student must not learn to decline it.
REFUSAL = re.compile(
    r"^\W*(i'?m sorry|i am sorry|i apologi[sz]e|as an ai\b|i (?:can ?not|can't|won't|will not|"
    r"am unable to|am not able to) (?:help|assist|provide|comply|answer|do that|fulfil))",
    re.IGNORECASE,
)
REASONS = (
    "no stored content",
    "error",
    "truncated",
    "empty",
    "refusal",
    "judged worse",
    "negative feedback",
    "not selected",
    "duplicate",
)


class ExportError(ValueError):
    """An export that cannot be made as asked; the message says why and what to change."""


@dataclass(frozen=True)
class ExportOptions:
    teacher: str
    selector: Selector = field(default_factory=Selector)
    heldout_share: float = 0.2
    seed: int = 0
    min_teacher_score: float = 0.5
    min_feedback: float = 0.5
    # None: every team whose text is there; else only these (ALL_TEAMS "*" = all), from the
    # config's evaluation.store_content_teams.
    content_teams: Sequence[str] | None = None
    min_train_rows: int = 1


@dataclass
class Row:
    id: str
    time: float
    conversation: str
    team: str | None
    policy: str | None
    messages: list[dict[str, Any]]
    answer: str
    teacher_model: str | None
    teacher_score: float | None
    metadata: dict[str, Any]
    trace: dict[str, Any] | None
    split: str = ""


@dataclass(frozen=True)
class ExportResult:
    out: Path
    card: dict[str, Any]

    @property
    def train_rows(self) -> int:
        return int(self.card["counts"]["train_rows"])

    @property
    def heldout_rows(self) -> int:
        return int(self.card["counts"]["heldout_rows"])


class _Reader:
    """Every file read, with its digest: the card's hash of the traces read."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def note(self, path: Path) -> None:
        if path.is_file():
            with path.open("rb") as fh:
                self.files[str(path)] = hashlib.file_digest(fh, "sha256").hexdigest()

    def digest(self) -> str:
        h = hashlib.sha256()
        for path in sorted(self.files):
            h.update(f"{Path(path).name}\0{self.files[path]}\n".encode())
        return h.hexdigest()


def _folders(paths: Iterable[Path]) -> list[Path]:
    out = []
    for p in paths:
        if p.is_dir():
            out.append(p)
        elif p.is_file():
            out.append(p.parent)
        else:
            raise ExportError(f"--traces {p}: not found (no such file or folder)")
    return list(dict.fromkeys(out))


def _traces(folder: Path, reader: _Reader) -> dict[str, dict[str, Any]]:
    """Trace records by request id (raw: `metadata` and newer fields kept)."""
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(folder.iterdir()):
        if not (f.is_file() and is_trace_file(f)):
            continue
        reader.note(f)
        for rec in read_objects(f):
            rid = rec.get("id")
            if isinstance(rid, str):
                out[rid] = rec
    return out


def _messages(trace: Mapping[str, Any] | None, prompt: str | None) -> list[dict[str, Any]] | None:
    raw = trace.get("messages") if trace else None
    if isinstance(raw, list) and raw:
        msgs = []
        for m in raw:
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
                continue
            text = text_of_content(m.get("content"))
            if text:
                msgs.append({"role": m["role"], "content": text})
        if msgs and msgs[-1]["role"] == "user":
            return msgs
    prompt = prompt or (trace.get("prompt") if trace else None)
    if isinstance(prompt, str) and prompt.strip():
        return [{"role": "user", "content": prompt}]
    return None


def _teacher_side(shadow: Mapping[str, Any], teacher: str) -> tuple[dict[str, Any], str] | None:
    for side, other in (("primary", "shadow"), ("shadow", "primary")):
        part = shadow.get(side)
        if isinstance(part, dict) and part.get("tier") == teacher:
            peer = shadow.get(other)
            return part, (peer.get("tier") if isinstance(peer, dict) else "") or ""
    return None


def _judged_worse(
    outcomes: Mapping[str, float] | None, teacher: str, peer: str, floor: float
) -> tuple[bool, float | None]:
    if not outcomes or teacher not in outcomes:
        return False, None
    score = float(outcomes[teacher])
    worse = score < floor or (peer in outcomes and score < float(outcomes[peer]))
    return worse, score


def _dedupe_key(messages: Sequence[Mapping[str, Any]]) -> str:
    norm = [(m["role"], " ".join(str(m["content"]).split()).lower()) for m in messages]
    return hashlib.sha256(orjson.dumps(norm)).hexdigest()


def _bucket(seed: int, conversation: str) -> str:
    return hashlib.sha256(f"{seed}\0{conversation}".encode()).hexdigest()


def _stores(content_teams: Sequence[str] | None, team: str | None) -> bool:
    if content_teams is None:
        return True
    return "*" in content_teams or (team is not None and team in content_teams)


def collect(paths: Sequence[Path], options: ExportOptions) -> tuple[list[Row], Counter, _Reader]:
    """Rows that pass every filter (module docstring), in time order, and the drop counts."""
    reader = _Reader()
    dropped: Counter[str] = Counter()
    rows: list[Row] = []
    seen_shadow = 0
    for folder in _folders(paths):
        traces = _traces(folder, reader)
        shadow_file = folder / SHADOW_FILE
        for extra in (shadow_file, folder / LABELS_FILE, folder / FEEDBACK_FILE):
            reader.note(extra)
        outcomes = merged_outcomes(folder / LABELS_FILE)
        feedback = load_feedback(folder / FEEDBACK_FILE)
        for rec in read_objects(shadow_file):
            seen_shadow += 1
            found = _teacher_side(rec, options.teacher)
            if found is None:
                continue
            part, peer = found
            rid = str(rec.get("request_id") or "")
            trace = traces.get(rid)
            team = rec.get("team") if trace is None else trace.get("team")
            policy = rec.get("policy") if trace is None else trace.get("policy")
            metadata = trace.get("metadata") if trace else None
            metadata = metadata if isinstance(metadata, dict) else {}
            messages = _messages(trace, rec.get("prompt"))
            if not options.selector.matches(team, policy, metadata, {"messages": messages or []}):
                dropped["not selected"] += 1
                continue
            answer = part.get("text")
            if (
                not _stores(options.content_teams, team)
                or messages is None
                or not isinstance(answer, str)
            ):
                dropped["no stored content"] += 1
                continue
            error = trace.get("error") if trace else None
            status = trace.get("status") if trace else None
            if error in TRUNCATED_ERRORS:
                dropped["truncated"] += 1
                continue
            if error or (isinstance(status, int) and status >= 400):
                dropped["error"] += 1
                continue
            if not answer.strip():
                dropped["empty"] += 1
                continue
            if REFUSAL.match(answer):
                dropped["refusal"] += 1
                continue
            merged = dict(trace.get("outcomes") or {}) if trace else {}
            merged.update(outcomes.get(rid, {}))
            worse, score = _judged_worse(merged, options.teacher, peer, options.min_teacher_score)
            if worse:
                dropped["judged worse"] += 1
                continue
            fb = feedback.get(rid, trace.get("feedback") if trace else None)
            if fb is not None and float(fb) < options.min_feedback:
                dropped["negative feedback"] += 1
                continue
            session = trace.get("session") if trace else None
            rows.append(
                Row(
                    id=rid,
                    time=float(rec.get("time") or 0.0),
                    conversation=str(session or rid),
                    team=team,
                    policy=policy,
                    messages=messages,
                    answer=answer,
                    teacher_model=part.get("model"),
                    teacher_score=score,
                    metadata=metadata,
                    trace=trace,
                )
            )
    if not seen_shadow:
        names = ", ".join(str(p) for p in paths)
        raise ExportError(
            f"--traces {names}: no shadow records ({SHADOW_FILE}): the teacher's answers are "
            "kept only there (evaluation.enabled with a shadow tier, and "
            "evaluation.store_content_teams for the team)"
        )
    rows.sort(key=lambda r: r.time)
    unique: list[Row] = []
    keys: set[str] = set()
    for row in rows:
        key = _dedupe_key(row.messages)
        if key in keys:
            dropped["duplicate"] += 1
            continue
        keys.add(key)
        unique.append(row)
    return unique, dropped, reader


def split(rows: Sequence[Row], share: float, seed: int) -> None:
    """Mark each row train or held-out, whole conversations at a time: the seeded order of the
    conversations' hashes, the first ceil(share * conversations) held out."""
    conversations = sorted({r.conversation for r in rows}, key=lambda c: _bucket(seed, c))
    held = set(conversations[: math.ceil(share * len(conversations))])
    for r in rows:
        r.split = "heldout" if r.conversation in held else "train"


def _chat_line(row: Row) -> bytes:
    msgs = [*row.messages, {"role": "assistant", "content": row.answer}]
    return orjson.dumps({"messages": msgs}) + b"\n"


def _trace_line(row: Row) -> bytes:
    # The trial reads prompt text and `metadata.reference_answer` (the reference judge's gold).
    rec = dict(row.trace) if row.trace else {"schema_version": 1, "id": row.id, "time": row.time}
    rec.setdefault("prompt", row.messages[-1]["content"])
    rec.setdefault("messages", row.messages)
    return orjson.dumps(rec) + b"\n"


def _write(path: Path, lines: Iterable[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        for line in lines:
            fh.write(line)
    tmp.replace(path)


def _parquet(path: Path, rows: Sequence[Row], teacher: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": [r.id for r in rows],
            "split": [r.split for r in rows],
            "conversation": [r.conversation for r in rows],
            "time": [r.time for r in rows],
            "team": [r.team for r in rows],
            "policy": [r.policy for r in rows],
            "messages": [orjson.dumps(r.messages).decode() for r in rows],
            "prompt": [r.messages[-1]["content"] for r in rows],
            "answer": [r.answer for r in rows],
            "teacher_tier": [teacher] * len(rows),
            "teacher_model": [r.teacher_model for r in rows],
            "teacher_score": pa.array([r.teacher_score for r in rows], type=pa.float64()),
            "metadata": [orjson.dumps(r.metadata).decode() for r in rows],
        }
    )
    pq.write_table(table, path)


def card_digest(card_path: Path) -> str:
    """The data card's SHA-256: what a student's model card names as its data."""
    with card_path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def export(paths: Sequence[Path], out: Path, options: ExportOptions) -> ExportResult:
    """Collect, filter, de-duplicate and split; write the train and held-out JSONL (OpenAI chat
    fine-tuning format), the Parquet of both, the held-out trace records and the card."""
    if not 0 < options.heldout_share < 1:
        raise ExportError(f"--heldout {options.heldout_share}: expected a share in (0, 1)")
    try:
        rows, dropped, reader = collect(paths, options)
    except TraceFormatError as exc:
        raise ExportError(str(exc)) from None
    considered = len(rows) + sum(dropped.values())
    if considered == 0:
        raise ExportError(
            f"no shadow record has the teacher tier {options.teacher!r} on either side "
            "(check --teacher against the shadow records' primary and shadow tiers)"
        )
    if not rows and dropped["no stored content"] == considered:
        raise ExportError(
            f"no stored content: none of the {considered} teacher answers has its prompt and "
            "answer text (content is stored only for evaluation.store_content_teams; with "
            "--config, only those teams are read)"
        )
    conversations = len({r.conversation for r in rows})
    if conversations < 2:
        why = ", ".join(f"{k} {v}" for k, v in dropped.items() if v) or "none dropped"
        raise ExportError(
            f"too little data: {len(rows)} rows in {conversations} conversation(s) after the "
            f"filters ({why}); at least 2 conversations are needed to hold one out"
        )
    split(rows, options.heldout_share, options.seed)
    train = [r for r in rows if r.split == "train"]
    held = [r for r in rows if r.split == "heldout"]
    if len(train) < options.min_train_rows:
        raise ExportError(
            f"too little data: {len(train)} training rows after holding out "
            f"{len(held)} (at least {options.min_train_rows} needed; lower --heldout or "
            "export more traffic)"
        )
    out.mkdir(parents=True, exist_ok=True)
    _write(out / TRAIN_FILE, map(_chat_line, train))
    _write(out / HELDOUT_FILE, map(_chat_line, held))
    _write(out / HELDOUT_TRACES / "requests.jsonl", map(_trace_line, held))
    _parquet(out / PARQUET_FILE, rows, options.teacher)
    card = {
        "kind": "cost-router distillation set",
        "created": time.time(),
        "teacher": options.teacher,
        "teacher_models": sorted({r.teacher_model for r in rows if r.teacher_model}),
        "counts": {
            "teacher_answers_read": considered,
            "kept": len(rows),
            "dropped": {k: dropped.get(k, 0) for k in REASONS},
            "train_rows": len(train),
            "train_conversations": len({r.conversation for r in train}),
            "heldout_rows": len(held),
            "heldout_conversations": len({r.conversation for r in held}),
            "teams": dict(Counter(str(r.team) for r in rows)),
        },
        "filters": {
            "min_teacher_score": options.min_teacher_score,
            "min_feedback": options.min_feedback,
            "refusal_pattern": REFUSAL.pattern,
            "truncated_errors": sorted(TRUNCATED_ERRORS),
            "content_teams": None if options.content_teams is None else list(options.content_teams),
            "dedupe": "same messages (whitespace and case folded); the first kept",
        },
        "selector": options.selector.describe(),
        "split": {
            "by": "conversation",
            "heldout_share": options.heldout_share,
            "seed": options.seed,
        },
        "sources": reader.files,
        "traces_sha256": reader.digest(),
        "files": {
            "train": TRAIN_FILE,
            "heldout": HELDOUT_FILE,
            "parquet": PARQUET_FILE,
            "heldout_traces": f"{HELDOUT_TRACES}/requests.jsonl",
        },
    }
    _write(out / CARD_FILE, [orjson.dumps(card, option=orjson.OPT_INDENT_2) + b"\n"])
    return ExportResult(out, card)
