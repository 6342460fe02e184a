"""Every command the docs show works as shown (issue 16's acceptance: a docs test).

Commands are taken from README.md and docs/*.md: each line of a code block (fenced or indented)
that starts with a program a user types (`cost-router`, `.venv/bin/...`, `python`, `make`, `curl`,
`pip`; after `VAR=value`, `cd DIR &&` and `chrt -f N` prefixes), backslash continuations joined.
Each one is, by what the doc says right above its code block:

- unmarked: run for real, in order, in a scratch folder (a `router.yaml` whose budgets live in
  the test Redis under a private key prefix; `docs/` of this checkout), and must exit 0. A
  `[...]` part of a command is optional: the command runs without it, and the form with it is
  checked as below.
- marked `<!-- docs-test: skip (REASON) -->` (needs a GPU, a remote service) or
  `<!-- docs-test: slow (REASON) -->` (minutes of work): not run; its command line is parsed by
  the real command line (the sub-command exists, every flag exists, arguments fit).
- a benchmark script (`benchmarks/*.py`, `-m benchmarks.*`): slow by nature, never run here;
  the script must start and list every flag shown in its `--help`.

So a command can't be added to the docs, or a flag renamed in the code, without this test
failing until the doc is fixed or marked. Inline `cost-router ...` spans in prose are checked
the same parse-only way (sub-commands and flags exist; `a|b` alternatives each), and inline
`make X` / `benchmarks/x.py` name a real target / file.

The README's first two commands cannot run inside the test suite: `make test` runs this very
suite, and `make demo` builds llama-cpp-python (minutes) and serves until Ctrl-C (the embedded
demo itself is tests/router/server/test_demo.py). They are checked structurally: the Makefile
targets exist, the venv they depend on installs `.[dev,demo,distill]`, `demo` runs
`cost-router serve` from it, and `test` starts Redis and runs `ruff check .`,
`ruff format --check .`, `lint-imports` and pytest.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main

from classifiers.dataset import routellm_data_dir
from router.cli import app
from router.config import load_config
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.sim import write_jsonl_trace
from trace_format.config_base import ConfigError

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent
CLI = typer.main.get_command(app)

MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|slow)\s*\(([^)]*\w[^)]*)\)\s*-->")
ANY_MARKER = re.compile(r"<!--\s*docs-test:")
# What a user types first; anything else in a code block is output, config or prose.
PROGRAMS = re.compile(
    r"(?:\.venv/bin/)?(?:cost-router|python3?|make|curl|pip|ruff|lint-imports)"
    r"(?:\s|$)"
)
PREFIXES = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+|cd\s+\S+\s*&&\s*|chrt\s+-f\s+\d+\s+)+")
OPTIONAL = re.compile(r"\s*\[[^\]]*\]")
# Placeholders the docs use for values only a run knows.
DOC_KEY_ID = "5a44ee83"
SMALL_SUBJECT = "mmlu_abstract_algebra.csv"


@dataclass(frozen=True)
class DocCommand:
    doc: str
    line: int
    text: str  # as shown, continuations joined, wrappers (VAR=, cd &&) stripped
    marker: tuple[str, str] | None  # (skip|slow, reason)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"

    @property
    def is_benchmark(self) -> bool:
        return bool(re.search(r"(?:^|\s)(?:benchmarks/\w+\.py|-m\s+benchmarks\.\w+)", self.text))


def _marker_above(lines: list[str], i: int) -> str | None:
    """The nearest non-blank line above line i, if it is a docs-test marker."""
    above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
    return above if ANY_MARKER.search(above) else None


def _code_blocks(lines: list[str]) -> list[tuple[int, list[tuple[int, str]], str | None]]:
    """(first line no, [(line no, text)], marker line above it) for every fenced or indented
    code block; fenced YAML/JSON/Python blocks are left out (config and code, not commands)."""
    blocks = []
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _marker_above(lines, i)
        fence = re.match(r"^(\s*)(```+)\s*(\w*)", line)
        if fence:
            lang, body, i = fence.group(3).lower(), [], i + 1
            while i < len(lines) and not lines[i].strip().startswith(fence.group(2)):
                body.append((i + 1, lines[i]))
                i += 1
            if lang in ("", "bash", "sh", "shell", "console", "text"):
                blocks.append((body[0][0] if body else i, body, marker))
        elif line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append((i + 1, lines[i][4:]))
                i += 1
            blocks.append((body[0][0], body, marker))
            continue
        i += 1
    return blocks


def doc_commands() -> list[DocCommand]:
    out = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for _, body, marker_line in _code_blocks(lines):
            marker = None
            if marker_line is not None:
                m = MARKER.search(marker_line)
                assert m, f"{path.name}: malformed marker {marker_line.strip()!r}"
                marker = (m.group(1), m.group(2).strip())
            k = 0
            while k < len(body):
                no, text = body[k]
                while text.rstrip().endswith("\\") and k + 1 < len(body):
                    k += 1
                    text = text.rstrip()[:-1] + " " + body[k][1].strip()
                k += 1
                stripped = PREFIXES.sub("", text.strip().lstrip("$ "))
                if PROGRAMS.match(stripped):
                    out.append(DocCommand(path.name, no, stripped.split(" #")[0].strip(), marker))
    return out


COMMANDS = doc_commands()


# --- parsing a command line with the real CLI ---------------------------------------------------


def _words(text: str) -> list[str]:
    return shlex.split(os.path.expandvars(text))


def _cli_args(words: list[str]) -> list[str] | None:
    """The arguments after `cost-router` (any spelling of it), or None for another program."""
    if words and Path(words[0]).name == "cost-router":
        return words[1:]
    return None


def _is_group(cmd: Any) -> bool:
    # typer vendors its own click: its groups are no `click.Group`.
    return hasattr(cmd, "list_commands")


def _resolve(args: list[str]) -> tuple[Any, list[str], list[str]]:
    """(leaf command, its path, the arguments left) for `cost-router ARGS`."""
    cmd: Any = CLI
    path: list[str] = []
    while _is_group(cmd) and args and not args[0].startswith("-"):
        sub = cmd.get_command(cmd.context_class(cmd), args[0])
        assert sub is not None, f"`cost-router {' '.join(path)}` has no sub-command {args[0]!r}"
        cmd, path, args = sub, [*path, args[0]], args[1:]
    return cmd, path, args


def check_parses(args: list[str]) -> None:
    """The command line fits the real CLI: sub-commands, flags, arguments (nothing is run)."""
    cmd, path, rest = _resolve(args)
    assert not _is_group(cmd), f"`cost-router {' '.join(path)}` needs a sub-command"
    try:
        cmd.make_context(" ".join(["cost-router", *path]), list(rest), resilient_parsing=False)
    except typer.BadParameter as exc:
        # A file the doc names that this checkout does not have (models/new.onnx) is fine here.
        if "does not exist" not in str(exc):
            raise


def _option_names(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}


# --- inline spans in prose ----------------------------------------------------------------------


def inline_cli_spans() -> list[tuple[str, str]]:
    spans = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        # A span may wrap onto the next line of the paragraph.
        for span in re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", text):
            if re.match(r"(?:\.venv/bin/)?cost-router\s+\S", span):
                spans.append((path.name, " ".join(span.split())))
    return spans


@pytest.mark.parametrize(
    ("doc", "span"), inline_cli_spans(), ids=[f"{d}:{s[:40]}" for d, s in inline_cli_spans()]
)
def test_inline_command_names_real_subcommands_and_flags(doc: str, span: str) -> None:
    words = OPTIONAL.sub(lambda m: " " + m.group(0).strip()[1:-1], span).split()[1:]
    # A placeholder (COMMAND, FILE, `...`) ends what can be checked.
    words = (
        [w for w in words if not re.fullmatch(r"[A-Z]+|\.\.\.", w)]
        if words and re.fullmatch(r"[A-Z]+", words[0]) is None
        else []
    )
    alternatives = [[]]
    for w in words:
        if "|" in w and not w.startswith("-"):
            alternatives = [[*a, alt] for a in alternatives for alt in w.split("|")]
        else:
            alternatives = [[*a, w] for a in alternatives]
    for alt in alternatives:
        cmd, path, rest = _resolve(alt)
        flags = {w.split("=")[0] for w in rest if w.startswith("-")}
        unknown = flags - _option_names(cmd)
        assert not unknown, f"{doc}: `{span}`: `cost-router {' '.join(path)}` has no {unknown}"


def test_inline_make_targets_and_scripts_exist() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"`make (\w+)`", text):
            assert target in targets, f"{path.name}: `make {target}`: no such Makefile target"
        for script in re.findall(r"\bbenchmarks/(\w+\.py)\b", text):
            assert (REPO / "benchmarks" / script).is_file(), f"{path.name}: no benchmarks/{script}"
        for module in re.findall(r"python -m benchmarks\.(\w+)", text):
            assert (REPO / "benchmarks" / f"{module}.py").is_file(), f"{path.name}: no {module}"


# --- the README's first two commands ------------------------------------------------------------


def test_readme_first_commands_are_make_demo_and_make_test() -> None:
    firsts = [c.text for c in COMMANDS if c.doc == "README.md"][:2]
    assert [f.split()[:2] for f in firsts] == [["make", "demo"], ["make", "test"]]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")

    def recipe(target: str) -> tuple[str, str]:
        m = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n?)*)", makefile, flags=re.M)
        assert m, f"Makefile has no target {target!r}"
        return m.group(1), m.group(2)

    stamp_deps, stamp = recipe("$(STAMP)")
    assert "pyproject.toml" in stamp_deps and "-e '.[dev,demo,distill]'" in stamp
    demo_deps, demo = recipe("demo")
    assert "$(STAMP)" in demo_deps and "$(BIN)/cost-router serve" in demo
    test_deps, test = recipe("test")
    assert "$(STAMP)" in test_deps.split() and "redis" in test_deps.split()
    assert [ln.strip() for ln in test.splitlines() if ln.strip()] == [
        "$(BIN)/ruff check .",
        "$(BIN)/ruff format --check .",
        "$(BIN)/lint-imports",
        "$(BIN)/python -m pytest -q",
    ]
    _, redis_recipe = recipe("redis")
    assert "redis-server" in redis_recipe


# --- code-block commands ------------------------------------------------------------------------


def test_every_documented_command_is_recognised() -> None:
    """The extraction itself: the commands issue 16 names are found, and marked ones say why."""
    texts = [c.text for c in COMMANDS]
    assert any(t.startswith("cost-router keys revoke") for t in texts)
    assert any(t.startswith("cost-router backends plan") for t in texts)
    assert sum(c.is_benchmark for c in COMMANDS) >= 10
    for c in COMMANDS:
        if c.marker is not None:
            assert c.marker[1], c.where


@pytest.mark.parametrize(
    "command",
    [c for c in COMMANDS if c.marker or OPTIONAL.search(c.text)],
    ids=lambda c: f"{c.doc}:{c.line}",
)
def test_marked_or_optional_command_lines_parse(command: DocCommand) -> None:
    words = _words(OPTIONAL.sub(lambda m: " " + m.group(0).strip()[1:-1], command.text))
    if command.is_benchmark:
        return  # test_benchmark_commands_accept_their_flags
    args = _cli_args(words)
    if args is not None:
        check_parses(args)
        return
    assert command.marker is not None, f"{command.where}: not a cost-router command: mark it"


def test_benchmark_commands_accept_their_flags() -> None:
    scripts: dict[tuple[str, ...], set[str]] = {}
    for c in COMMANDS:
        if not c.is_benchmark:
            continue
        words = _words(OPTIONAL.sub(lambda m: " " + m.group(0).strip()[1:-1], c.text))
        at = next(i for i, w in enumerate(words) if w.startswith("benchmarks") or w == "-m")
        run = (words[at], words[at + 1]) if words[at] == "-m" else (words[at],)
        # Flags the doc passes, each with where it is shown.
        scripts.setdefault(run, set()).update(
            f"{w.split('=')[0]}\t{c.where}" for w in words[at + len(run) :] if w.startswith("--")
        )

    def help_of(run: tuple[str, ...]) -> tuple[tuple[str, ...], subprocess.CompletedProcess[str]]:
        return run, subprocess.run(
            [sys.executable, *run, "--help"], cwd=REPO, text=True, capture_output=True, timeout=120
        )

    with ThreadPoolExecutor(4) as pool:
        for run, proc in pool.map(help_of, scripts):
            assert proc.returncode == 0, f"{' '.join(run)} --help: {proc.stderr[-2000:]}"
            for flag_where in sorted(scripts[run]):
                flag, where = flag_where.split("\t")
                assert re.search(rf"{re.escape(flag)}\b", proc.stdout), f"{where}: no {flag}"


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A scratch folder laid out as the docs assume: `router.yaml` (team `search`, budgets in the
    test Redis under a private prefix, the `routing-ab` experiment), `traces/` and
    `traces.jsonl` (60 real GSM8K requests with outcomes, an A/B arm each), `docs/` of this
    checkout; $COST_ROUTER_DATA names one small real RouteLLM subject."""
    prefix = random_prefix()
    (tmp_path / "router.yaml").write_text(
        "tiers:\n"
        "  - {name: small, base_url: 'http://127.0.0.1:9/v1', model: small,\n"
        "     price: {input_per_mtok: 0.6, output_per_mtok: 0.6}}\n"
        "  - {name: large, base_url: 'http://127.0.0.1:9/v1', model: large,\n"
        "     price: {input_per_mtok: 10, output_per_mtok: 30}}\n"
        "policies:\n"
        "  balanced: {type: threshold, small: small, large: large, threshold: 0.5}\n"
        "  everything-large: {type: fixed, tier: large}\n"
        "default_policy: balanced\n"
        "experiments:\n"
        "  - {name: routing-ab, unit: user, arms: {control: {policy: everything-large, weight: 1},"
        " treatment: {policy: balanced, weight: 1}}}\n"
        "teams:\n  search: {budget: {limit_usd: 500, period: monthly}}\n"
        f"budgets: {{store: redis, redis_url: '{REDIS_URL}', key_prefix: {prefix}}}\n",
        encoding="utf-8",
    )
    (tmp_path / "docs").symlink_to(REPO / "docs")
    traces = tmp_path / "traces"
    traces.mkdir()
    records = write_jsonl_trace(tmp_path / "traces.jsonl", 60, teams=("search",))
    for i, r in enumerate(records):
        control = i % 2 == 0
        r.update(
            user=f"user-{i % 12}",
            experiment="routing-ab",
            arm="control" if control else "treatment",
            policy="everything-large" if control else "balanced",
            tier="large" if control or i % 3 == 0 else "small",
            latency_ms=40.0 + i,
            cost_usd=0.0001 * (1 + control),
        )
    (traces / "requests.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8"
    )
    data = tmp_path / "routellm" / "mmlu"
    data.mkdir(parents=True)
    (data / SMALL_SUBJECT).write_bytes(
        (routellm_data_dir() / "mmlu" / "responses" / SMALL_SUBJECT).read_bytes()
    )
    yield {"cwd": str(tmp_path), "prefix": prefix, "data": str(data.parent)}
    delete_prefix(prefix)


