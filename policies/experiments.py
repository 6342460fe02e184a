"""Sticky, deterministic assignment of experiment units to arms.

arm = the arm whose cumulative-weight interval holds sha256(salt, unit) mapped to [0, 1). The
same unit gets the same arm in every process, replica and restart, and the arms' shares follow
their weights. Arms are ordered by name so reformatting the YAML does not reshuffle units;
adding, removing or reweighting arms (or changing the salt) does.
"""

from __future__ import annotations

import bisect
import hashlib
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
    session: str | None = None  # the conversation's id (policies/sessions/identity.py)

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
    unit: str = ""  # the unit kind the arm was assigned by (ExperimentConfig.unit)
    unit_id: str = ""  # its value as traces record it (unit_id): the A/B report's cluster


# Units whose value may be personal or secret (a body's `user` is often an email; a header can
# carry anything): traces record a hash. Teams, key ids and session ids are in the trace already.
HASHED_UNITS = frozenset({"user", "header"})


def unit_id(kind: str, value: str, salt: str) -> str:
    """What the trace records of a unit's value: the value, or for HASHED_UNITS 16 hex digits of
    sha256(salt, value): the same unit always gives the same id (the report groups by it),
    and the raw value is not written."""
    if kind not in HASHED_UNITS:
        return value
    return "h:" + hashlib.sha256(f"{salt}\x00{value}".encode()).hexdigest()[:16]


class ExperimentSet:
    """All configured experiments; the first active one that covers the request wins."""

    def __init__(self, configs: Sequence[ExperimentConfig]) -> None:
        self.experiments = [Experiment(c) for c in configs]
        # Whether a request's session id must be known before an arm is assigned.
        self.by_session = any(c.unit == "session" for c in configs)

    def assign(self, units: UnitContext, now: float) -> Assignment | None:
        for exp in self.experiments:
            if not exp.active(now) or not exp.covers(units.team):
                continue
            unit = units.unit(exp.config)
            if unit is None:
                continue
            arm = exp.arm_for(unit)
            kind = exp.config.unit
            return Assignment(
                exp.name, arm, exp.policy_of(arm), kind, unit_id(kind, unit, exp.salt)
            )
        return None
