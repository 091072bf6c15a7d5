"""The Redis system, the fenced checkpoint store and one member, in process."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from redis_support import RedisServer

from tailrace import CheckpointError, Container, InputError, StreamTask, SystemStreamPartition
from tailrace.errors import FencedError
from tailrace.redis.checkpoint import Leases, RedisCheckpointStore
from tailrace.redis.membership import MemberSpec, run_member
from tailrace.redis.system import RedisSystem
from tailrace.types import BadInput

SSP0 = SystemStreamPartition("redis", "in", 0)


def fill(
    system: RedisSystem, stream: str, partitions: int, per_partition: int, *, end: bool = True
) -> dict[int, list[str]]:
    """Append {"p": p, "i": i} messages; returns the entry ids per partition."""
    system.create_stream(stream, partitions)
    ids: dict[int, list[str]] = {}
    pipe = system.client.pipeline(transaction=False)
    for p in range(partitions):
        for i in range(per_partition):
            pipe.xadd(system.keys.stream(stream, p), {"m": f'{{"p":{p},"i":{i}}}'})
    replies = pipe.execute()
    for p in range(partitions):
        ids[p] = [r.decode() for r in replies[p * per_partition : (p + 1) * per_partition]]
    if end:
        system.end_stream(stream)
    return ids


def test_reader_resumes_after_the_committed_id_and_stops_at_the_end_marker(redis_server: RedisServer) -> None:
    system = RedisSystem("redis", redis_server.url, batch=7, buffer=10)
    ids = fill(system, "in", 1, 50)[0]
    reader = system.reader(SSP0)
    woken = threading.Event()
    reader.start(ids[19], woken.set)  # rule 13: resume at the message after the committed offset
    got: list[Any] = []
    deadline = time.monotonic() + 10
    while not reader.at_end() and time.monotonic() < deadline:
        batch = reader.poll(4)
        assert len(batch) <= 4
        if not batch:
            woken.wait(0.5)
            woken.clear()
        got.extend(batch)
    reader.close()
    assert reader.at_end()
    assert [e.offset for e in got] == ids[20:]
    assert [e.message for e in got] == [{"p": 0, "i": i} for i in range(20, 50)]
    system.close()


def test_producer_flush_makes_entries_readable_and_keys_round_trip(redis_server: RedisServer) -> None:
    system = RedisSystem("redis", redis_server.url, batch=1000, output_partitions=3)
    producer = system.producer()
    assert producer.partitions("out") == 3
    for i in range(10):
        producer.send("out", i % 3, f"k{i}", {"n": i})
    assert system.read_all("out", 0) == []  # buffered until flush or a full batch
    producer.flush()
    assert [(k, m) for _, k, m in system.read_all("out", 1)] == [(f"k{i}", {"n": i}) for i in (1, 4, 7)]
    system.close()


def test_readers_of_one_system_share_one_fetcher_and_a_full_buffer_holds_back_only_its_partition(
    redis_server: RedisServer,
) -> None:
    system = RedisSystem("redis", redis_server.url, batch=5, buffer=10)
    ids = fill(system, "in", 4, 40)
    woken = threading.Event()
    readers = [system.reader(SystemStreamPartition("redis", "in", p)) for p in range(4)]
    for r in readers:
        r.start(None, woken.set)
    threads = [t for t in threading.enumerate() if t.name.startswith("tailrace-redis-read")]
    assert len(threads) == 1  # one XREAD loop for all four partitions
    got: dict[int, list[Any]] = {p: [] for p in range(4)}
    deadline = time.monotonic() + 20
    # drain the partitions one after another: the others sit with full buffers meanwhile
    for p, r in enumerate(readers):
        while not r.at_end() and time.monotonic() < deadline:
            batch = r.poll(3)
            if not batch:
                woken.wait(0.2)
                woken.clear()
            got[p].extend(batch)
        for q in range(p + 1, 4):
            assert readers[q]._count <= 10  # bounded while nobody polls it
    for r in readers:
        r.close()
    assert not any(t.is_alive() for t in threads)
    for p in range(4):
        assert [e.offset for e in got[p]] == ids[p]  # in order, nothing lost or repeated
        assert [e.message for e in got[p]] == [{"p": p, "i": i} for i in range(40)]
    system.close()


def test_reader_decodes_keys_and_yields_an_undecodable_entry_in_its_place_and_reads_on(
    redis_server: RedisServer,
) -> None:
    # rule 39: an entry the codec cannot decode is an envelope whose message is a BadInput
    # naming the entry, the partition and the codec, holding the entry's bytes; the entries
    # after it are read on (the fetcher goes on after its id)
    system = RedisSystem("redis", redis_server.url, batch=100)
    system.create_stream("in", 2)
    good = [system.append("in", 0, {"i": i}, key=f"k{i}") for i in range(3)]
    bad = system.client.xadd(system.keys.stream("in", 0), {"m": b"{not json"}).decode()
    after = system.append("in", 0, {"i": 4})
    for i in range(5):
        system.append("in", 1, {"i": i}, key=i)
    system.end_stream("in")
    woken = threading.Event()
    readers = [system.reader(SystemStreamPartition("redis", "in", p)) for p in range(2)]
    for r in readers:
        r.start(None, woken.set)
    got: dict[int, list[Any]] = {0: [], 1: []}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(r.at_end() for r in readers):
        for p, r in enumerate(readers):
            got[p] += r.poll(10)
        woken.wait(0.1)
        woken.clear()
    for r in readers:
        r.close()
    assert [e.offset for e in got[0]] == [*good, bad, after]
    assert [(e.key, e.message) for e in got[0][:3]] == [(f"k{i}", {"i": i}) for i in range(3)]
    env = got[0][3]
    assert isinstance(env.message, BadInput) and env.key is None and env.message.raw == b"{not json"
    error = env.message.error
    assert isinstance(error, InputError)
    assert bad in str(error) and "redis.in[0]" in str(error) and "'json'" in str(error), str(error)
    assert readers[0].raw(bad) == b"{not json" and readers[0].raw(after) == b'{"i":4}'
    assert got[0][4].message == {"i": 4}
    assert [(e.key, e.message) for e in got[1]] == [(i, {"i": i}) for i in range(5)]
    system.close()


def test_producer_writes_every_partition_in_one_call_and_survives_a_script_flush(
    redis_server: RedisServer,
) -> None:
    system = RedisSystem("redis", redis_server.url, batch=1000, output_partitions=4)
    producer = system.producer()
    producer.partitions("out")
    producer.send("warm", 0, None, "loads the script")
    producer.flush()
    for i in range(40):
        producer.send("out", i % 4, None if i % 2 else f"k{i}", {"n": i})
    before = system.client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    producer.flush()
    after = system.client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert after - before == 1  # one script call for all four partitions
    system.client.script_flush()  # as after a restart: the script must be loaded again
    for i in range(40, 48):
        producer.send("out", i % 4, None, {"n": i})
    producer.close()
    for p in range(4):
        expected = [(None if i % 2 or i >= 40 else f"k{i}", {"n": i}) for i in range(p, 48, 4)]
        assert [(k, m) for _, k, m in system.read_all("out", p)] == expected
    system.close()


def test_a_batch_in_flight_when_its_connection_dies_is_sent_again_before_flush_returns(
    redis_server: RedisServer,
) -> None:
    system = RedisSystem("redis", redis_server.url, batch=10, output_partitions=2, retry_s=10)
    producer = system.producer()
    producer.partitions("out")
    producer.send("warm", 0, None, "loads the script")
    producer.flush()
    system.client.client_pause(5000, all=False)  # write commands wait, ours included
    for i in range(10):  # a full batch: written, its reply not awaited
        producer.send("out", i % 2, None, {"n": i})
    time.sleep(0.2)
    killed = 0
    for c in system.client.client_list():
        if c["cmd"] == "evalsha":  # the producer's connection, its batch not yet applied
            killed += system.client.client_kill_filter(_id=c["id"])
    assert killed == 1
    system.client.client_unpause()
    assert system.read_all("out", 0) == []  # the batch died with its connection
    producer.send("out", 0, None, {"n": 10})
    producer.flush()  # rule 9: returns only once Redis acknowledged everything
    assert [m for _, _, m in system.read_all("out", 0)] == [{"n": i} for i in (0, 2, 4, 6, 8, 10)]
    assert [m for _, _, m in system.read_all("out", 1)] == [{"n": i} for i in (1, 3, 5, 7, 9)]
    assert producer.sent == 12
    producer.close()
    system.close()


def test_a_batch_redis_refuses_fails_every_flush_until_it_is_written(redis_server: RedisServer) -> None:
    import redis

    system = RedisSystem("redis", redis_server.url, batch=2, output_partitions=1)
    producer = system.producer()
    producer.partitions("out")
    system.client.set(system.keys.stream("out", 0), "not a stream")
    producer.send("out", 0, None, {"n": 0})
    producer.send("out", 0, None, {"n": 1})  # a full batch: written, its reply not awaited
    for _ in range(2):  # rule 9: a flush (before a checkpoint) never passes a refused batch
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            producer.flush()
    system.client.delete(system.keys.stream("out", 0))
    producer.flush()  # the kept batch goes out once the cause is gone
    assert [m for _, _, m in system.read_all("out", 0)] == [{"n": 0}, {"n": 1}]
    producer.close()
    system.close()


def test_unknown_stream_and_unreachable_redis_name_what_is_wrong(tmp_path: Any) -> None:
    url = f"unix://{tmp_path}/nothing.sock?db=0"
    with pytest.raises(InputError, match=r"nothing\.sock"):
        RedisSystem("redis", url)
    store = RedisCheckpointStore(url, inputs=[SSP0])
    with pytest.raises(CheckpointError, match=r"nothing\.sock"):
        store.open("job")


def test_unknown_stream_is_an_input_error(redis_server: RedisServer) -> None:
    system = RedisSystem("redis", redis_server.url)
    with pytest.raises(InputError, match="no stream 'nope'"):
        system.partitions("nope")
    system.close()


def test_commit_is_fenced_by_the_lease_token_and_never_goes_back(redis_server: RedisServer) -> None:
    client = redis_server.client()
    system = RedisSystem("redis", redis_server.url)
    keys = system.keys
    a = Leases(client, keys, "job", "a", ttl_ms=300)
    b = Leases(client, keys, "job", "b", ttl_ms=300)
    assert a.acquire(SSP0)
    assert not b.acquire(SSP0)  # one owner at a time
    store_a = RedisCheckpointStore(redis_server.url, leases=a.held())
    store_a.open("job")
    store_a.write("Partition 0", {SSP0: "5-0"})
    with pytest.raises(FencedError, match="back from 5-0"):
        store_a.write("Partition 0", {SSP0: "4-9"})
    store_a2 = RedisCheckpointStore(redis_server.url, leases=a.held())
    store_a2.open("job")
    store_a2.write("Partition 0", {SSP0: "5-0"})  # the same id again is fine (idempotent retry)
    assert store_a2.load("Partition 0") == {SSP0: "5-0"}
    time.sleep(0.5)  # a's lease expires (it stopped renewing, as a paused process would)
    assert b.acquire(SSP0)
    store_b = RedisCheckpointStore(redis_server.url, leases=b.held())
    store_b.open("job")
    store_b.write("Partition 0", {SSP0: "7-0"})
    with pytest.raises(FencedError, match="no longer held"):
        store_a2.write("Partition 0", {SSP0: "9-0"})
    with pytest.raises(FencedError):  # and never again, even with a valid-looking id
        store_a2.write("Partition 0", {SSP0: "10-0"})
    assert client.get(keys.checkpoint("in", 0, "job")) == b"7-0"
    assert b.renew() == set()
    assert a.renew() == {SSP0} and a.held() == {}  # a learns it lost the lease
    assert not a.acquire(SSP0)  # b holds it
    for s in (store_a, store_a2, store_b):
        s.close()
    system.close()
    client.close()


def test_a_second_standalone_container_is_refused(redis_server: RedisServer) -> None:
    first = RedisCheckpointStore(redis_server.url, inputs=[SSP0], lease_ms=5000)
    first.open("job")
    second = RedisCheckpointStore(redis_server.url, inputs=[SSP0], lease_ms=5000)
    with pytest.raises(CheckpointError, match="leased by another container"):
        second.open("job")
    first.close()
    second.open("job")  # released on close
    second.close()


class Forward(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        collector.send("redis.out", envelope.message, key=envelope.message["p"])


def test_container_over_redis_with_standalone_checkpoints(redis_server: RedisServer) -> None:
    system = RedisSystem("redis", redis_server.url)
    ids = fill(system, "in", 2, 100)
    system.create_stream("out", 1)
    ssps = [SystemStreamPartition("redis", "in", p) for p in range(2)]
    store = RedisCheckpointStore(redis_server.url, inputs=ssps)
    result = Container(
        Forward,
        inputs=["redis.in"],
        systems=[RedisSystem("redis", redis_server.url)],
        checkpoints=store,
        engine="python",
    ).run()
    assert result.reason == "end_of_stream"
    assert result.committed == {ssps[p]: ids[p][-1] for p in range(2)}
    out = [m for _, _, m in system.read_all("out", 0)]
    assert sorted((m["p"], m["i"]) for m in out) == [(p, i) for p in range(2) for i in range(100)]
    system.close()


def test_one_member_runs_a_job_to_its_end_and_a_rerun_replays_nothing(redis_server: RedisServer) -> None:
    system = RedisSystem("redis", redis_server.url)
    ids = fill(system, "in", 4, 300)
    system.create_stream("out", 1)

    def spec() -> MemberSpec:
        return MemberSpec(
            task=Forward,
            inputs=["redis.in"],
            systems=lambda: [RedisSystem("redis", redis_server.url)],
            url=redis_server.url,
            config={"job.name": "e2e", "task.commit.ms": 50},
            engine="python",
            lease_ms=1000,
        )

    result = run_member(spec(), handle_signals=False)
    assert result.reason == "done" and sorted(result.done) == [0, 1, 2, 3]
    assert result.processed == 1200
    out = [m for _, _, m in system.read_all("out", 0)]
    assert sorted((m["p"], m["i"]) for m in out) == [
        (p, i) for p in range(4) for i in range(300)
    ]  # 0 lost, 0 dup
    for p in range(4):  # every partition committed to its last message
        assert system.client.get(system.keys.checkpoint("in", p, "e2e")).decode() == ids[p][-1]
    assert system.client.zcard(system.keys.members("e2e")) == 0  # left the membership
    again = run_member(spec(), handle_signals=False)
    assert again.reason == "done" and again.processed == 0
    system.close()
