"""Exactly-once file outputs (rule 41) piece by piece, and the start-up refusals of every
system or store that cannot give the guarantee (both engines where a job runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tailrace import Container, MemoryCheckpointStore, MemorySystem
from tailrace.errors import CheckpointError, ConfigError
from tailrace.files import FileSystem, read_stream, write_stream
from tailrace.files.reader import FileReader
from tailrace.files.streams import committed_file, publish_committed
from tailrace.interfaces import CheckpointStore, PartitionReader, Producer, System
from tailrace.sqlite import SqliteCheckpointStore
from tailrace.types import SystemStreamPartition

EO = {"task.output.guarantee": "exactly-once"}


class Copy:
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        collector.send("files.out", envelope.message)


def _job(root: Path, records: int = 5) -> FileSystem:
    write_stream(root / "in", [[{"i": i} for i in range(records)]])
    return FileSystem("files", root)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_the_tail_of_a_commit_that_never_happened_is_cut_before_anything_runs(
    engine: str, tmp_path: Path
) -> None:
    db = tmp_path / "ck.db"
    Container(
        Copy,
        inputs=["files.in"],
        systems=[_job(tmp_path)],
        checkpoints=SqliteCheckpointStore(db),
        engine=engine,
        **EO,
    ).run()
    out = tmp_path / "out" / "partition-0.jsonl"
    committed = out.read_bytes()
    assert committed_file(out).read_text() == f"{len(committed)}\n"
    # a commit's records appended and fsynced, then the process killed before its transaction
    with open(out, "ab") as f:
        f.write(b'{"i":99}\n{"i":')
    c = Container(
        Copy,
        inputs=["files.in"],
        systems=[_job(tmp_path)],
        checkpoints=SqliteCheckpointStore(db),
        engine=engine,
        **EO,
    )
    plan = c.plan()
    try:
        assert out.read_bytes() == committed  # cut at start-up
    finally:
        plan.close()
    assert read_stream(tmp_path / "out") == [[{"i": i} for i in range(5)]]


def test_a_file_shorter_than_its_committed_length_stops_the_job(tmp_path: Path) -> None:
    db = tmp_path / "ck.db"
    Container(
        Copy, inputs=["files.in"], systems=[_job(tmp_path)], checkpoints=SqliteCheckpointStore(db), **EO
    ).run()
    out = tmp_path / "out" / "partition-0.jsonl"
    out.write_bytes(out.read_bytes()[:-9])
    with pytest.raises(CheckpointError, match=r"fewer than the \d+ committed"):
        Container(
            Copy, inputs=["files.in"], systems=[_job(tmp_path)], checkpoints=SqliteCheckpointStore(db), **EO
        ).run()


def test_a_reader_of_an_exactly_once_output_stops_at_its_committed_length(tmp_path: Path) -> None:
    # a chained job reads committed records only: what lies past the published length is a
    # commit in progress (or one a crash cut short), which the producing job cuts or completes
    d = tmp_path / "s"
    d.mkdir()
    path = d / "partition-0.jsonl"
    lines = [json.dumps({"i": i}).encode() + b"\n" for i in range(6)]
    path.write_bytes(b"".join(lines))
    publish_committed(path, len(lines[0]) * 3)
    reader = FileReader(SystemStreamPartition("f", "s", 0), path, "jsonl")
    reader.start(None, lambda: None)
    got = [e.message["i"] for e in reader.poll(100)]
    assert got == [0, 1, 2] and reader.at_end() and reader.poll(100) == []
    reader.close()
    assert read_stream(d) == [[{"i": 0}, {"i": 1}, {"i": 2}]]
    publish_committed(path, len(lines[0]) * 5)  # the next commit: read on from there
    reader = FileReader(SystemStreamPartition("f", "s", 0), path, "jsonl")
    reader.start(None, lambda: None)
    assert [e.message["i"] for e in reader.poll(2)] == [0, 1]
    publish_committed(path, len(lines[0]) * 6)
    assert [e.message["i"] for e in reader.poll(100)] == [2, 3, 4, 5]
    reader.close()


class _NoMarks(CheckpointStore):
    """A store that keeps offsets but no output lengths."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def open(self, job_name: str) -> None:
        pass

    def load(self, task_name: str) -> dict[SystemStreamPartition, Any]:
        return {}

    def write(self, task_name: str, offsets: Any, state: Any = None, outputs: Any = None) -> None:
        self.data[task_name] = offsets


def test_file_outputs_with_a_store_that_keeps_no_output_lengths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        Container(Copy, inputs=["files.in"], systems=[_job(tmp_path)], checkpoints=_NoMarks(), **EO).run()
    assert e.value.key == "task.output.guarantee" and "_NoMarks" in str(e.value)
    assert not (tmp_path / "out").exists()  # refused before anything ran


class _Plain(System):
    """A system with no exactly-once support (the interfaces' default)."""

    def partitions(self, stream: str) -> int:
        return 1

    def reader(self, ssp: SystemStreamPartition) -> PartitionReader:
        raise AssertionError("never read")

    def producer(self) -> Producer:
        class P(Producer):
            def partitions(self, stream: str) -> int:
                return 1

            def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
                raise AssertionError("never sent")

        return P()


def test_a_system_that_cannot_hold_its_outputs_is_refused_at_start_up_by_name() -> None:
    mem = MemorySystem("mem").add_stream("in", [[1]])
    with pytest.raises(ConfigError) as e:
        Container(Copy, inputs=["mem.in"], systems=[mem, _Plain("plain")], **EO).run()
    assert e.value.key == "task.output.guarantee"
    assert "system 'plain' (_Plain) cannot give exactly-once outputs" in str(e.value)
    # and without it, the memory system gives it with the memory store
    Container(Copy, inputs=["mem.in"], systems=[mem], checkpoints=MemoryCheckpointStore(), **EO)


def test_a_job_with_a_kafka_system_refuses_the_guarantee_saying_why_and_what_instead() -> None:
    pytest.importorskip("confluent_kafka")
    from tailrace.kafka import KafkaSystem

    mem = MemorySystem("mem").add_stream("in", [[1]])
    kafka = KafkaSystem("kafka", bootstrap_servers="127.0.0.1:1")
    try:
        with pytest.raises(ConfigError) as e:
            Container(Copy, inputs=["mem.in"], systems=[mem, kafka], **EO).run()
    finally:
        kafka.close()
    text = str(e.value)
    assert e.value.key == "task.output.guarantee"
    assert "Kafka system 'kafka' cannot give exactly-once outputs" in text
    assert "send_offsets_to_transaction" in text and "at-least-once" in text and "files" in text
