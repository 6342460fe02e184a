"""`levers.json`: what a trial measured, in the terms of the what-if simulator's levers, and
`apply_levers`: what `cost-router what-if --levers levers.json` does with it.

Written from the first candidate of each lever measured alone:
- quantization (or distillation, the same lever in what-if: a faster, maybe worse small tier):
  `speed` = the decode speed ratio (reference's median ITL / the candidate's), `quality_delta` =
  the candidate's mean judged outcome minus the reference's (what what-if applies, in points),
  `quality` = their ratio (kept for reading; undefined when the reference scored 0),
  `cost` = the candidate's price on its own tokens / the reference's price on them;
- speculative: `acceptance` from the server's counters (None when it exposes none: llama.cpp),
  `speedup` = the decode speed ratio, `identical_share` at temperature 0.

A number that is missing (not measured, or undefined) keeps the typed-in or default value, and
every lever value gets a note saying "measured" (from which trial) or "assumed".
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from simulations.levers.summary import Row
from simulations.whatif import Levers

SCHEMA = 1


class LeversFileError(ValueError):
    """An unreadable levers.json; the message names the file and the key."""


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def levers_document(rows: Sequence[Row], prompts: int) -> dict[str, Any]:
    ref = next(r for r in rows if r.kind == "reference")
    doc: dict[str, Any] = {"schema": SCHEMA, "reference": ref.name, "prompts": prompts, "tiers": {}}
    for r in rows:
        if r.kind == "combined":
            continue
        doc["tiers"][r.name] = {
            "ttft_p50_s": _num(r.ttft_p50_s),
            "itl_p50_s": _num(r.itl_p50_s),
            "e2e_p50_s": _num(r.e2e_p50_s),
            "e2e_p95_s": _num(r.e2e_p95_s),
            "prompts": r.prompts,
        }
    quant = next(
        (r for r in rows if r.kind == "alone" and r.lever in ("quantization", "distillation")), None
    )
    if quant is not None:
        q = quant.quality
        ratio = None
        if q is not None and q.labelled and _num(q.reference.value):
            ratio = _num(q.candidate.value / q.reference.value)
        doc["quantization"] = {
            "tier": quant.name,
            "lever": quant.lever,
            "speed": _num(quant.decode_speed),
            "quality": ratio,
            "cost": _num(quant.price_ratio),
            "quality_delta": None if q is None else _num(q.delta.value),
            "quality_delta_interval": None
            if q is None
            else [_num(q.delta.low), _num(q.delta.high)],
            "judged_pairs": 0 if q is None else q.labelled,
        }
    spec = next((r for r in rows if r.kind == "alone" and r.lever == "speculative"), None)
    if spec is not None:
        doc["speculative"] = {
            "tier": spec.name,
            "acceptance": None if spec.acceptance is None else _num(spec.acceptance),
            "speedup": _num(spec.decode_speed),
            "identical_share": None if spec.identical is None else _num(spec.identical.value),
        }
    return doc


def write_levers(path: Path, rows: Sequence[Row], prompts: int) -> None:
    path.write_text(json.dumps(levers_document(rows, prompts), indent=2) + "\n", encoding="utf-8")


def _get(doc: dict[str, Any], path: Path, section: str, key: str, low: float = 0.0) -> float | None:
    part = doc.get(section)
    if part is None:
        return None
    if not isinstance(part, dict):
        raise LeversFileError(f"{path}: {section}: expected an object")
    value = part.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
        raise LeversFileError(
            f"{path}: {section}.{key}: expected a number >= {low:g}, got {value!r}"
        )
    return float(value)


def read_levers(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LeversFileError(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise LeversFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise LeversFileError(
            f"{path}: not a levers.json of schema {SCHEMA} (written by `cost-router levers trial`)"
        )
    return doc


def apply_levers(levers: Levers, path: Path) -> tuple[Levers, list[str]]:
    """`levers` with the measured values of `path`, and one note per lever value saying whether
    it is measured or assumed."""
    doc = read_levers(path)
    ref = doc.get("reference", "?")
    notes: list[str] = []
    out = levers

    def take(section: str, key: str, field: str, label: str) -> None:
        nonlocal out
        value = _get(doc, path, section, key)
        tier = (doc.get(section) or {}).get("tier")
        if value is None or (field == "quant_speed" and value <= 0):
            why = "not in the trial" if section not in doc else "not measured or undefined"
            notes.append(f"{label} {getattr(out, field):g} [assumed: {why}]")
            return
        out = replace(out, **{field: value})
        notes.append(f"{label} {value:.3g} [measured: {tier} vs {ref}, {path.name}]")

    # One what-if lever for both: a distilled student is named as such in the notes.
    section = doc.get("quantization")
    kind = (
        "distilled"
        if isinstance(section, dict) and section.get("lever") == "distillation"
        else "quantized"
    )
    take("quantization", "speed", "quant_speed", f"{kind} small speed x")
    delta = _get(doc, path, "quantization", "quality_delta", low=-1.0)
    if delta is not None:
        # Points, not the ratio: the trial's reference is usually another model than the
        # simulated small tier, and a ratio of two small accuracies does not carry over.
        out = replace(out, quant_quality_delta=delta)
        tier = doc["quantization"].get("tier")
        notes.append(
            f"{kind} small quality {delta * 100:+.1f} points [measured: {tier} vs "
            f"{ref}, {path.name}; added to each small-tier outcome]"
        )
    else:
        take("quantization", "quality", "quant_quality", f"{kind} small quality x")
    take("quantization", "cost", "quant_cost", f"{kind} small price x")
    take("speculative", "acceptance", "spec_acceptance", "spec acceptance")
    speedup = _get(doc, path, "speculative", "speedup")
    if speedup is not None and speedup > 0:
        out = replace(out, spec_speedup=speedup)
        tier = doc["speculative"].get("tier")
        notes.append(
            f"spec decode speed-up {speedup:.3g}x [measured: {tier} vs {ref}, "
            f"{path.name}; used instead of the one acceptance and k imply]"
        )
    else:
        notes.append("spec decode speed-up from acceptance and k [assumed: not measured]")
    notes.append(
        "tier TTFT and per-token times: not from levers.json [assumed: the "
        "--small-*/--large-* options, or measured with --signals]"
    )
    share = _get(doc, path, "speculative", "identical_share")
    if share is not None:
        notes.append(
            f"spec identical outputs {share:.1%} [measured]; what-if keeps the large "
            "tier's quality unchanged under speculative decoding"
        )
    return out, notes
