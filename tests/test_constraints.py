"""constraints.txt: one resolved set of versions for every extra together (issue 25, item 10).

`make venv` and `make bench` install through it (`pip install -c constraints.txt`), so installing
one extra can never move a package another extra or the lint step needs (`make bench` used to
install rich 13.9.4 under import-linter, which needs rich >= 14.2). These checks run with the
tests: every requirement of the project and of each extra is pinned within its range, the
environment the tests run in holds exactly the pinned versions of what it has, pip finds no
broken requirement, and every install line of the Makefile is constrained.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
PROJECT = "cost-router"
# vLLM is installed on GPU machines only, in an environment of its own (docs/deployment.md): its
# torch and CUDA pins are not part of the development set.
OUTSIDE_THE_SET = {"vllm"}


def pins() -> dict[str, Version]:
    out: dict[str, Version] = {}
    for number, raw in enumerate(CONSTRAINTS.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._\-]*)==([^\s;]+)", line)
        assert match, f"constraints.txt line {number}: expected NAME==VERSION, got {raw!r}"
        name = canonicalize_name(match.group(1))
        assert name not in out, f"constraints.txt line {number}: {name} pinned twice"
        out[name] = Version(match.group(2))
    return out


def requirements() -> list[tuple[str, Requirement]]:
    """(where, requirement) of the project's dependencies and of every extra in the set."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        if extra not in OUTSIDE_THE_SET:
            out += [(f"extra {extra!r}", Requirement(r)) for r in reqs]
    return out


def test_every_requirement_of_every_extra_is_pinned_within_its_range() -> None:
    pinned = pins()
    problems = []
    for where, req in requirements():
        name = canonicalize_name(req.name)
        if name == PROJECT:  # an extra naming another extra of the project
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if name not in pinned:
            problems.append(f"{where}: {req} is not in constraints.txt")
        elif not req.specifier.contains(pinned[name], prereleases=True):
            problems.append(f"{where}: {req} excludes the pinned {name}=={pinned[name]}")
    assert not problems, "\n".join(problems)


def test_the_environment_holds_the_pinned_versions() -> None:
    """What is installed here was installed through the constraints (a package of an extra not
    installed here is simply absent)."""
    pinned = pins()
    off = sorted(
        f"{name} {dist.version} installed, constraints.txt pins {pinned[name]}"
        for dist in metadata.distributions()
        if (name := canonicalize_name(dist.metadata["Name"])) in pinned
        and Version(dist.version) != pinned[name]
    )
    assert not off, "\n".join(off) + "\n(reinstall with `make venv`, which uses constraints.txt)"


def test_pip_finds_no_broken_requirement() -> None:
    check = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_install_in_the_makefile_is_constrained() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(
        r"^PIP_INSTALL := \$\(BIN\)/pip install -q -c \$\(CONSTRAINTS\)$", makefile, re.M
    )
    assert re.search(r"^CONSTRAINTS := constraints.txt$", makefile, re.M)
    for line in makefile.splitlines():
        if "pip install" in line and "PIP_INSTALL :=" not in line:
            assert "--upgrade pip" in line, f"an unconstrained install in the Makefile: {line}"
    assert "$(PIP_INSTALL) --find-links $(WHEELS) -e '.[bench]'" in makefile
