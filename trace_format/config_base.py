"""The base of every configuration section, at the bottom so every package can share it: a
pydantic model that rejects unknown keys, and the one error a configuration problem raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # Unknown keys are almost always typos; reject them so the error names the key.
    model_config = ConfigDict(extra="forbid")


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""
