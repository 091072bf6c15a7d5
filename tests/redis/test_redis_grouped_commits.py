"""Several tasks' exactly-once commits in one MULTI/EXEC (``RedisCheckpointStore.write_many``,
what the commit writer hands a store that ``groups_writes`` when commits queue up): each
commit is fenced on its own (rules 26, 28, 41), so one task's lost lease refuses that task's
outputs, offsets and state and nothing of the others'; a reply lost after Redis applied the
call is answered by sending it all again, which appends nothing twice."""

from __future__ import annotations

from typing import Any

import pytest
from redis_support import RedisServer

from tailrace.errors import CheckpointError, FencedError
from tailrace.interfaces import CommitOutputs, HandedRecords, StoreWrite
from tailrace.redis.checkpoint import RedisCheckpointStore
from tailrace.redis.system import RedisSystem
from tailrace.types import SystemStreamPartition

IN = [SystemStreamPartition("redis", "in", p) for p in range(3)]
TASKS = [f"Partition {p}" for p in range(3)]


class _Setup:
    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.system = RedisSystem("redis", server.url, codec="str")
        self.system.create_stream("in", 3)
        self.system.create_stream("out", 3)
        self.store = RedisCheckpointStore(server.url, inputs=IN, lease_ms=5000)
        self.store.open("job")
        producer = self.system.producer()
        self.held = [producer.hold(t, self.store) for t in TASKS]
        self.sent = 0

    def commit(
        self, p: int, offset: str, records: int, state: dict[bytes, bytes] | None = None
    ) -> StoreWrite:
        """Task p's commit: ``records`` outputs held and taken, its offset, its state."""
        for _ in range(records):
            self.held[p].send("out", p, f"k{p}", f"m{self.sent}")
            self.sent += 1
        outputs = CommitOutputs()
        publication = self.held[p].take()
        if publication is not None:
            assert isinstance(publication, HandedRecords)  # what makes the commit groupable
            outputs.records.append(publication.records)
        return (TASKS[p], {IN[p]: offset}, {"counts": state} if state else None, outputs)

    def out(self, p: int) -> list[Any]:
        return [m for _, _, m in self.system.read_all("out", p)]

    def close(self) -> None:
        self.store.close()
        self.system.close()


@pytest.fixture
def setup(redis_server: RedisServer) -> Any:
    s = _Setup(redis_server)
    try:
        yield s
    finally:
        s.close()


def test_commits_of_several_tasks_in_one_call_apply_each_on_its_own(setup: _Setup) -> None:
    s = setup
    assert s.store.groups_writes and s.store.background_writes  # set by hold()
    with s.server.client() as c:  # another container takes partition 1
        c.set(s.store.keys.lease("in", 1, "job"), "intruder|999", px=60000)
    errors = s.store.write_many(
        [s.commit(0, "1-1", 3, {b"a": b"1"}), s.commit(1, "1-2", 2, {b"b": b"2"}), s.commit(2, "1-3", 4)]
    )
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], FencedError) and "redis.in[1]" in str(errors[1])
    assert s.out(0) == ["m0", "m1", "m2"] and s.out(2) == ["m5", "m6", "m7", "m8"]
    assert s.out(1) == []  # the fenced task appended nothing ...
    committed = s.store.read_committed()
    assert committed.get(IN[0]) == "1-1" and committed.get(IN[2]) == "1-3"
    assert IN[1] not in committed  # ... committed no offset ...
    assert dict(s.store.state_scan(TASKS[0], "counts")) == {b"a": b"1"}
    with s.server.client() as c:  # ... and wrote no state
        _, hkey = s.store.keys.state("in", 1, "job", TASKS[1], "counts")
        assert c.hgetall(hkey) == {}
    # the next call: the fenced task stays refused, the others go on from where they were
    errors = s.store.write_many([s.commit(0, "2-1", 1), s.commit(1, "2-2", 1)])
    assert errors[0] is None and isinstance(errors[1], FencedError)
    assert s.out(0) == ["m0", "m1", "m2", "m9"] and s.out(1) == []
    assert s.store.read_committed()[IN[0]] == "2-1"


