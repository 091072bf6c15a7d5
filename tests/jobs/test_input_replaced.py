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


def _values(tmp_path: Path) -> list[str]:
    return [m["v"] for m in read_stream(tmp_path / "data" / "out")[0]]


def test_a_last_line_without_a_newline_is_read_and_a_rerun_stays_exact(engine: str, tmp_path: Path) -> None:
    """A file whose last line has no newline: that line is a message (bounded input); a
    rerun with nothing new reads nothing, and one newline added later is the same line."""
    job = write_job(tmp_path, lines=_lines(range(3)).rstrip("\n"))
    src = tmp_path / "data" / "in" / "partition-0.jsonl"
    assert run_cli(["run", str(job), "--engine", engine, "--no-progress"]).returncode == 0
    assert _values(tmp_path) == ["000000", "000001", "000002"]
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    with open(src, "a") as f:
        f.write("\n" + _lines(range(3, 5)))
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert _values(tmp_path) == [f"{v:06d}" for v in range(5)]


def test_bytes_appended_to_a_last_line_read_without_a_newline_are_refused(
    engine: str, tmp_path: Path
) -> None:
    """A writer appended half a line, a run read it as the file's last line and committed it;
    the rest of that line arrived later. Resuming past that line would silently lose the
    whole line as written: the restart refuses, naming the line."""
    text = tmp_path / "data" / "in" / "partition-0.txt"
    job = write_job(tmp_path, lines="")
    (tmp_path / "data" / "in" / "partition-0.jsonl").unlink()
    text.write_text("hello\nwor")
    assert run_cli(["run", str(job), "--engine", engine, "--no-progress"]).returncode == 0
    assert read_stream(tmp_path / "data" / "out")[0] == ["hello", "wor"]
    with open(text, "a") as f:
        f.write("ld\nagain\n")
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1, r.stdout
    assert "partition-0.txt" in r.stderr
    assert "the line at byte offset 6 was the last line of the file, without a newline" in r.stderr
    assert read_stream(tmp_path / "data" / "out")[0] == ["hello", "wor"]  # nothing skipped past
