"""Redis checkpoints across runs and jobs (rules 26, 28): a store object used for a later run
reads the committed ids again, and `checkpoints reset` of one job touches exactly that
job's keys (job names may contain ':')."""

from __future__ import annotations

from typing import Any

import pytest
from redis_support import RedisServer

from tailrace import Container, RedisSystem, Scope, StreamTask
from tailrace.errors import FencedError
from tailrace.redis._io import Keys
from tailrace.redis.checkpoint import RedisCheckpointStore
from tailrace.redis.tools import reset_checkpoints
from tailrace.serdes import serde
from tailrace.types import SystemStreamPartition

IN0 = SystemStreamPartition("redis", "in", 0)
TASK = "Partition 0"
JSON = serde("json")


def open_store(url: str, job: str, inputs: list[SystemStreamPartition] | None = None) -> RedisCheckpointStore:
    store = RedisCheckpointStore(url, inputs=inputs or [IN0], lease_ms=5000)
    store.open(job)
    return store


def committed(url: str, job: str, inputs: list[SystemStreamPartition] | None = None) -> tuple[Any, Any]:
    """(committed id of IN0, state of store ``counts``) of ``job``, read by a fresh store."""
    store = open_store(url, job, inputs)
    try:
        return store.load(TASK).get(IN0), dict(store.state_scan(TASK, "counts"))
    finally:
        store.close()


# -- a store object used again ----------------------------------------------------------
def test_a_store_object_opened_again_reads_the_committed_ids_from_redis(redis_server: RedisServer) -> None:
    # load() cached the ids for good: a second open resumed from the ids of its first run
    # while the state it read was the newer one another run committed (counted twice)
    url = redis_server.url
    s1 = open_store(url, "job")
    assert s1.load(TASK) == {}
    s1.write(TASK, {IN0: "1-0"}, {"counts": {b"n": b"1"}})
    assert s1.load(TASK) == {IN0: "1-0"}
    s1.close()
    s2 = open_store(url, "job")
    s2.write(TASK, {IN0: "5-0"}, {"counts": {b"n": b"5"}})
    s2.close()
    s1.open("job")
    assert s1.load(TASK) == {IN0: "5-0"}
    assert s1.state_get(TASK, "counts", b"n") == b"5"
    s1.write(TASK, {IN0: "6-0"}, {"counts": {b"n": b"6"}})
    s1.close()
    assert committed(url, "job") == ("6-0", {b"n": b"6"})


def test_a_fenced_partition_is_forgotten_at_the_next_open(redis_server: RedisServer) -> None:
    # ``fenced`` stays readable after close (a member forgets those leases), but a new open
    # has new leases: its commits must not be refused for the last open's fencing
    url = redis_server.url
    store = open_store(url, "job")
    store.write(TASK, {IN0: "1-0"})
    with redis_server.client() as c:
        c.set(store.keys.lease("in", 0, "job"), "intruder|999", px=60000)
    with pytest.raises(FencedError, match="no longer held"):
        store.write(TASK, {IN0: "2-0"}, {"counts": {b"n": b"2"}})
    store.close()
    assert store.fenced == {IN0}
    with redis_server.client() as c:
        c.delete(store.keys.lease("in", 0, "job"))  # the intruder left
    store.open("job")
    assert store.fenced == set()
    assert store.load(TASK) == {IN0: "1-0"}
    store.write(TASK, {IN0: "3-0"}, {"counts": {b"n": b"3"}})
    store.close()
    assert committed(url, "job") == ("3-0", {b"n": b"3"})


class Count(StreamTask):
    """Counts messages in store ``counts``; stops the container at message ``stop_at``."""

    stop_at: Any = None

    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.counts["n"] = self.counts.get("n", 0) + 1
        if envelope.message == Count.stop_at:
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_container_runs_on_one_store_object_count_each_message_once(
    redis_server: RedisServer, engine: str
) -> None:
    url = redis_server.url
    system = RedisSystem("redis", url)
    system.create_stream("in", 1)

    def run(store: RedisCheckpointStore, stop_at: int) -> int:
        Count.stop_at = stop_at
        result = Container(
            Count,
            inputs=[IN0],
            systems=[RedisSystem("redis", url)],
            engine=engine,
            config={"job.name": "count"},
            checkpoints=store,
            stores={"counts": {}},
        ).run()
        return int(result.processed)

    def new_store() -> RedisCheckpointStore:
        return RedisCheckpointStore(url, inputs=[IN0], lease_ms=1000)

    s1 = new_store()
    for batch in range(3):
        for i in range(10 * batch, 10 * batch + 10):
            system.append("in", 0, i)
        # runs 1 and 3 on s1, run 2 on a store of its own
        assert run(s1 if batch != 1 else new_store(), 10 * batch + 9) == 10
    state = committed(url, "count")[1]
    assert {JSON.decode(k): JSON.decode(v) for k, v in state.items()} == {"n": 30}
    system.close()


# -- reset touches one job ----------------------------------------------------------------
JOBS = ["etl", "etl:v2", "etl:Partition 0:counts", "etl:Partition 0", "et"]


def test_reset_deletes_exactly_one_jobs_state_and_offsets(redis_server: RedisServer) -> None:
    # the SCAN patterns state:JOB:* / tckpt:JOB:* also match jobs named "JOB:...": a reset
    # of 'etl' deleted the state of 'etl:v2' and kept its offsets (resumed with empty stores)
    url = redis_server.url
    for n, job in enumerate(JOBS, 1):
        store = open_store(url, job)
        store.write(TASK, {IN0: f"{n}-0"}, {"counts": {b"n": b"%d" % n}, "other": {b"x": b"1"}})
        store.close()
    with redis_server.client() as c:
        before = {k for k in c.keys("*") if b":lease:" not in k and b":fence:" not in k}
    for target in ("etl", "etl:Partition 0"):
        assert reset_checkpoints(url, False, "tr", target, [IN0]) == 1
        assert committed(url, target) == (None, {})
    for n, job in enumerate(JOBS, 1):
        if job not in ("etl", "etl:Partition 0"):
            assert committed(url, job) == (f"{n}-0", {b"n": b"%d" % n}), job
    with redis_server.client() as c:  # what went: the keys of the two reset jobs, no other
        keys = {k for k in c.keys("*") if b":lease:" not in k and b":fence:" not in k}
    gone = {k.decode() for k in before - keys}
    layout = Keys("tr")
    expected: set[str] = set()
    for job in ("etl", "etl:Partition 0"):
        expected.add(layout.checkpoint("in", 0, job))
        expected.add(layout.anchors(job))
        for name in ("counts", "other"):
            expected.update(layout.state("in", 0, job, TASK, name))
    assert gone == expected
