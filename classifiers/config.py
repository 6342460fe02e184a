"""Configuration of the difficulty classifier."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# The shipped model (classifiers/default, with MODEL_CARD.md): used when no model_path is set.
DEFAULT_MODEL = Path(__file__).resolve().parent / "default" / "model.onnx"


class ClassifierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_path: str | None = Field(default=None, description=".onnx file; None = shipped default")
    context_turns: int = Field(default=2, ge=0, le=20)
