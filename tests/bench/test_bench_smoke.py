"""Smoke test of the benchmark suite: it runs and writes the documented JSON (not speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--quick",
            "--workloads",
            "sync_noop_1task,sync_state_16tasks",
            "--engines",
            "python,floor",
            "--messages",
            "2000",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))

    machine = doc["machine"]
    for key in ("cpu", "cores", "python", "platform", "tailrace", "git_commit", "date"):
        assert key in machine, key
    assert isinstance(machine["cpu"], str) and machine["cpu"]
    assert isinstance(machine["cores"], int) and machine["cores"] >= 1
    assert machine["python"] == ".".join(map(str, sys.version_info[:3]))

    results = doc["results"]
    measured = {(r["workload"], r["engine"]) for r in results}
    assert measured == {
        ("sync_noop_1task", "python"),
        ("sync_noop_1task", "floor"),
        ("sync_state_16tasks", "python"),
        ("sync_state_16tasks", "floor"),
    }
    for r in results:
        assert set(r) == {"workload", "engine", "messages", "seconds", "msgs_per_s"}
        assert isinstance(r["messages"], int) and r["messages"] >= 2000
        assert isinstance(r["seconds"], float) and r["seconds"] > 0
        assert abs(r["msgs_per_s"] - r["messages"] / r["seconds"]) <= 1e-6 * r["msgs_per_s"]
    assert doc["errors"] == []

    # the printed table names every measured pair
    for workload, engine in measured:
        assert any(workload in line and engine in line for line in proc.stdout.splitlines())


def test_unknown_workload_is_rejected_by_name() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--workloads", "no_such_workload"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "no_such_workload" in proc.stderr


_FAILING_WORKLOAD = """
import sys
sys.path.insert(0, {bench!r})
import tailrace
import run
import workloads

