"""Smoke test of bench/memory_flat.py: it runs, loses nothing, writes the documented JSON.

Not the memory threshold nor speed: those are measurements, noisy on a shared machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "memory_flat.py"

RUN_KEYS = {
    "task",
    "engine",
    "messages",
    "processed",
    "completed",
    "seconds",
    "msgs_per_s",
    "reason",
    "order_errors",
    "first_errors",
    "committed_ok",
    "commits",
    "checkpoint_history",
    "no_loss",
    "rss_start_mib",
    "rss_warmup_mib",
    "rss_max_after_mib",
    "rss_end_mib",
    "growth_mib",
    "growth_pct",
    "blocks_warmup",
    "blocks_max_after",
    "gc_objects_warmup",
    "gc_objects_max_after",
    "memory_flat",
    "samples",
}


def _engines() -> list[str]:
    engines = ["python"]
    try:
        import tailrace.engine.native  # noqa: F401
    except ImportError:
        return engines
    return ["c", *engines]


@pytest.mark.parametrize("engine", _engines())
def test_small_run_loses_nothing_and_writes_the_documented_json(tmp_path: Path, engine: str) -> None:
    messages = 200_000 if engine == "c" else 50_000
    out = tmp_path / "memflat.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--messages",
            str(messages),
            "--engine",
            engine,
            "--task",
            "sync,async",
            "--partitions",
            "3",
            "--capacity",
            "500",
            "--commit-ms",
            "20",
            "--history-limit",
            "10",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["no_loss"] is True
    assert isinstance(doc["memory_flat"], bool)
    assert doc["settings"]["messages"] == messages and doc["settings"]["engine"] == engine
    for key in ("cpu", "cores", "python", "platform", "git_commit", "date"):
        assert key in doc["machine"], key

    runs = doc["runs"]
    assert [r["task"] for r in runs] == ["sync", "async"]
    for r in runs:
        assert set(r) == RUN_KEYS
        assert r["engine"] == engine
        assert r["messages"] == r["processed"] == r["completed"] == messages
        assert r["order_errors"] == 0 and r["first_errors"] == []
        assert r["committed_ok"] is True and r["reason"] == "end_of_stream"
        assert r["no_loss"] is True
        assert r["commits"] >= 1
        assert r["checkpoint_history"] < 20  # history_limit 10: bounded
        assert r["rss_warmup_mib"] > 0 and r["rss_max_after_mib"] >= r["rss_warmup_mib"]
        assert r["growth_mib"] == pytest.approx(r["rss_max_after_mib"] - r["rss_warmup_mib"])
        assert r["msgs_per_s"] == pytest.approx(r["processed"] / r["seconds"])
        assert r["samples"] and all(len(s) == 2 for s in r["samples"])
        assert r["samples"][-1][0] == messages  # the last sample is taken after the run
        # the verdict line names this run
        verdicts = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"memory flat ({r['task']}")]
        assert len(verdicts) == 1 and "no loss" in verdicts[0], proc.stdout


_DROPPING = """
import sys
sys.path.insert(0, {bench!r})
import memory_flat

_check = memory_flat._Checker.check

def check(self, envelope):
    if envelope.partition == 1 and envelope.offset == 700:
        return  # a message the task never sees as far as the checker knows: "lost"
    _check(self, envelope)

memory_flat._Checker.check = check
sys.exit(memory_flat.main(["--messages", "3000", "--engine", "python", "--json", {out!r}]))
"""


def test_a_lost_message_fails_the_run(tmp_path: Path) -> None:
    script = tmp_path / "dropping.py"
    out = tmp_path / "memflat.json"
    script.write_text(_DROPPING.format(bench=str(ROOT / "bench"), out=str(out)), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "LOSS/ORDER FAILURE" in proc.stdout
    assert "partition 1: got offset 701" in proc.stdout
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["no_loss"] is False and doc["runs"][0]["processed"] == 2999


def test_the_monitor_keeps_bounded_state_over_a_long_run() -> None:
    """The monitor must not grow itself (an unbounded sample list reads as a leak)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import memory_flat
    finally:
        sys.path.remove(str(ROOT / "bench"))
    count = [0]

    def processed() -> int:
        count[0] += 100
        return count[0]

    mon = memory_flat.Monitor(processed, warm_n=1000, every_s=1.0)
    longest = 0
    for _ in range(20_000):
        mon.sample(False)
        longest = max(longest, len(mon.series))
    mon.sample(True)
    assert longest <= memory_flat.Monitor.SERIES
    series = [s.messages for s in mon.series]
    assert series == sorted(series) and series[0] == 100 and len(series) >= memory_flat.Monitor.SERIES // 2
    assert mon.last is not None and mon.last.messages == 20_001 * 100
    assert mon.warm is not None and mon.warm.messages == 1000  # first sample at the end of warm-up
    assert mon.gc_warm is not None and mon.gc_warm == mon.gc_max_after  # one gc sample, after warm-up
