"""Fencing of Kafka checkpoints in the store path (rule 28), without a broker: a
member's KafkaCheckpointStore over the real stores (SQLite, and a real redis-server
with the leases a Kafka member holds). The group-driven losses themselves are
exercised against Mokapi in test_kafka_cli.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import tailrace
from tailrace.errors import FencedError
from tailrace.kafka import KafkaCheckpointStore, KafkaSystem
from tailrace.types import SystemStreamPartition

P0 = SystemStreamPartition("kafka", "in", 0)
P1 = SystemStreamPartition("kafka", "in", 1)


def _system() -> KafkaSystem:
    return KafkaSystem("kafka", "127.0.0.1:1")  # never contacted: no consumer, no group commit


def test_sqlite_commit_refused_for_a_partition_the_member_lost(tmp_path: Path) -> None:
    # rule 28: once the group revoked or lost a partition, neither its offset nor its
    # state can be written; what was committed before stays
    owned = {P0, P1}
    inner = tailrace.SqliteCheckpointStore(tmp_path / "ckpt.db")
    store = KafkaCheckpointStore(inner, {"kafka": _system()}, owned=lambda: set(owned))
    store.open("job")
    try:
        store.write("Partition 0", {P0: 10}, {"counts": {b"k": b"1"}})
        store.write("Partition 1", {P1: 20})
        owned.discard(P0)  # what the member's on_lost / on_revoke does first
        with pytest.raises(FencedError) as e:
            store.write("Partition 0", {P0: 11}, {"counts": {b"k": b"2"}})
        assert "kafka.in[0]" in str(e.value) and "no longer owns" in str(e.value)
        store.write("Partition 1", {P1: 21})  # the partition it still owns commits as before
        assert store.load("Partition 0") == {P0: 10}
        assert store.state_get("Partition 0", "counts", b"k") == b"1"
        assert store.load("Partition 1") == {P1: 21}
    finally:
        store.close()


def test_sqlite_commit_refused_for_a_partition_lost_while_the_group_answered(tmp_path: Path) -> None:
    # rule 28: a group commit's answer can take seconds (a coordinator that is gone answers
    # at the session timeout, with an error that fences nothing); a partition lost meanwhile
    # is not written either
    owned = {P0}

    class SlowGroup(KafkaSystem):
        def commit_group(self, offsets: object) -> None:
            owned.discard(P0)  # the lost callback ran on the fetch thread meanwhile

    inner = tailrace.SqliteCheckpointStore(tmp_path / "ckpt.db")
    slow = SlowGroup("kafka", "127.0.0.1:1")
    store = KafkaCheckpointStore(inner, {"kafka": slow}, owned=lambda: set(owned))
    store.open("job")
    try:
        with pytest.raises(FencedError) as e:
            store.write("Partition 0", {P0: 11}, {"counts": {b"k": b"2"}})
        assert "no longer owns" in str(e.value)
        assert store.load("Partition 0") == {}
        assert store.state_get("Partition 0", "counts", b"k") is None
    finally:
        store.close()


def test_redis_commit_refused_with_a_stale_lease(redis_url: str) -> None:
    # rule 28 across machines: member a still believes it owns P0 (the group has not told
    # it yet: it was paused), but its Redis lease expired and member b took the partition
    # with a newer token; a's write of offsets and state is refused, b's goes through,
    # and the Kafka offset is kept as the entry id "0-N" and read back as N
    from tailrace.redis._io import connect
    from tailrace.redis.checkpoint import Leases, RedisCheckpointStore

    client = connect(redis_url)
    store_keys = RedisCheckpointStore(redis_url, client=client).keys
    a = Leases(client, store_keys, "job", "a", 200)
    b = Leases(client, store_keys, "job", "b", 10000)
    assert a.acquire(P0)

    def member_store(leases: Leases) -> KafkaCheckpointStore:
        inner = RedisCheckpointStore(redis_url, client=client, leases=leases.held())
        return KafkaCheckpointStore(inner, {"kafka": _system()}, owned=lambda: {P0}, redis_ids=True)

    store_a = member_store(a)
    store_a.open("job")
    store_a.write("Partition 0", {P0: 5}, {"counts": {b"k": b"a"}})
    deadline = time.monotonic() + 10
    while not b.acquire(P0):  # a's lease expires (a never renews: it is "paused")
        assert time.monotonic() < deadline, "a's lease never expired"
        time.sleep(0.05)
    store_b = member_store(b)
    store_b.open("job")
    assert store_b.load("Partition 0") == {P0: 5}
    with pytest.raises(FencedError) as e:
        store_a.write("Partition 0", {P0: 9}, {"counts": {b"k": b"stale"}})
    assert "kafka.in[0]" in str(e.value)
    with pytest.raises(FencedError):
        store_a.write("Partition 0", {P0: 9})
    store_b.write("Partition 0", {P0: 7}, {"counts": {b"k": b"b"}})
    fresh = member_store(b)
    fresh.open("job")
    assert fresh.load("Partition 0") == {P0: 7}
    assert fresh.state_get("Partition 0", "counts", b"k") == b"b"
    assert client.get(store_keys.checkpoint("in", 0, "job")) == b"0-7"
    for s in (store_a, store_b, fresh):
        s.close()
    b.release_all()
    client.close()
