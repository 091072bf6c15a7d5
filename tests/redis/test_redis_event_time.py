"""The event-time watermark committed in the Redis checkpoint store (SEMANTICS rule 33): a
restarted task resumes from at least its committed watermark. Both engines."""

from __future__ import annotations

from typing import Any

import pytest
from redis_support import RedisServer

from tailrace import Container, MemorySystem, Scope, StreamTask
from tailrace.container import EVENT_TIME_STORE
from tailrace.redis import RedisSystem
from tailrace.redis.checkpoint import RedisCheckpointStore
from tailrace.types import SystemStreamPartition


class Marks(StreamTask):
    def init(self, context: Any) -> None:
        self.context = context

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", [envelope.message["n"], self.context.watermark()])
        if envelope.message.get("stop"):
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_rule33_the_watermark_is_committed_and_resumed(redis_server: RedisServer, engine: str) -> None:
    stream = f"et-{engine}"
    ssp = SystemStreamPartition("redis", stream, 0)
    redis = RedisSystem("redis", redis_server.url)
    redis.create_stream(stream, 1)
    out = MemorySystem()
    config = {"task.timestamp.field": "t", "job.name": f"et-{engine}"}

    def run() -> None:
        store = RedisCheckpointStore(redis_server.url, inputs=[ssp])
        systems = [RedisSystem("redis", redis_server.url), out]
        c = Container(
            Marks,
            inputs=[f"redis.{stream}"],
            systems=systems,
            checkpoints=store,
            engine=engine,
            config=config,
        )
        c.run()

    redis.append(stream, 0, {"n": 0, "t": 7000, "stop": True})
    run()
    store = RedisCheckpointStore(redis_server.url, inputs=[ssp])
    store.open(f"et-{engine}")
    try:
        assert store.state_get("Partition 0", EVENT_TIME_STORE, b"watermark") == b"7000"
    finally:
        store.close()
    redis.append(stream, 0, {"n": 1, "t": 10, "stop": True})
    run()
    assert out.messages("out") == [[0, 7000], [1, 7000]]  # resumed: not back to 10


class Stamps(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", [envelope.offset, envelope.timestamp])


@pytest.mark.parametrize("engine", ["c", "python"])
def test_rule32_an_entrys_timestamp_is_its_ids_milliseconds(redis_server: RedisServer, engine: str) -> None:
    stream = f"ts-{engine}"
    redis = RedisSystem("redis", redis_server.url)
    redis.create_stream(stream, 1)
    for i in range(3):
        redis.append(stream, 0, {"i": i})
    redis.end_stream(stream)
    out = MemorySystem()
    ssp = SystemStreamPartition("redis", stream, 0)
    Container(
        Stamps,
        inputs=[f"redis.{stream}"],
        systems=[RedisSystem("redis", redis_server.url), out],
        checkpoints=RedisCheckpointStore(redis_server.url, inputs=[ssp]),
        engine=engine,
        config={"job.name": f"ts-{engine}"},
    ).run()
    got = out.messages("out")
    assert len(got) == 3
    for offset, timestamp in got:
        assert timestamp == int(offset.partition("-")[0])