class Fails(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        if envelope.offset == 500:
            raise ValueError("boom at 500")

workloads._register(workloads.Workload("fails_at_500", "raises on offset 500", Fails, floor=None))
sys.exit(run.main(["--workloads", "fails_at_500,sync_noop_1task", "--engines", "python",
                   "--messages", "1000", "--repeats", "1"]))
"""


def test_a_failing_run_is_reported_and_sets_the_exit_status(tmp_path: Path) -> None:
    script = tmp_path / "failing.py"
    script.write_text(_FAILING_WORKLOAD.format(bench=str(ROOT / "bench")), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ERROR: fails_at_500 on python" in proc.stdout
    assert "boom at 500" in proc.stdout
    # the other workload still ran and is in the table
    assert any(line.startswith("sync_noop_1task") and "python" in line for line in proc.stdout.splitlines())


def test_end_to_end_bench_runs_every_contender_and_checks_their_outputs(tmp_path: Path) -> None:
    """bench/e2e.py on a small input: the loop, the floor (a bare loop calling the job's own
    process), both engines and two containers each produce the same records (the bench itself
    refuses a difference) and the JSON holds their samples."""
    out = tmp_path / "e2e.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "e2e.py"),
            "--messages",
            "3000",
            "--users",
            "40",
            "--pairs",
            "1",
            "--libs",
            "std",
            "--engines",
            "c,python,c2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["messages"] == 3000
    assert set(doc["medians"]) == {"std/loop", "std/floor", "std/c", "std/python", "std/c2"}
    for row in doc["medians"].values():
        assert len(row["samples"]) == 1 and row["wall_s"] > 0 and row["cpu_s"] > 0


def test_end_to_end_bench_runs_bytewax_and_checks_its_output(tmp_path: Path) -> None:
    """bench/e2e.py --bytewax: bytewax's file connectors do the job and write the loop's records
    (the bench compares their values and each user's order); its flow was broken for as long as
    bytewax was not installed where the bench ran."""
    pytest.importorskip("bytewax")
    out = tmp_path / "e2e.json"
    argv = [sys.executable, str(ROOT / "bench" / "e2e.py"), "--messages", "2000", "--users", "40"]
    argv += ["--pairs", "1", "--libs", "std", "--engines", "c", "--bytewax", "--no-floor", "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert set(doc["medians"]) == {"std/loop", "std/c", "std/bytewax"}


def _e2e(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "e2e.json"
    argv = [
        sys.executable,
        str(ROOT / "bench" / "e2e.py"),
        "--messages",
        "3000",
        "--users",
        "40",
        "--pairs",
        "1",
    ]
    argv += ["--libs", "std", "--dir", str(tmp_path / "work"), "--json", str(out), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text(encoding="utf-8"))


def _last_totals(out: Path) -> dict[str, Any]:
    """Each user's last total in an output directory (its records are in seq order per user)."""
    totals: dict[str, Any] = {}
    for f in sorted(out.glob("partition-*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            m = json.loads(line)
            totals[m["user"]] = m["total"]
    return totals


def test_end_to_end_bench_runs_a_store_lane_beside_the_dict_lane(tmp_path: Path) -> None:
    """bench/e2e.py --state dict,store: the same Sums task keeping its sums in a state store
    writes the loop's records (the bench refuses a difference), its sums are the store's
    committed state, and the store job's CPU is reported against the dict job's."""
    proc, doc = _e2e(tmp_path, "--engines", "c,python", "--state", "dict,store")
    contenders = ("loop", "floor", "c", "python")
    assert set(doc["medians"]) == {f"{s}/std/{c}" for s in ("dict", "store") for c in contenders}
    for key, row in doc["medians"].items():
        state, lib, contender = key.split("/")
        assert row["lane"] == {"partitions": 4, "state": state, "amounts": "int", "lib": lib}
        assert row["contender"] == contender
        assert len(row["samples"]) == 1 and row["wall_s"] > 0 and row["cpu_s"] > 0
    ratios = {r["contender"]: r for r in doc["store_vs_dict"]}
    assert set(ratios) == {"c", "python"}
    for r in ratios.values():
        assert r["lane"] == {"partitions": 4, "amounts": "int", "lib": "std"}
        assert r["cpu_x_dict"] > 0 and r["wall_x_dict"] > 0
    assert sum("store CPU / dict CPU:" in line for line in proc.stdout.splitlines()) == 2

    # the store job declared the store and its committed state holds the loop's last totals
    work = tmp_path / "work"
    job = work / "job-store-std-c"
    assert "[stores.sums]" in (job / "job.toml").read_text(encoding="utf-8")
    assert 'context.store("sums")' in (job / "task.py").read_text(encoding="utf-8")
    assert "[stores" not in (work / "job-dict-std-c" / "job.toml").read_text(encoding="utf-8")
    totals = _last_totals(work / "out-store-std-loop")
    import tailrace

    store = tailrace.SqliteCheckpointStore(job / "state" / "checkpoints.db")
    store.open("e2e")
    try:
        committed = {}
        for p in range(4):  # user-u lives in partition u % 4, owned by task "Partition p"
            for k, v in store.state_scan(f"Partition {p}", "sums"):
                committed[json.loads(k)] = json.loads(v)
    finally:
        store.close()
    assert committed == totals and len(committed) == 40


def test_end_to_end_bench_runs_a_16_partition_float_lane(tmp_path: Path) -> None:
    """bench/e2e.py --partitions 16 --amounts float: 16 input partitions (4 output), amounts with
    two decimals; the loop, the floor and both engines write the same bytes (float totals)."""
    _, doc = _e2e(tmp_path, "--engines", "c,python", "--partitions", "16", "--amounts", "float")
    assert set(doc["medians"]) == {f"p16/float/std/{c}" for c in ("loop", "floor", "c", "python")}
    for row in doc["medians"].values():
        assert row["lane"] == {"partitions": 16, "state": "dict", "amounts": "float", "lib": "std"}
        assert len(row["samples"]) == 1 and row["wall_s"] > 0
    assert "store_vs_dict" not in doc
    work = tmp_path / "work"
    events = sorted(p.name for p in (work / "data-p16-float" / "events").iterdir())
    assert events == sorted(f"partition-{p}.jsonl" for p in range(16))
    out = work / "job-p16-float-std-c" / "output" / "out"
    assert sorted(p.name for p in out.iterdir()) == [f"partition-{p}.jsonl" for p in range(4)]
    totals = _last_totals(out)
    assert len(totals) == 40 and all(isinstance(t, float) for t in totals.values())
    assert any(t != int(t) for t in totals.values())
