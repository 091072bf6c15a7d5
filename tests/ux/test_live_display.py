"""The live progress display in a real terminal: tmux at 80 columns, read back with
``capture-pane``. One view (no stale frames in the scrollback, no wrapped rows), log
lines and the shutdown notice above it, and a clean final summary once it is gone."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="needs tmux (scripts/test.sh installs it)"
)

WIDTH, HEIGHT = 80, 40

SLOW_TASK = """
import logging
import time

import tailrace

log = logging.getLogger("task")


class Task(tailrace.StreamTask):
    def init(self, context):
        self.name = context.task_name

    def process(self, envelope, collector, coordinator):
        time.sleep(0.002)
        if envelope.message["n"] % 200 == 0:
            log.info("%s reached %d", self.name, envelope.message["n"])

    def close(self):
        time.sleep(1.0)  # a slow shutdown: the notice must stay visible meanwhile
"""


class Tmux:
    """One tmux server (own socket) with one WIDTH x HEIGHT window running a command."""

    def __init__(self, command: str) -> None:
        self.socket = f"tailrace-ux-{uuid.uuid4().hex[:8]}"
        self._tmux(
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            f"bash --norc -c {shlex.quote(command)}",
        )

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True, timeout=10
        ).stdout

    def screen(self) -> list[str]:
        """The visible screen, then the whole scrollback (history included)."""
        return self._tmux("capture-pane", "-p", "-t", "t").rstrip("\n").split("\n")

    def history(self) -> list[str]:
        return self._tmux("capture-pane", "-p", "-S", "-", "-t", "t").rstrip("\n").split("\n")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.history()
            if predicate(lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.1)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    data = tmp_path / "data" / "in"
    data.mkdir(parents=True)
    for p in range(3):
        (data / f"partition-{p}.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(20000)))
    (tmp_path / "task.py").write_text(SLOW_TASK)
    (tmp_path / "job.toml").write_text(
        '[job]\nname = "live"\ntask = "task.py:Task"\ninputs = ["files.in"]\n'
        '[config]\n"task.commit.ms" = 300\n'
        '[systems.files]\ntype = "file"\npath = "data"\n'
    )
    return tmp_path


@pytest.fixture
def terminal(job: Path) -> Iterator[Tmux]:
    cli = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "tailrace", "run", str(job)])
    t = Tmux(f"cd {shlex.quote(str(job))}; {cli}; echo EXIT=$?; sleep 600")
    try:
        yield t
    finally:
        t.kill()


ROW = re.compile(r"^files\.in\[\d\]\s+(\d+|-)\s+[\d,]+\s+[\d.]+ (B|KiB|MiB)\s+\d+%$")  # remaining: bytes, %


def headers(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith("tailrace live (c engine)")]


def test_live_view_fits_80_columns_keeps_notice_and_leaves_a_clean_summary(terminal: Tmux) -> None:
    # running: one view at the bottom, log lines above it, no stale frame anywhere in the scrollback
    lines = terminal.wait_for(lambda ls: len(headers(ls)) == 1 and any("reached 400" in x for x in ls), 30)
    time.sleep(1.5)  # several redraws (4 a second)
    lines = terminal.history()
    assert len(headers(lines)) == 1, "\n".join(lines)
    top = headers(lines)[0]
    view = [x for x in lines[top:] if x.strip()]
    assert view[1].startswith("processed ") and "msg/s" in view[1]
    # issue 38, item 8: file sizes are known, so how much is left (and when it is done)
    to_go = r"remaining [\d.]+ (B|KiB|MiB) of [\d.]+ KiB \(\d+%\), (ETA \d+:\d\d|done)"
    assert re.fullmatch(to_go, view[2]), view
    rows = [x for x in view if x.startswith("files.in[")]
    assert len(rows) == 3 and all(ROW.match(x) for x in rows), view  # whole rows, not wrapped
    assert all(len(x) <= WIDTH for x in lines)
    assert any("INFO task: Partition" in x for x in lines[:top])  # log lines scroll above the view

    # Ctrl-C: the notice stays visible above the view during the slow shutdown
    terminal.keys("C-c")
    lines = terminal.wait_for(lambda ls: any("stopping gracefully; Ctrl-C again" in x for x in ls), 10)
    time.sleep(0.6)
    lines = terminal.history()
    notice = [i for i, x in enumerate(lines) if x.startswith("tailrace: SIGINT: stopping gracefully")]
    assert len(notice) == 1, "\n".join(lines)
    assert len(headers(lines)) == 1 and notice[0] < headers(lines)[0], "\n".join(lines)

    # the end: the view is gone, the summary is clean, the exit status graceful
    lines = terminal.wait_for(lambda ls: any(x.startswith("EXIT=") for x in ls), 40)
    text = "\n".join(lines)
    assert "EXIT=0" in text, text
    assert not headers(lines), text  # no frame left behind, in the screen or the scrollback
    assert not any(ROW.match(x) for x in lines), text
    assert any(x.startswith("tailrace: SIGINT: stopping gracefully") for x in lines)
    summary = [i for i, x in enumerate(lines) if x.startswith("job 'live' finished (stop) in ")]
    assert len(summary) == 1, text
    after = lines[summary[0] :]
    assert after[1] == "  0 bad lines skipped" and after[2] == "  committed offsets:", text
    assert all(re.match(r"^    files\.in\[\d\]\s+\d+$", x) for x in after[3:6]), text
    assert after[6] == "EXIT=0", text