def test_a_reply_lost_after_the_call_ran_is_answered_by_sending_it_again(
    setup: _Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = setup
    s.store.write_many([s.commit(0, "1-1", 2), s.commit(1, "1-1", 2)])  # batches 1 of both tasks
    conn = s.store._connection()
    real = conn.read_response
    lost = []

    def read_response() -> Any:
        reply = real()
        if isinstance(reply, list) and not lost:  # the EXEC's reply: Redis applied it all
            lost.append(reply)
            conn.disconnect()
            import redis

            raise redis.exceptions.ConnectionError("connection reset while reading the reply")
        return reply

    monkeypatch.setattr(conn, "read_response", read_response)
    errors = s.store.write_many(
        [s.commit(0, "2-1", 3, {b"x": b"1"}), s.commit(1, "2-1", 1), s.commit(2, "2-1", 2)]
    )
    assert lost and errors == [None, None, None]
    # sent again whole: each task's batch was found appended (OUTPUT_COMMIT's batch number),
    # its offsets and state written again with the same values
    assert s.out(0) == ["m0", "m1", "m4", "m5", "m6"]
    assert s.out(1) == ["m2", "m3", "m7"]
    assert s.out(2) == ["m8", "m9"]
    assert s.store.read_committed() == {IN[0]: "2-1", IN[1]: "2-1", IN[2]: "2-1"}
    assert dict(s.store.state_scan(TASKS[0], "counts")) == {b"x": b"1"}


def test_a_call_that_cannot_reach_redis_fails_every_commit_in_it_naming_the_tasks(
    setup: _Setup,
) -> None:
    s = setup
    assert s.store.write_many([s.commit(0, "1-1", 1), s.commit(1, "1-1", 1)]) == [None, None]
    writes = [s.commit(0, "2-1", 1), s.commit(1, "2-1", 1)]
    s.store.retry_s = 0.2
    s.server.kill()
    with pytest.raises(
        CheckpointError, match=r"tasks 'Partition 0', 'Partition 1': Redis at .* is unreachable"
    ):
        s.store.write_many(writes)
    # a task whose last output batch was never read (its first commit) cannot be prepared:
    # its own error, naming it
    errors = s.store.write_many([s.commit(2, "1-1", 1)])
    assert isinstance(errors[0], CheckpointError)
    assert "task 'Partition 2'" in str(errors[0]) and "unreachable" in str(errors[0])
    s.server.start()  # back (from its AOF), so that closing releases the leases at once


def test_an_output_stream_key_of_another_type_refuses_the_whole_commit_naming_it(setup: _Setup) -> None:
    # checked before anything is written: no entry appended to the task's other streams, no
    # offset, no state (an XADD failing there would leave the entries before it, and the
    # offsets and state after it would be written); the other task's commit in the call is not
    # held back
    s = setup
    bad = s.system.keys.stream("out", 2)
    with s.server.client() as c:
        c.set(bad, "not a stream")
    s.held[0].send("out", 0, "k0", "first")  # to a good stream, before the bad one
    s.held[0].send("out", 2, "k0", "second")
    errors = s.store.write_many([s.commit(0, "1-1", 0, {b"a": b"1"}), s.commit(1, "1-1", 1)])
    assert isinstance(errors[0], CheckpointError) and errors[1] is None
    assert f"Redis key {bad} holds a string, not a stream" in str(errors[0])
    assert "nothing of the commit was written" in str(errors[0])
    assert s.out(0) == [] and s.out(1) == ["m0"]
    assert s.store.read_committed() == {IN[1]: "1-1"}
    assert dict(s.store.state_scan(TASKS[0], "counts")) == {}
    with s.server.client() as c:
        assert c.get(bad) == b"not a stream"
        c.delete(bad)
    # once the key is gone the same records go out with the task's next commit
    s.held[0].send("out", 0, "k0", "third")
    errors = s.store.write_many([s.commit(0, "2-1", 0, {b"a": b"2"})])
    assert errors == [None] and s.out(0) == ["third"]
    assert s.store.read_committed()[IN[0]] == "2-1"
