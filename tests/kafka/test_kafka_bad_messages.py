"""Bad messages on Kafka inputs (SEMANTICS rules 39, 40), both engines, against the mock
broker (or a real one, tests/kafka/conftest.py) with SQLite checkpoints: a record whose
key or value serde cannot decode under each ``task.error.policy``, dead letters to a
Kafka topic and to a file stream, compiled and with ``headers=True``."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

import tailrace
from tailrace import InputError, StreamTask, SystemStreamPartition
from tailrace.files import FileSystem, read_stream
from tailrace.kafka import KafkaCheckpointStore, KafkaRecord, KafkaSystem

from .conftest import Cluster

ENGINES = ["c", "python"]
JOB = "bad-records"
BAD_VALUE = b"{not json"
BAD_KEY = b"\xff\xfe"  # not UTF-8: the str key serde cannot decode it
BAD = {(0, 5), (0, 12)}  # (partition, offset): a bad value, a bad key
GOOD = [(p, i) for p in range(2) for i in range(20) if (p, i) not in BAD]


class Forward(StreamTask):
    """Sends each value on; raises on the one marked ``boom``."""

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        m = envelope.message
        m = m.value if isinstance(m, KafkaRecord) else m
        if m.get("boom"):
            raise ValueError(f"boom at {m['i']}")
        collector.send("kafka.out", m, key=envelope.key, partition=0)


def _cluster(kafka_cluster: Any, boom: tuple[int, int] | None = None) -> Cluster:
    """Topic ``in`` of two partitions of 20 records {"p", "i"} (partition p, offset i):
    offset 5 of partition 0 has a value that is not JSON, offset 12 a key that is not
    UTF-8; ``boom``: that record makes process raise."""
    cluster: Cluster = kafka_cluster({"in": 2, "out": 1, "dead": 1}, binary=("in", "dead"))
    items: list[tuple[int, Any, bytes | None]] = []
    for p in range(2):
        for i in range(20):
            value = {"p": p, "i": i, "boom": True} if (p, i) == boom else {"p": p, "i": i}
            raw = BAD_VALUE if (p, i) == (0, 5) else json.dumps(value).encode()
            items.append((p, BAD_KEY if (p, i) == (0, 12) else f"k{i}".encode(), raw))
    cluster.produce("in", items)
    return cluster


def _container(
    cluster: Cluster, engine: str, tmp_path: Path, *extra: Any, headers: bool = False, **config: Any
) -> tailrace.Container:
    system = KafkaSystem(
        "kafka", cluster.bootstrap, bounded=True, headers=headers, producer=cluster.producer_settings
    )
    store = KafkaCheckpointStore(tailrace.SqliteCheckpointStore(tmp_path / "ckpt.db"), {"kafka": system})
    return tailrace.Container(
        Forward,
        inputs=[f"kafka.{cluster.topics['in']}"],
        systems=[system, *extra],
        checkpoints=store,
        engine=engine,
        job_name=JOB,
        task_commit_ms=600000,
        **config,
    )


def _committed(cluster: Cluster, tmp_path: Path) -> dict[int, int]:
    store = tailrace.SqliteCheckpointStore(tmp_path / "ckpt.db")
    topic = cluster.topics["in"]
    return {
        ssp.partition: off
        for offsets in store.committed(JOB).values()
        for ssp, off in offsets.items()
        if ssp == SystemStreamPartition("kafka", topic, ssp.partition)
    }


def _out(cluster: Cluster) -> list[tuple[int, int]]:
    return sorted((m["p"], m["i"]) for m in cluster.json_values("out"))


@pytest.mark.parametrize("engine", ENGINES)
def test_fail_stops_at_an_undecodable_record_with_everything_before_it_committed(
    kafka_cluster: Any, engine: str, tmp_path: Path
) -> None:
    # rules 39, 40: the default policy stops the container with an InputError naming the
    # partition, the offset and the serdes; the partition's checkpoint is the record before it
    cluster = _cluster(kafka_cluster)
    with pytest.raises(InputError) as info:
        _container(cluster, engine, tmp_path).run()
    text = str(info.value)
    assert f"kafka.{cluster.topics['in']}[0]" in text and "offset 5 cannot be decoded" in text, text
    assert "'json'" in text and "task.error.policy" in text
    assert _committed(cluster, tmp_path)[0] == 4
    out = _out(cluster)
    assert (0, 4) in out and (0, 5) not in out


@pytest.mark.parametrize("headers", [False, True])
@pytest.mark.parametrize("engine", ENGINES)
def test_skip_counts_undecodable_records_and_processes_everything_else(
    kafka_cluster: Any, engine: str, headers: bool, tmp_path: Path
) -> None:
    cluster = _cluster(kafka_cluster)
    result = _container(cluster, engine, tmp_path, headers=headers, task_error_policy="skip").run()
    assert result.reason == "end_of_stream"
    assert _out(cluster) == GOOD
    assert result.tasks["Partition 0"].skipped == 2 and result.tasks["Partition 1"].skipped == 0
    assert _committed(cluster, tmp_path) == {0: 19, 1: 19}


@pytest.mark.parametrize("engine", ENGINES)
def test_dead_letters_of_undecodable_records_go_to_a_kafka_topic_with_their_bytes(
    kafka_cluster: Any, engine: str, tmp_path: Path
) -> None:
    # a process failure's dead letter holds the decoded value (Kafka keeps no bytes to read back)
    cluster = _cluster(kafka_cluster, boom=(1, 7))
    dead = f"kafka.{cluster.topics['dead']}"
    result = _container(
        cluster, engine, tmp_path, task_error_policy="dead-letter", task_error_stream=dead
    ).run()
    assert _out(cluster) == [x for x in GOOD if x != (1, 7)]
    letters = {(d["partition"], d["offset"]): d for d in cluster.json_values("dead")}
    assert sorted(letters) == [(0, 5), (0, 12), (1, 7)]
    for offset, raw, field in ((5, BAD_VALUE, "value"), (12, json.dumps({"p": 0, "i": 12}).encode(), "key")):
        d = letters[0, offset]
        assert (d["system"], d["stream"], d["key"]) == ("kafka", cluster.topics["in"], None)
        assert d["bytes"].encode() == raw and "value" not in d
        assert d["error"]["type"] == "tailrace.errors.InputError"
        assert f"offset {offset} cannot be decoded" in d["error"]["message"]
        assert f"its {field}" in d["error"]["message"]
    boom = letters[1, 7]
    assert boom["value"] == {"p": 1, "i": 7, "boom": True} and boom["key"] == "k7"
    assert boom["error"]["type"] == "ValueError" and __file__.rstrip("c") in boom["error"]["frame"]
    assert result.tasks["Partition 0"].dead_lettered == 2 and result.tasks["Partition 1"].dead_lettered == 1
    assert _committed(cluster, tmp_path) == {0: 19, 1: 19}


@pytest.mark.parametrize("engine", ENGINES)
def test_dead_letters_of_kafka_records_go_to_a_file_stream(
    kafka_cluster: Any, engine: str, tmp_path: Path
) -> None:
    # the error stream may be another system's; bytes that are not UTF-8 as bytes_base64
    cluster: Cluster = kafka_cluster({"in": 1, "out": 1}, binary=("in",))
    good = [json.dumps({"p": 0, "i": i}).encode() for i in range(3)]
    cluster.produce("in", [(0, b"k", good[0]), (0, b"k", b"\xff\x00"), (0, b"k", good[2])])
    files = FileSystem("files", tmp_path / "data")
    result = _container(
        cluster, engine, tmp_path, files, task_error_policy="dead-letter", task_error_stream="files.dead"
    ).run()
    assert result.reason == "end_of_stream"
    assert _out(cluster) == [(0, 0), (0, 2)]
    (letter,) = [d for part in read_stream(tmp_path / "data" / "dead") for d in part]
    assert (letter["stream"], letter["partition"], letter["offset"]) == (cluster.topics["in"], 0, 1)
    assert base64.b64decode(letter["bytes_base64"]) == b"\xff\x00"
    assert letter["error"]["type"] == "tailrace.errors.InputError"
    assert _committed(cluster, tmp_path) == {0: 2}
