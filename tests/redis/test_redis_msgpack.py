"""The msgpack codec of the Redis system (tailrace.serdes' msgpack): a producer's entries
read back by a reader with their keys, bytes and nested values intact, and the raw entry
is msgpack on the wire."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from redis_support import RedisServer

from tailrace import SystemStreamPartition
from tailrace.errors import ConfigError
from tailrace.redis.system import RedisSystem

msgpack = pytest.importorskip("msgpack")


def test_msgpack_entries_round_trip_through_producer_and_reader(redis_server: RedisServer) -> None:
    system = RedisSystem("redis", redis_server.url, codec="msgpack", batch=100, output_partitions=2)
    system.create_stream("out", 2)
    producer = system.producer()
    sent = [{"n": i, "blob": bytes([i, 255]), "nested": [i, {"é": None}]} for i in range(30)]
    for i, m in enumerate(sent):
        producer.send("out", i % 2, f"k{i}", m)
    producer.flush()
    system.end_stream("out")
    raw = system.client.xrange(system.keys.stream("out", 0), count=1)[0][1]
    assert msgpack.unpackb(raw[b"m"], raw=False) == sent[0]  # msgpack on the wire, not JSON
    reader = system.reader(SystemStreamPartition("redis", "out", 1))
    woken = threading.Event()
    reader.start(None, woken.set)
    got: list[Any] = []
    deadline = time.monotonic() + 10
    while not reader.at_end() and time.monotonic() < deadline:
        batch = reader.poll(7)
        if not batch:
            woken.wait(0.5)
            woken.clear()
        got.extend(batch)
    reader.close()
    assert [(e.key, e.message) for e in got] == [(f"k{i}", sent[i]) for i in range(1, 30, 2)]
    system.close()


def test_unknown_codec_lists_msgpack(redis_server: RedisServer) -> None:
    with pytest.raises(ConfigError, match="msgpack"):
        RedisSystem("redis", redis_server.url, codec="protobuf")


def test_a_value_msgpack_cannot_take_is_a_type_error_and_changes_nothing(redis_server: RedisServer) -> None:
    system = RedisSystem("redis", redis_server.url, codec="msgpack", output_partitions=1)
    system.create_stream("out", 1)
    producer = system.producer()
    producer.send("out", 0, None, {"ok": 1})
    with pytest.raises(TypeError, match="msgpack"):
        producer.send("out", 0, None, object())
    producer.flush()
    assert [m for _, _, m in system.read_all("out", 0)] == [{"ok": 1}]
    producer.close()
    system.close()
