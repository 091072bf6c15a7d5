"""The Kafka backend: topics as a system, checkpoints mirrored to the consumer
group, and job membership through Kafka's group protocol.

- ``system``: :class:`KafkaSystem` (topics as partitioned inputs and outputs),
  :class:`KafkaRecord` (messages with headers), :class:`KafkaDeliveryError`;
- ``checkpoint``: :class:`KafkaCheckpointStore` (the job's store, fenced by group
  ownership, with the low watermark also committed to the Kafka group);
- ``membership``: :class:`KafkaMember` / :func:`run_kafka_member` (several
  containers sharing a job's partitions).

Needs the ``kafka`` extra (``pip install 'tailrace[kafka]'``). See docs/kafka.md.
"""

from __future__ import annotations

from .checkpoint import KafkaCheckpointStore
from .membership import KafkaMember, KafkaMemberResult, KafkaMemberSpec, run_kafka_member
from .system import KafkaDeliveryError, KafkaRecord, KafkaSystem

__all__ = [
    "KafkaCheckpointStore",
    "KafkaDeliveryError",
    "KafkaMember",
    "KafkaMemberResult",
    "KafkaMemberSpec",
    "KafkaRecord",
    "KafkaSystem",
    "run_kafka_member",
]
