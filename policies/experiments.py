"""Sticky, deterministic assignment of experiment units to arms.

arm = the arm whose cumulative-weight interval holds sha256(salt, unit) mapped to [0, 1). The
same unit gets the same arm in every process, replica and restart, and the arms' shares follow
their weights. Arms are ordered by name so reformatting the YAML does not reshuffle units;
adding, removing or reweighting arms (or changing the salt) does.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from policies.config import ExperimentConfig
from policies.hashing import unit_uniform


@dataclass(frozen=True, slots=True)
class UnitContext:
    """The request's candidate experiment units."""

    team: str | None = None
    key: str | None = None  # the key's public id (Identity.key_id), never the key itself
    user: str | None = None  # the request body's `user` field
    headers: Mapping[str, str] | None = None  # lower-case names

    def unit(self, exp: ExperimentConfig) -> str | None:
        if exp.unit == "header":
            assert exp.header is not None
            return (self.headers or {}).get(exp.header.lower()) or None
        return getattr(self, exp.unit) or None


class Experiment:
    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        self.name = config.name
        self.salt = config.salt or config.name
        self.arms = sorted(config.arms)
        weights = [config.arms[a].weight for a in self.arms]
        total = sum(weights)
        self._edges = [c / total for c in itertools.accumulate(weights)][:-1]
        self._start = _timestamp(config.start)
        self._stop = _timestamp(config.stop)

    def active(self, now: float) -> bool:
        if self._start is not None and now < self._start:
            return False
        return self._stop is None or now < self._stop

    def covers(self, team: str | None) -> bool:
        return self.config.teams is None or team in self.config.teams

    def arm_for(self, unit: str) -> str:
        return self.arms[bisect.bisect_right(self._edges, unit_uniform(self.salt, unit))]

    def policy_of(self, arm: str) -> str:
        return self.config.arms[arm].policy


def _timestamp(value: datetime | None) -> float | None:
    # ExperimentConfig has parsed the ISO text and made naive times UTC already.
    return None if value is None else value.timestamp()


@dataclass(frozen=True, slots=True)
class Assignment:
    experiment: str
    arm: str
    policy: str


class ExperimentSet:
    """All configured experiments; the first active one that covers the request wins."""

    def __init__(self, configs: Sequence[ExperimentConfig]) -> None:
        self.experiments = [Experiment(c) for c in configs]

    def assign(self, units: UnitContext, now: float) -> Assignment | None:
        for exp in self.experiments:
            if not exp.active(now) or not exp.covers(units.team):
                continue
            unit = units.unit(exp.config)
            if unit is None:
                continue
            arm = exp.arm_for(unit)
            return Assignment(exp.name, arm, exp.policy_of(arm))
        return None
