"""An input file replaced under a checkpoint is refused (issue 13, defect 12).

A partition file rewritten with lines of the same shape keeps every committed offset
at a line start, so the line-start check alone accepts it and the new file's lines
before the checkpoint are silently skipped. The fingerprint recorded at each commit
(``tailrace.files.fingerprint_path``) catches it; appending stays fine.
"""

from __future__ import annotations

import json
from pathlib import Path

from tailrace.files import fingerprint_path, read_stream

from .conftest import run_cli
from .test_cli import write_job


def _lines(values: range) -> str:
    return "".join(json.dumps({"v": f"{v:06d}"}) + "\n" for v in values)


def test_a_replaced_input_file_is_refused_and_an_appended_one_resumes(engine: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, lines=_lines(range(100)))
    src = tmp_path / "data" / "in" / "partition-0.jsonl"
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert fingerprint_path(src).exists()
    assert len(read_stream(tmp_path / "data" / "out")[0]) == 100

    with open(src, "a") as f:  # appending is what a partition file is for
        f.write(_lines(range(100, 120)))
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert [m["v"] for m in read_stream(tmp_path / "data" / "out")[0]] == [f"{v:06d}" for v in range(120)]

    # replaced: same line shape, so every old offset is still a line start
    src.write_text(_lines(range(500, 650)))
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1
    assert "partition-0.jsonl" in r.stderr
    assert "partition 0 (files.in[0]): the file was replaced or rewritten since the checkpoint" in r.stderr
    committed = 119 * len(_lines(range(1)))
    assert f"checkpoint at offset {committed}" in r.stderr
    assert len(read_stream(tmp_path / "data" / "out")[0]) == 120  # nothing of the new file was skipped past


def test_a_rewritten_prefix_is_refused_even_when_the_committed_line_is_unchanged(
    engine: str, tmp_path: Path
) -> None:
    job = write_job(tmp_path, lines=_lines(range(50)))
    src = tmp_path / "data" / "in" / "partition-0.jsonl"
    assert run_cli(["run", str(job), "--engine", engine, "--no-progress"]).returncode == 0
    data = bytearray(src.read_bytes())
    data[len(data) - 200 : len(data) - 199] = b"7"  # one digit of an earlier line, same length
    src.write_bytes(bytes(data))
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1
    assert "was replaced or rewritten since the checkpoint" in r.stderr
