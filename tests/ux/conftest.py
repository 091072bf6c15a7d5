"""Helpers of the user-experience tests: a small job written into a scratch directory,
and the ``tailrace`` command run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

TASK_OK = """
import tailrace


class Task(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("files.out", envelope.message)
"""


def tailrace_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tailrace", *args]


def run_cli(
    args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m tailrace ARGS`` in a real subprocess."""
    return subprocess.run(
        tailrace_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def write_job(
    root: Path,
    *,
    task: str = TASK_OK,
    partitions: Sequence[Sequence[object]] = ([{"n": 1}, {"n": 2}],),
    config: str = "",
    checkpoints: str = 'type = "sqlite"\npath = "state/cp.db"',
) -> Path:
    """A job directory: task.py, data/in/partition-N.jsonl, job.toml; returns job.toml."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.py").write_text(task)
    data = root / "data" / "in"
    data.mkdir(parents=True, exist_ok=True)
    for p, messages in enumerate(partitions):
        (data / f"partition-{p}.jsonl").write_text("".join(json.dumps(m) + "\n" for m in messages))
    job = root / "job.toml"
    job.write_text(
        f"""[job]
name = "ux"
task = "task.py:Task"
inputs = ["files.in"]

[config]
{config}

[systems.files]
type = "file"
path = "data"

[checkpoints]
{checkpoints}
"""
    )
    return job


def mypy_strict(tmp_path: Path, source: str) -> tuple[str, set[int]]:
    """Type-check ``source`` (a user's module) with ``mypy --strict`` against the installed
    package: mypy's output and the line numbers it reports errors on."""
    src = tmp_path / "typed_user_module.py"
    src.write_text(source)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "c"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    errors = [x for x in done.stdout.splitlines() if ": error:" in x]
    return done.stdout, {int(x.split(":")[1]) for x in errors}
