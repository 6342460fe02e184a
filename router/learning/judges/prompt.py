"""Judge prompts: a text file with {placeholders}; its version is its name and content hash, so
a label says exactly which prompt produced it and a replaced prompt starts a new version."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from trace_format.config_base import ConfigError

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
SHIPPED = {"pairwise": PROMPTS_DIR / "pairwise_v1.txt", "single": PROMPTS_DIR / "single_v1.txt"}
PLACEHOLDERS = {"pairwise": ("question", "answer_a", "answer_b"), "single": ("question", "answer")}
_FIELD = re.compile(r"\{(question|answer_a|answer_b|answer)\}")


@dataclass(frozen=True, slots=True)
class JudgePrompt:
    name: str
    template: str

    @property
    def version(self) -> str:
        digest = hashlib.sha256(self.template.encode("utf-8")).hexdigest()[:12]
        return f"{self.name}:{digest}"

    def render(self, **values: str) -> str:
        # One pass: an answer that happens to contain "{answer_b}" stays as written.
        return _FIELD.sub(lambda m: values.get(m.group(1), m.group(0)), self.template)


def load_prompt(mode: str, path: str | None) -> JudgePrompt:
    """The prompt file for `mode` (the shipped one when `path` is None); ConfigError names the
    key when the file cannot be read or lacks a placeholder."""
    file = Path(path) if path else SHIPPED[mode]
    try:
        template = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"evaluation.judges.llm.prompt: cannot read {file}: {exc.strerror}"
        ) from None
    missing = [p for p in PLACEHOLDERS[mode] if "{" + p + "}" not in template]
    if missing:
        raise ConfigError(
            f"evaluation.judges.llm.prompt: {file} lacks "
            + ", ".join("{" + p + "}" for p in missing)
        )
    return JudgePrompt(file.stem, template)
