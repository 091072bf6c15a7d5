"""Delivery failures of Kafka outputs fail the container naming topic and partition,
before any checkpoint passes the undelivered output (rules 16, 18); a full producer
queue is backpressure instead (test_kafka_contract.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tailrace
from tailrace.errors import TailraceError
from tailrace.kafka import KafkaDeliveryError

from .test_kafka_contract import _items, _system


class SendTo(tailrace.StreamTask):
    """Sends every message to ``target`` (stream, partition), padded to ``size`` bytes."""

    target: tuple[str, int] = ("out", 0)
    size = 0

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        stream, partition = self.target
        value = {"i": envelope.message["i"], "pad": "x" * self.size}
        collector.send(f"kafka.{stream}", value, key=envelope.key, partition=partition)


def _run(cluster: Any, tmp_path: Path, target: tuple[str, int], size: int = 0, **producer: Any) -> Any:
    SendTo.target = (cluster.topics.get(target[0], target[0]), target[1])
    SendTo.size = size
    system = _system(cluster, bounded=True, producer=producer)
    store = tailrace.SqliteCheckpointStore(tmp_path / "ckpt.db")
    container = tailrace.Container(
        SendTo, inputs=[f"kafka.{cluster.topics['in']}"], systems=[system], checkpoints=store, job_name="j"
    )
    with pytest.raises(TailraceError) as e:
        container.run()
    check = tailrace.SqliteCheckpointStore(tmp_path / "ckpt.db")
    check.open("j")
    try:
        committed = check.load("Partition 0")
    finally:
        check.close()
    return e.value, committed


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = e
    while seen is not None and seen not in out:
        out.append(seen)
        seen = getattr(seen, "original", None) or seen.__cause__
    return out


def test_send_to_a_partition_the_topic_lacks_fails_naming_both(kafka_cluster: Any, tmp_path: Path) -> None:
    cluster = kafka_cluster({"in": 1, "out": 2})
    cluster.produce("in", _items(5, 1))
    error, committed = _run(cluster, tmp_path, ("out", 7))
    assert "'kafka.out' has no partition 7 (it has 2)" in str(error), error
    assert committed == {}


def test_send_to_a_missing_topic_fails_naming_it(kafka_cluster: Any, tmp_path: Path) -> None:
    cluster = kafka_cluster({"in": 1, "out": 2})
    cluster.produce("in", _items(5, 1))
    error, committed = _run(cluster, tmp_path, ("nosuch", 0))
    assert "no topic 'nosuch'" in str(error), error
    assert committed == {}


def test_message_over_message_max_bytes_fails_naming_topic_and_partition(
    kafka_cluster: Any, tmp_path: Path
) -> None:
    # refused by the client at once (MSG_SIZE_TOO_LARGE): a KafkaDeliveryError, not a bare KafkaException
    cluster = kafka_cluster({"in": 1, "out": 2})
    cluster.produce("in", _items(5, 1))
    error, committed = _run(cluster, tmp_path, ("out", 1), size=2_000_000)
    delivery = [e for e in _chain(error) if isinstance(e, KafkaDeliveryError)]
    assert delivery, error
    assert (delivery[0].topic, delivery[0].partition) == (cluster.topics["out"], 1)
    assert f"{cluster.topics['out']}[1]" in str(error) and "too large" in str(error), error
    assert committed == {}


def test_unacknowledged_output_fails_before_any_checkpoint(kafka_cluster: Any, tmp_path: Path) -> None:
    # rule 18 with outputs: a message the client accepts but the broker never acknowledges
    # (over the broker's size limit: Mokapi drops the request) fails the container at the
    # flush that precedes the checkpoint, naming topic and partition; nothing is committed
    cluster = kafka_cluster({"in": 1, "out": 2})
    cluster.produce("in", _items(5, 1))
    error, committed = _run(
        cluster,
        tmp_path,
        ("out", 1),
        size=1_500_000,
        **{"message.max.bytes": 10_000_000, "message.timeout.ms": 2000},
    )
    delivery = [e for e in _chain(error) if isinstance(e, KafkaDeliveryError)]
    assert delivery, error
    assert (delivery[0].topic, delivery[0].partition) == (cluster.topics["out"], 1), error
    assert f"delivery to {cluster.topics['out']}[1] failed" in str(delivery[0]), error
    assert committed == {}, committed
