"""One Kafka member in its own process (the kill -9 test): reads TOPIC, sends each
message on to OUT, checkpoints in SQLite. Usage: member_main.py BOOTSTRAP TOPIC OUT DB"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import tailrace
from tailrace.kafka import KafkaMemberSpec, KafkaSystem, run_kafka_member


class Forward(tailrace.StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        time.sleep(0.005)  # slow enough to be killed mid-stream
        collector.send(f"kafka.{sys.argv[3]}", envelope.message, key=envelope.key, partition=0)


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    bootstrap, topic, _out, db = sys.argv[1:5]
    system = KafkaSystem("kafka", bootstrap, producer={"enable.idempotence": False})
    spec = KafkaMemberSpec(
        Forward,
        inputs=[f"kafka.{topic}"],
        systems=[system],
        checkpoints=tailrace.SqliteCheckpointStore(db),
        config={"job.name": "kill-job", "task.commit.ms": 100},
    )
    run_kafka_member(spec)


if __name__ == "__main__":
    main()
