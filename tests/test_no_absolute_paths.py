"""No absolute path of a development machine in the repository (issue 16): docs, code and
configs must work on any clone, so they name data by a relative path, an option or an
environment variable (`COST_ROUTER_DATA` for the shared RouteLLM data)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Home and workspace roots of the machines this was developed on, and any absolute path into the
# shared data folder. /tmp is not flagged: every Unix machine has it (examples write there); nor
# are made-up server paths (benchmarks/fault_upstream.py's fake upstream traceback, /srv/...).
MACHINE_PATH = re.compile(
    r"(?<![\w.:/~-])(?:/(?:work|home|Users|root)/[\w.-]|/[\w./-]*shared/data\b)[^\s'\"`)]*"
)


def _repository_files() -> list[Path]:
    # Tracked files and new ones not ignored: what a commit would carry.
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [ROOT / name for name in out.split("\0") if name]


def machine_paths(text: str) -> list[tuple[int, str]]:
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in MACHINE_PATH.finditer(text)]


def test_the_pattern_flags_machine_paths_only() -> None:
    assert machine_paths('DATA = Path("/work/shared/data/routellm")')
    assert machine_paths("see /home/alice/notes.md")
    assert machine_paths("--traces /data/team/shared/data/routellm")
    for fine in (
        "../shared/data/routellm",
        "https://example.com/home/x",
        "~/work/x",
        "--out /tmp/ab.png",
        "docs/img/x.png",
        "$COST_ROUTER_DATA/gsm8k",
    ):
        assert not machine_paths(fine), fine


def test_no_file_names_a_machines_absolute_path() -> None:
    me = Path(__file__).resolve()
    found = []
    for path in _repository_files():
        if path.resolve() == me or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (models, images) carry no paths we write
        found += [f"{path.relative_to(ROOT)}:{line}: {hit}" for line, hit in machine_paths(text)]
    assert not found, "absolute paths of a machine:\n" + "\n".join(found)
