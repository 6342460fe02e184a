"""The student's model card (`OUT/model-card.json`): what it was distilled from and how, and,
once a lever trial has measured it, its held-out figures.

A student is a model product (docs/levers.md, "Distillation"): the card names the teacher tier
and models, the data card's SHA-256 (which names the traces read by their own hash), the base
model and its SHA-256, every training setting, the loss curve's ends and the wall time.
`add_heldout` copies a trial's rows for the student (and its reference) from `summary.json`:
accuracy (mean judged outcome) with its interval, the paired difference, latency and tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

MODEL_CARD = "model-card.json"


class CardError(ValueError):
    """A card or trial folder that cannot be read; the message names the file."""


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CardError(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise CardError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CardError(f"{path}: expected a JSON object")
    return doc


def write_model_card(
    out: Path,
    result: Any,  # train.TrainResult (train imports this module, not the other way round)
    options: Any,  # train.TrainOptions
    base_path: Path,
    base_hash: str,
    data_card: Path,
    data_hash: str,
    losses: Sequence[float],
) -> Path:
    data = _read(data_card)
    card = {
        "kind": "cost-router distilled student",
        "created": time.time(),
        "model": str(result.model),
        "format": options.out_format,
        "teacher": {"tier": data.get("teacher"), "models": data.get("teacher_models", [])},
        "data": {
            "card": str(data_card),
            "card_sha256": data_hash,
            "traces_sha256": data.get("traces_sha256"),
            "train_rows": data.get("counts", {}).get("train_rows"),
            "heldout_rows": data.get("counts", {}).get("heldout_rows"),
            "selector": data.get("selector"),
        },
        "base": {"model": options.base, "path": str(base_path), "sha256": base_hash},
        "training": {
            **asdict(options),
            "learning_rate": options.learning_rate(),
            "steps": result.steps,
            "examples_seen": result.examples_seen,
            "resumed_from_step": result.resumed_from,
            "first_loss": result.first_loss,
            "last_loss": result.last_loss,
            "mean_loss_last_10": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
            "wall_s": round(result.wall_s, 1),
        },
        "heldout": None,  # filled by `cost-router distill card --trial`
    }
    path = out / MODEL_CARD
    path.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return path


def _estimate(e: dict[str, Any] | None) -> dict[str, Any] | None:
    if not e:
        return None
    return {"value": e.get("value"), "low": e.get("low"), "high": e.get("high")}


def _wilson(trial: Path, tier: str, confidence: float = 0.95) -> dict[str, Any]:
    """Accuracy as a share (Wilson intervals, never zero-width at 0 of n) where every verdict
    of the pairs is a whole point (the reference judge): right / judged, for both sides."""
    from scipy import stats

    path = trial / "judgements.jsonl"
    if not path.is_file():
        return {}
    ref = cand = n = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("candidate") != tier or j.get("status") != "label":
            continue
        r, c = j.get("reference_outcome"), j.get("candidate_outcome")
        if r not in (0, 1, 0.0, 1.0) or c not in (0, 1, 0.0, 1.0):
            return {}  # graded outcomes: the bootstrap estimates below are the figures
        n, ref, cand = n + 1, ref + int(r), cand + int(c)
    if not n:
        return {}

    def share(k: int) -> dict[str, Any]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
        return {"right": k, "of": n, "value": k / n, "low": ci.low, "high": ci.high}

    return {"accuracy_wilson": share(cand), "reference_accuracy_wilson": share(ref)}


def heldout_figures(trial: Path, tier: str) -> dict[str, Any]:
    """The trial's figures for `tier` (a candidate of the trial at `trial/`)."""
    summary = _read(trial / "summary.json")
    rows = {r.get("name"): r for r in summary.get("rows", []) if isinstance(r, dict)}
    if tier not in rows:
        raise CardError(
            f"{trial / 'summary.json'}: no row for tier {tier!r} "
            f"(rows: {', '.join(map(str, rows))})"
        )
    row = rows[tier]
    ref = next((r for r in rows.values() if r.get("kind") == "reference"), {})
    q = row.get("quality") or {}
    settings = _read(trial / "trial.json") if (trial / "trial.json").is_file() else {}

    def speed(r: dict[str, Any]) -> dict[str, Any]:
        return {
            k: r.get(k)
            for k in ("prompts", "errors", "ttft_p50_s", "itl_p50_s", "e2e_p50_s", "e2e_p95_s")
        } | {"completion_tokens_mean": r.get("completion_tokens")}

    return {
        **_wilson(trial, tier),
        "trial": str(trial),
        "reference": ref.get("name"),
        "judged_pairs": q.get("labelled"),
        "judges": q.get("judges"),
        "accuracy": _estimate(q.get("candidate")),
        "reference_accuracy": _estimate(q.get("reference")),
        "paired_difference": _estimate(q.get("delta")),
        "win_tie_loss": [(q.get(k) or {}).get("value") for k in ("win", "tie", "loss")],
        "student": speed(row),
        "reference_speed": speed(ref),
        "settings": settings,
        "gate": [g for g in summary.get("gate", []) if g.get("row") == tier],
    }


def add_heldout(student: Path, trial: Path, tier: str) -> dict[str, Any]:
    """Write the trial's held-out figures for `tier` into the student's card."""
    path = student / MODEL_CARD
    card = _read(path)
    card["heldout"] = heldout_figures(trial, tier)
    path.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return card["heldout"]
