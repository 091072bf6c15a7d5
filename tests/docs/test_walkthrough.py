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

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


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
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    commands = [first_command(), *walkthrough()]
    assert any(">>" in c for c in commands), commands  # the step that adds input is there
    outputs = []
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=mirror, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"$ {command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    # the run after the appended line processes just that line
    appended = next(i for i, c in enumerate(commands) if ">>" in c)
    rerun = next(i for i, c in enumerate(commands) if i > appended and c.startswith("tailrace run"))
    assert "1 messages processed" in outputs[rerun], outputs[rerun]
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
