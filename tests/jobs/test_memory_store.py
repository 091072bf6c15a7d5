"""The in-memory checkpoint store: its commit history stays bounded on long runs (issue 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tailrace import Container, MemorySystem, StreamTask
from tailrace.errors import ConfigError
from tailrace.jobfile import load_job
from tailrace.memory import MemoryCheckpointStore
from tailrace.types import SystemStreamPartition as SSP

A0 = SSP("mem", "a", 0)
A1 = SSP("mem", "a", 1)


def _write_offsets(store: MemoryCheckpointStore, n: int) -> None:
    store.open("job")
    for i in range(n):
        store.write(f"Partition {i % 2}", {A0 if i % 2 == 0 else A1: i})


def test_history_keeps_the_latest_writes_in_order_and_stays_bounded() -> None:
    store = MemoryCheckpointStore(history_limit=100)
    longest = 0
    store.open("job")
    for i in range(10_000):
        store.write(f"Partition {i % 2}", {A0 if i % 2 == 0 else A1: i})
        longest = max(longest, len(store.history))
    assert longest < 200
    assert len(store.history) >= 100
    # the kept entries are the newest writes, oldest first, none skipped
    kept = [offsets for _, offsets in store.history]
    first = 10_000 - len(kept)
    assert kept == [{A0 if i % 2 == 0 else A1: i} for i in range(first, 10_000)]
    # trimming the history never touches the checkpoints themselves
    assert store.load("Partition 0") == {A0: 9998}
    assert store.load("Partition 1") == {A1: 9999}


def test_default_history_is_bounded_and_none_keeps_everything_and_zero_nothing() -> None:
    default = MemoryCheckpointStore()
    assert default.history_limit is not None
    _write_offsets(default, 5 * default.history_limit)
    assert default.history_limit <= len(default.history) < 2 * default.history_limit

    unbounded = MemoryCheckpointStore(history_limit=None)
    _write_offsets(unbounded, 5000)
    assert len(unbounded.history) == 5000

    none = MemoryCheckpointStore(history_limit=0)
    _write_offsets(none, 50)
    assert none.history == []
    assert none.committed("job") == {A0: 48, A1: 49}


def test_negative_history_limit_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="history_limit"):
        MemoryCheckpointStore(history_limit=-1)


@pytest.mark.parametrize("value", [-1, "10", 2.5, True])
def test_a_bad_history_limit_is_a_config_error_naming_it_from_python_and_the_job_file(
    tmp_path: Path, value: Any
) -> None:
    # docs/python-jobs.md: the keywords are the job file's keys, with the same checks and
    # messages; a str gave a TypeError from a comparison, -1 a raw traceback from the job file
    expected = (
        f"expected an integer >= 0 or None, got {value!r} (allowed: an integer >= 0 (0 records "
        "no write), or None (records every write))"
    )
    with pytest.raises(ConfigError) as e:
        MemoryCheckpointStore(history_limit=value)
    assert str(e.value) == f"config key 'history_limit': {expected}"
    job = tmp_path / "job.toml"
    toml_value = json.dumps(value)  # TOML spells these as JSON does
    job.write_text(
        '[job]\nname = "j"\ntask = "t.py:T"\ninputs = ["mem.a"]\n[systems.mem]\ntype = "memory"\n'
        f'[checkpoints]\ntype = "memory"\nhistory_limit = {toml_value}\n'
    )
    with pytest.raises(ConfigError) as e:
        load_job(job)
    assert str(e.value) == f"{job}: config key 'checkpoints.history_limit': {expected}"


class _CommitEach(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        coordinator.commit()


def test_a_job_committing_every_message_keeps_a_bounded_history(engine: str) -> None:
    n = 600
    system = MemorySystem("mem").add_stream("a", [list(range(n))])
    store = MemoryCheckpointStore(history_limit=50)
    result = Container(
        _CommitEach, inputs=["mem.a"], systems=[system], checkpoints=store, engine=engine
    ).run()
    assert result.processed == n
    assert sum(t.commits for t in result.tasks.values()) >= 100  # the bound was reached
    assert result.committed == {A0: n - 1}
    assert 50 <= len(store.history) < 100
    offsets = [o[A0] for _, o in store.history]
    assert offsets == sorted(offsets) and offsets[-1] == n - 1
