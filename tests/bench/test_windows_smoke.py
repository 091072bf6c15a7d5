"""Smoke test of bench/windows.py: on a tiny input every contender that can run here writes the
same windows (the script exits non-zero otherwise) and the documented JSON. Not speed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "windows.py"
sys.path.insert(0, str(ROOT / "bench"))
import windows  # noqa: E402  bench/windows.py


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_contenders_agree_on_a_tiny_input(tmp_path: Path) -> None:
    engine = "c" if _has("tailrace.engine.native") else "python"
    out = tmp_path / "windows.json"
    proc = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--events", "5000", "--rounds", "1"),
            *("--engine", engine, "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    expected = {"floor", "hand"}
    if _has("bytewax"):
        expected.add("bytewax")
    else:
        assert "bytewax: skipped" in proc.stderr
    if _has("tailrace.windows"):
        expected.add("windows")
        assert "windows CPU / hand CPU" in doc["ratios"]
    else:
        assert "windows: skipped" in proc.stderr
    assert set(doc["medians"]) == expected
    assert doc["events"] == 5000 and doc["windows"] > 0
    assert "results equal across contenders" in proc.stdout


def test_results_refuse_a_window_sent_twice_and_see_a_changed_sum(tmp_path: Path) -> None:
    rec = {"key": "u1", "start": 0, "end": 60_000, "value": [2, 30], "final": True}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "partition-0.jsonl").write_text(json.dumps(rec) + "\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "partition-0.jsonl").write_text(json.dumps({**rec, "value": [2, 31]}) + "\n")
    assert windows.results(tmp_path / "a")[1] == 1
    assert windows.results(tmp_path / "a") != windows.results(tmp_path / "b")
    (tmp_path / "a" / "partition-1.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(SystemExit, match="sent twice"):
        windows.results(tmp_path / "a")


def test_the_generator_refuses_disorder_beyond_the_lag(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="is late"):
        windows.generate(tmp_path / "events", 20_000, 100, rate=1_000, disorder=20_000)
