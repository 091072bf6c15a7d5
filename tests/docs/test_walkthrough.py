"""The README's walkthrough, run as written (its commands are read from README.md), in a
mirror of the checkout; then the example tests, which must still pass: the walkthrough
never edits the data the tests check."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
RUNNING_JOBS = (REPO / "docs" / "running-jobs.md").read_text()
WORDCOUNT = "tailrace run examples/wordcount"


def first_command() -> str:
    """``tailrace run ...`` of the README's first bash block (after its ``pip install . &&``)."""
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block is not None
    line = next(x for x in block.group(1).splitlines() if "tailrace run" in x)
    return line.split("&&")[-1].strip()


def walkthrough() -> list[str]:
    """The ``$ `` commands of the README's first text block that runs tailrace."""
    for block in re.findall(r"```text\n(.*?)```", README, re.S):
        commands = [x[2:] for x in block.splitlines() if x.startswith("$ ")]
        if any(c.startswith("tailrace run") for c in commands):
            return commands
    raise AssertionError("README has no walkthrough")


def test_readme_walkthrough_then_the_example_tests(tmp_path: Path) -> None:
    mirror = tmp_path / "checkout"
    skip = shutil.ignore_patterns("state", "output", "__pycache__")
    shutil.copytree(REPO / "examples", mirror / "examples", ignore=skip)
    shutil.copytree(REPO / "tests" / "jobs", mirror / "tests" / "jobs", ignore=skip)
    home = tmp_path / "home"  # where ~/ of the walkthrough goes
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    commands = [first_command(), *walkthrough()]
    assert any(">>" in c for c in commands), commands  # the step that adds input is there
    before = sorted(p.name for p in mirror.iterdir())
    outputs = []
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=mirror, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"$ {command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    # issue 38: the copy a user works on is not made in the checkout's root
    assert sorted(p.name for p in mirror.iterdir()) == before
    assert list(home.iterdir()), "the walkthrough's copy goes to ~/"
    # the run after the appended line processes just that line
    appended = next(i for i, c in enumerate(commands) if ">>" in c)
    rerun = next(i for i, c in enumerate(commands) if i > appended and c.startswith("tailrace run"))
    assert "1 message processed" in outputs[rerun], outputs[rerun]
    # ... and the example tests still pass on that checkout
    tests = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "example",
            "tests/jobs/test_cli.py",
        ],
        cwd=mirror,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout


# -- the outputs the docs show -----------------------------------------------------------
VARIABLE = re.compile(r"\.\.\.|in \d+\.\d+ s|\(\d[\d,]* msg/s\)")


def _pattern(line: str) -> str:
    """A documented line as a regex: "..." stands for any text, and a run's seconds and
    rate for any (they are the machine's)."""
    out, at = [], 0
    for m in VARIABLE.finditer(line):
        out.append(re.escape(line[at : m.start()]))
        if m.group() == "...":
            out.append(".*")
        elif m.group().startswith("in "):
            out.append(r"in \d+\.\d+ s")
        else:
            out.append(r"\(\d[\d,]* msg/s\)")
        at = m.end()
    out.append(re.escape(line[at:]))
    return "".join(out)


def _unordered_tasks(lines: list[str]) -> list[str]:
    """Each run of "Partition N: ..." lines sorted: tasks print in the order they reach the
    end of their input."""
    out: list[str] = []
    group: list[str] = []
    for line in [*lines, ""]:
        if line.startswith("Partition "):
            group.append(line)
            continue
        out += [*sorted(group), line]
        group = []
    return out[:-1]


def _matches(shown: list[str], real: list[str]) -> bool:
    """``real`` is ``shown`` line for line; a line "..." stands for any lines."""
    if not shown:
        return not real
    if shown[0] == "...":
        return any(_matches(shown[1:], real[i:]) for i in range(len(real) + 1))
    return (
        bool(real) and re.fullmatch(_pattern(shown[0]), real[0]) is not None and _matches(shown[1:], real[1:])
    )


def _shown_after(doc: str, command: str, nth: int = 0) -> list[str]:
    """The output a doc shows for the ``nth`` ``$ command`` of its text blocks: the lines after
    it, up to the next command."""
    found = []
    for block in re.findall(r"```text\n(.*?)```", doc, re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.split("  #")[0].strip() == f"$ {command}":
                rest = lines[i + 1 :]
                found.append(rest[: next((j for j, x in enumerate(rest) if x.startswith("$ ")), len(rest))])
    assert len(found) > nth, f"no `$ {command}` shown"
    return found[nth]


def _first_run_shown() -> list[str]:
    """running-jobs.md's output of the first run (the text block after "## The first command")."""
    section = RUNNING_JOBS.split("## The first command", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1).splitlines()


def _check_shown(shown: list[str], done: subprocess.CompletedProcess[str]) -> None:
    """Log lines (``INFO name: ...``) are on stderr, each after its timestamp; the rest is
    stdout, all of it."""
    logged = [x.split(" ", 2)[2] for x in done.stderr.splitlines() if x[:2].isdigit()]
    for line in (x for x in shown if x.startswith("INFO ")):
        assert any(re.fullmatch(_pattern(line), x) for x in logged), f"{line!r} not in\n{done.stderr}"
    printed = _unordered_tasks(done.stdout.splitlines())
    expected = _unordered_tasks([x for x in shown if not x.startswith("INFO ")])
    assert _matches(expected, printed), (
        "the docs show\n" + "\n".join(expected) + "\nthe run printed\n" + "\n".join(printed)
    )


def test_the_wordcount_outputs_the_docs_show_are_what_it_prints(tmp_path: Path) -> None:
    # the first run (running-jobs.md), then the second, resumed from its checkpoint (README.md
    # and running-jobs.md), then checkpoints show and reset: each output as the docs show it
    skip = shutil.ignore_patterns("state", "output", "__pycache__")
    shutil.copytree(REPO / "examples" / "wordcount", tmp_path / "examples" / "wordcount", ignore=skip)

    def run(command: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tailrace", *command.split()[1:]]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    _check_shown(_first_run_shown(), run(WORDCOUNT))
    again = run(WORDCOUNT)
    _check_shown(_shown_after(README, WORDCOUNT), again)
    _check_shown(_shown_after(RUNNING_JOBS, WORDCOUNT), again)
    show = "tailrace checkpoints show examples/wordcount"
    _check_shown(_shown_after(RUNNING_JOBS, show), run(show))
    reset = "tailrace checkpoints reset examples/wordcount --yes"
    _check_shown(_shown_after(RUNNING_JOBS, reset), run(reset))


def test_what_the_first_command_writes_into_the_example_is_ignored_by_git() -> None:
    # issue 38: `tailrace run examples/wordcount` left data/.tailrace-fingerprints/ untracked;
    # the fingerprints live next to the data by design (docs/running-jobs.md), so git ignores them
    from tailrace.files import fingerprint_path

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    example = Path("examples/wordcount")
    written = [
        fingerprint_path(example / "data" / "lines" / "partition-0.txt"),
        example / "state" / "checkpoints.db",
        example / "output" / "counts" / "partition-0.jsonl",
    ]
    for path in written:
        done = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO, capture_output=True)
        assert done.returncode == 0, f"{path} is not ignored by git"