def _env(sandbox: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COST_ROUTER")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["COST_ROUTER_DATA"] = sandbox["data"]
    # This checkout's code, whichever one the venv's `cost-router` was installed from.
    env["PYTHONPATH"] = str(REPO)
    return env


def test_unmarked_commands_run(sandbox: dict[str, str]) -> None:
    env = _env(sandbox)
    key_id = None
    ran = []
    for c in COMMANDS:
        if c.marker is not None or c.is_benchmark or c.text.startswith("make "):
            continue
        words = shlex.split(OPTIONAL.sub("", c.text).replace("$COST_ROUTER_DATA", sandbox["data"]))
        args = _cli_args(words)
        assert args is not None, f"{c.where}: unmarked, and not a command this test runs: mark it"
        if key_id is not None:
            args = [key_id if a == DOC_KEY_ID else a for a in args]
        proc = subprocess.run(
            [str(VENV_BIN / "cost-router"), *args],
            cwd=sandbox["cwd"],
            env=env,
            text=True,
            capture_output=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{c.where}\nexit {proc.returncode}\n{proc.stderr[-3000:]}"
        if args[:2] == ["keys", "create"]:
            key_id = re.search(r"key id (\w+)", proc.stderr).group(1)  # type: ignore[union-attr]
        ran.append(c.where)
    assert len(ran) >= 10, ran


def test_readme_toolbox_commands_run_on_small_inputs(sandbox: dict[str, str]) -> None:
    """The README's toolbox rows no code block runs (those are test_unmarked_commands_run's):
    each on one small RouteLLM subject, with the flags that keep it to seconds."""
    env = _env(sandbox)
    data = sandbox["data"]
    (Path(sandbox["cwd"]) / "requests.jsonl").write_text(
        '{"prompt": "What is 2 + 2?"}\n'
        '{"messages": [{"role": "user", "content": "Prove that sqrt(2) is irrational."}]}\n',
        encoding="utf-8",
    )
    runs = [
        (["classifier", "eval", data, "--rounds", "50"], None, "APGR"),
        (["classifier", "score"], "requests.jsonl", '"score"'),
        (["classifier", "bench", "--data", data, "--queries", "50", "--batch", "100"], None, "p50"),
        (["synth", "--out", "synth.parquet", "--rows", "200", "--from", data], None, ""),
    ]
    for args, stdin, expect in runs:
        with open(Path(sandbox["cwd"]) / stdin if stdin else os.devnull, "rb") as fh:
            proc = subprocess.run(
                [str(VENV_BIN / "cost-router"), *args],
                cwd=sandbox["cwd"],
                env=env,
                stdin=fh,
                capture_output=True,
                timeout=120,
            )
        out = proc.stdout.decode() + proc.stderr.decode()
        assert proc.returncode == 0, f"cost-router {' '.join(args)}: {out[-3000:]}"
        assert expect in out, f"cost-router {' '.join(args)}: {out[-3000:]}"
    assert (Path(sandbox["cwd"]) / "synth.parquet").stat().st_size > 0


# --- configs shown whole ------------------------------------------------------------------------


def doc_configs() -> list[tuple[str, int, str]]:
    """Every fenced YAML block with a top-level `tiers:` (a whole router config, as the README's
    `router.yaml` is: "check it with: cost-router config check router.yaml"), unless the doc
    marks it `<!-- docs-test: skip (REASON) -->` (an excerpt)."""
    out = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not re.match(r"```ya?ml\s*$", line.strip()):
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            body = "\n".join(lines[i + 1 : end])
            above = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            if re.search(r"^tiers:", body, flags=re.M) and not MARKER.search(above):
                out.append((path.name, i + 2, body))
    return out


@pytest.mark.parametrize(
    ("doc", "line", "body"), doc_configs(), ids=[f"{d}:{n}" for d, n, _ in doc_configs()]
)
def test_whole_configs_in_the_docs_pass_config_check(
    doc: str, line: int, body: str, tmp_path: Path
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(body, encoding="utf-8")
    try:
        load_config(path, environ={})
    except ConfigError as exc:
        pytest.fail(f"{doc}:{line}: the config shown fails `config check`: {exc}")


def test_example_configs_pass_config_check() -> None:
    examples = sorted((REPO / "docs" / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_config(path, environ={})


# --- tables print whole cells (issue 16: key ids were cut at 80 columns) ----------------------


def test_tables_keep_long_key_ids_and_team_names(sandbox: dict[str, str]) -> None:
    team = "platform-infrastructure-search-quality-evaluation"
    config = Path(sandbox["cwd"]) / "router.yaml"
    config.write_text(
        config.read_text(encoding="utf-8").replace("search:", f"{team}:"), encoding="utf-8"
    )
    env = _env(sandbox)
    env["COLUMNS"] = "60"  # a narrow terminal's width, which piped output would otherwise get

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(VENV_BIN / "cost-router"), *args, "-c", str(config)],
            env=env,
            text=True,
            capture_output=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    created = cli("keys", "create", "--team", team, "--name", "a-long-key-name-for-the-table")
    key_id = re.search(r"key id (\w+)", created.stderr).group(1)  # type: ignore[union-attr]
    listed = cli("keys", "list").stdout
    assert key_id in listed and team in listed and "a-long-key-name-for-the-table" in listed
    shown = cli("budget", "show").stdout
    assert team in shown and "$500.000000" in shown
    revoked = cli("keys", "revoke", key_id).stdout
    assert key_id in revoked
