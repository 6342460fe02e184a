"""A trial's folder, written as it goes so that nothing measured is lost, read back on a rerun so
that it resumes.

- `trial.json`: the settings every measurement depends on (max_tokens, temperature); a rerun
  with other settings is refused rather than mixing two kinds of measurement.
- `requests.jsonl`: one `Measurement` per line, keyed by (prompt id, tier); appended and flushed
  as each request ends. Failed requests are kept (they are findings) and retried by a rerun.
- `judgements.jsonl`: one `JudgeRow` per (prompt id, candidate); pairs the judge could not be
  asked (its server failed) are retried by a rerun, everything else is final.
- `servers.jsonl`: per run of a tier, the growth of its speculative-decoding counters (vLLM's
  /metrics), summed over reruns.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import orjson

from simulations.levers.records import Measurement

JudgeStatus = Literal["label", "unparsed", "failed", "no-label"]


class TrialStoreError(ValueError):
    """A trial folder that cannot be resumed; the message names the file (and line)."""


@dataclass(frozen=True, slots=True)
class JudgeRow:
    prompt_id: str
    candidate: str
    reference: str
    judge: str | None  # the judge kind that answered (reference, llm); None: no judge fits
    version: str | None
    status: JudgeStatus
    reference_outcome: float | None
    candidate_outcome: float | None
    verdict: str | None = None
    cost_usd: float = 0.0

    def line(self) -> bytes:
        return orjson.dumps(asdict(self)) + b"\n"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JudgeRow:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True, slots=True)
class SpecCounts:
    tier: str
    draft_tokens: float
    accepted_tokens: float


def _lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    if not path.exists():
        return
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                # A run killed mid-write leaves a cut last line: that request is simply redone.
                continue
            if not isinstance(data, dict):
                raise TrialStoreError(f"{path}: line {n}: expected a JSON object")
            yield f"{path}: line {n}", data


class TrialStore:
    def __init__(self, folder: Path, settings: dict[str, Any]) -> None:
        self.folder = folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrialStoreError(
                f"{folder}: cannot make the results folder ({exc.strerror})"
            ) from None
        self._check_settings(folder / "trial.json", settings)
        self.measurements: dict[tuple[str, str], Measurement] = {}
        self.judgements: dict[tuple[str, str], JudgeRow] = {}
        self.spec: dict[str, SpecCounts] = {}
        for where, data in _lines(self.requests_path):
            m = _parse(Measurement.from_json, data, where)
            self.measurements[(m.prompt_id, m.tier)] = m  # a later line (a retry) wins
        for where, data in _lines(self.judgements_path):
            row = _parse(JudgeRow.from_json, data, where)
            self.judgements[(row.prompt_id, row.candidate)] = row
        for where, data in _lines(self.servers_path):
            counts = _parse(lambda d: SpecCounts(**d), data, where)
            self._add_spec(counts)
        self._files: dict[Path, BinaryIO] = {}

    @property
    def requests_path(self) -> Path:
        return self.folder / "requests.jsonl"

    @property
    def judgements_path(self) -> Path:
        return self.folder / "judgements.jsonl"

    @property
    def servers_path(self) -> Path:
        return self.folder / "servers.jsonl"

    def _check_settings(self, path: Path, settings: dict[str, Any]) -> None:
        if path.exists():
            try:
                before = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise TrialStoreError(f"{path}: unreadable ({exc})") from None
            changed = {k: (before.get(k), v) for k, v in settings.items() if before.get(k) != v}
            if changed:
                detail = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
                raise TrialStoreError(
                    f"{path}: this folder was measured with other settings "
                    f"({detail}); rerun with the same ones or a new --out"
                )
            return
        path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")

    def _append(self, path: Path, line: bytes) -> None:
        fh = self._files.get(path)
        if fh is None:
            fh = self._files[path] = path.open("ab")
        fh.write(line)
        fh.flush()  # each result on disk as it arrives: a crash loses at most the one in flight

    def _add_spec(self, counts: SpecCounts) -> None:
        old = self.spec.get(counts.tier)
        if old is not None:
            counts = SpecCounts(
                counts.tier,
                old.draft_tokens + counts.draft_tokens,
                old.accepted_tokens + counts.accepted_tokens,
            )
        self.spec[counts.tier] = counts

    def measured(self, prompt_id: str, tier: str) -> Measurement | None:
        m = self.measurements.get((prompt_id, tier))
        return m if m is not None and m.ok else None

    def add_measurement(self, m: Measurement) -> None:
        self.measurements[(m.prompt_id, m.tier)] = m
        self._append(self.requests_path, m.line())

    def judged(self, prompt_id: str, candidate: str) -> bool:
        row = self.judgements.get((prompt_id, candidate))
        return row is not None and row.status != "failed"

    def add_judgement(self, row: JudgeRow) -> None:
        self.judgements[(row.prompt_id, row.candidate)] = row
        self._append(self.judgements_path, row.line())

    def add_spec(self, counts: SpecCounts) -> None:
        self._add_spec(counts)
        self._append(self.servers_path, orjson.dumps(asdict(counts)) + b"\n")

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()


def _parse(build: Any, data: dict[str, Any], where: str) -> Any:
    try:
        return build(data)
    except (TypeError, KeyError) as exc:
        raise TrialStoreError(f"{where}: not a lever-trial record ({exc})") from None
