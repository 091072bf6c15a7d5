"""Exit status after SIGTERM / SIGINT (issue 13, defect 11): a signal while the job
starts (before the run loop exists) or after its final summary ends the process
with the graceful path's status (0), not killed by the signal (-15 / -2). Real
processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import tailrace_cmd, write_job

SLOW_TASK = """
import atexit
import os
import time

import tailrace

if os.environ.get("IMPORTING"):
    open(os.environ["IMPORTING"], "w").close()  # the CLI is loading the job (its handler is in place)
time.sleep(float(os.environ.get("SLOW_IMPORT", "0")))  # a task module that is slow to import
atexit.register(time.sleep, float(os.environ.get("SLOW_EXIT", "0")))  # slow interpreter exit


class Task(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("files.out", envelope.message)
"""


def _wait_for(marker: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert time.monotonic() < deadline, "the CLI never started loading the task module"
        time.sleep(0.02)


def _start(job: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    import os

    return subprocess.Popen(
        tailrace_cmd("run", str(job), "--no-progress"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_start_up_stops_gracefully(sig: signal.Signals, tmp_path: Path) -> None:
    job = write_job(tmp_path, task=SLOW_TASK, partitions=[[{"n": i} for i in range(10)]])
    marker = tmp_path / "importing"
    proc = _start(job, {"SLOW_IMPORT": "1.5", "IMPORTING": str(marker)})
    _wait_for(marker)  # the CLI is loading the task module (sleeping in its import)
    assert proc.poll() is None
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (proc.returncode, err)
    assert f"tailrace: {sig.name}: stopping gracefully" in err
    assert "finished (stop)" in out and "0 messages processed" in out
    # the stop came before the run: nothing was processed, so nothing is skipped on restart
    again = _start(job, {})
    out, err = again.communicate(timeout=30)
    assert again.returncode == 0, err
    assert "10 messages processed" in out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_after_the_summary_keeps_the_exit_status(sig: signal.Signals, tmp_path: Path) -> None:
    job = write_job(tmp_path, task=SLOW_TASK, partitions=[[{"n": i} for i in range(10)]])
    proc = _start(job, {"SLOW_EXIT": "2"})
    assert proc.stdout is not None
    summary = proc.stdout.readline()
    assert "finished (end_of_stream)" in summary and "10 messages processed" in summary
    time.sleep(0.3)  # the summary is printed; the interpreter is exiting (slow atexit)
    assert proc.poll() is None
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (proc.returncode, err)
    assert "Traceback" not in err


def test_second_signal_forces_an_exit(tmp_path: Path) -> None:
    job = write_job(tmp_path, task=SLOW_TASK)
    marker = tmp_path / "importing"
    proc = _start(job, {"SLOW_IMPORT": "3", "IMPORTING": str(marker)})
    _wait_for(marker)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM again: forced stop, no final checkpoint" in err


LATE_SIGNAL_TASK = """
import os
import signal
import time

import tailrace


class _Late:
    # destroyed while the interpreter shuts down, after Python put the default handlers back
    def __del__(self):
        os.kill(os.getpid(), signal.SIG{name})
        time.sleep(0.2)


_late = _Late()


class Task(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("files.out", envelope.message)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_while_the_interpreter_shuts_down_keeps_the_exit_status(
    sig: signal.Signals, tmp_path: Path
) -> None:
    name = sig.name.removeprefix("SIG")
    job = write_job(
        tmp_path, task=LATE_SIGNAL_TASK.format(name=name), partitions=[[{"n": i} for i in range(3)]]
    )
    proc = _start(job, {})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (proc.returncode, err)  # not -2 / -15: killed by the late signal
    assert "3 messages processed" in out
