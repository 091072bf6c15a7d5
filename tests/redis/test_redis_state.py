"""Task state in Redis (rules 25-29) at the CheckpointStore level: state and offsets in
one fenced atomic write, reads from any thread, takeovers, zombies, Redis Cluster."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import state_main
from redis_support import HERE, RedisClusterNodes, RedisServer

from tailrace.errors import CheckpointError, FencedError
from tailrace.redis import checkpoint as redis_checkpoint
from tailrace.redis.checkpoint import RedisCheckpointStore
from tailrace.types import SystemStreamPartition

IN0 = SystemStreamPartition("redis", "in", 0)
IN1 = SystemStreamPartition("redis", "in", 1)
TASK = "Partition 0"


def open_store(
    url: str, inputs: list[SystemStreamPartition], job: str = "job", **kw: Any
) -> RedisCheckpointStore:
    store = RedisCheckpointStore(url, inputs=inputs, lease_ms=kw.pop("lease_ms", 5000), **kw)
    store.open(job)
    return store


def snapshot(store: RedisCheckpointStore, name: str = "counts", task: str = TASK) -> dict[bytes, bytes]:
    return dict(store.state_scan(task, name))


def committed_state(
    server: RedisServer, store: RedisCheckpointStore, name: str = "counts"
) -> dict[bytes, bytes]:
    """The committed entries of a store, read straight from Redis: a store that lost a lease
    may not read them itself (rule 28)."""
    _, hkey = store.keys.state(IN0.stream, IN0.partition, "job", TASK, name)
    with server.client() as c:
        return {bytes(k): bytes(v) for k, v in c.hgetall(hkey).items()}


def steal_lease(server: RedisServer, store: RedisCheckpointStore, ssp: SystemStreamPartition) -> None:
    """Another member takes the partition: the lease now holds another value."""
    with server.client() as c:
        c.set(store.keys.lease(ssp.stream, ssp.partition, "job"), "intruder|999", px=60000)


# -- round trips -----------------------------------------------------------------------
def test_write_get_scan_delete_round_trip(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # rules 25, 26: what a commit wrote is read back exactly, scans in byte order
    monkeypatch.setattr(redis_checkpoint, "SCAN_BATCH", 7)  # several round trips per scan
    store = open_store(redis_server.url, [IN0, IN1])
    keys = [b"", b"\x00", b"\x00\x00", b"(", b"[", b"-", b"+", b"a", b"ab", b"b", b"\x7f", b"\x80", b"\xff"]
    keys += [b"k%03d" % i for i in range(40)]
    values = {k: b"v" + k for k in keys}
    store.write(TASK, {IN0: "5-0"}, {"counts": values, "other": {b"x": b"\x00binary\xff"}})
    assert store.load(TASK)[IN0] == "5-0"
    for k in keys:
        assert store.state_get(TASK, "counts", k) == b"v" + k
    assert store.state_get(TASK, "counts", b"missing") is None
    assert store.state_get(TASK, "other", b"x") == b"\x00binary\xff"
    assert store.state_get(TASK, "nosuchstore", b"x") is None
    assert list(store.state_scan(TASK, "counts")) == sorted(values.items())
    assert list(store.state_scan(TASK, "nosuchstore")) == []
    # ranges: start inclusive, end exclusive, by raw bytes
    for start, end in [(b"a", b"b"), (None, b"("), (b"\x80", None), (b"k010", b"k020"), (b"b", b"a")]:
        want = sorted(
            (k, v) for k, v in values.items() if (start is None or k >= start) and (end is None or k < end)
        )
        assert list(store.state_scan(TASK, "counts", start, end)) == want, (start, end)
    # deletes and overwrites; other keys keep their values; the task of partition 1 is separate
    store.write(TASK, {IN0: "6-0"}, {"counts": {b"a": None, b"b": b"new", b"never-there": None}})
    store.write("Partition 1", {IN1: "1-0"}, {"counts": {b"a": b"p1"}})
    values.pop(b"a")
    values[b"b"] = b"new"
    assert snapshot(store) == values
    assert list(store.state_scan(TASK, "counts")) == sorted(values.items())
    assert store.state_get(TASK, "counts", b"a") is None
    assert snapshot(store, task="Partition 1") == {b"a": b"p1"}
    # a fresh store (another container, after this one released its leases) reads the same
    store.close()
    again = open_store(redis_server.url, [IN0, IN1])
    assert again.load(TASK) == {IN0: "6-0", IN1: "1-0"}
    assert snapshot(again) == values
    again.close()


def test_state_of_an_unknown_task_is_refused(redis_server: RedisServer) -> None:
    store = open_store(redis_server.url, [IN0])
    with pytest.raises(CheckpointError, match=r"'Partition 7'.*Partition 0"):
        store.write("Partition 7", {}, {"counts": {b"a": b"1"}})
    with pytest.raises(CheckpointError, match="Partition 7"):
        store.state_get("Partition 7", "counts", b"a")
    store.close()


def test_state_stays_with_the_tasks_first_input(redis_server: RedisServer) -> None:
    # the state of a task lives under its first input partition: a stream added after it
    # changes nothing; one sorting before it would hide the state, so it is refused
    store = open_store(redis_server.url, [IN0])
    store.write(TASK, {IN0: "1-0"}, {"counts": {b"a": b"1"}})
    store.close()
    later = SystemStreamPartition("redis", "zz", 0)
    store = open_store(redis_server.url, [IN0, later])
    assert store.state_get(TASK, "counts", b"a") == b"1"
    store.write(TASK, {later: "4-0"}, {"counts": {b"b": b"1"}})
    assert snapshot(store) == {b"a": b"1", b"b": b"1"}
    store.close()
    first = SystemStreamPartition("redis", "aa", 0)
    store = open_store(redis_server.url, [first, IN0])
    message = r"state was written under input partition in:0.*first input is now aa:0"
    with pytest.raises(CheckpointError, match=message):
        store.state_get(TASK, "counts", b"a")
    with pytest.raises(CheckpointError, match=message):
        list(store.state_scan(TASK, "counts"))
    with pytest.raises(CheckpointError, match=message):
        store.write(TASK, {first: "1-0"}, {"counts": {b"a": b"2"}})
    assert store.load(TASK)[IN0] == "1-0"  # nothing written
    store.close()
    # a task that never wrote state may change its inputs freely
    other = open_store(redis_server.url, [IN0], job="stateless")
    other.write(TASK, {IN0: "1-0"})
    other.close()
    other = open_store(redis_server.url, [first, IN0], job="stateless")
    assert other.state_get(TASK, "counts", b"x") is None
    other.write(TASK, {first: "1-0"}, {"counts": {b"x": b"1"}})
    assert snapshot(other) == {b"x": b"1"}
    other.close()


def test_a_commit_of_many_keys_is_batched_and_atomic(redis_server: RedisServer) -> None:
    # rule 26: 45,000 changes over two stores: several scripts in one MULTI/EXEC
    store = open_store(redis_server.url, [IN0])
    n = 4 * redis_checkpoint.STATE_BATCH + 5000
    big = {b"%08d" % i: b"%d" % i for i in range(n - 1000)}
    small = {b"s%04d" % i: b"x" for i in range(1000)}
    store.write(TASK, {IN0: "1-0"}, {"big": big, "small": small})
    assert store.load(TASK) == {IN0: "1-0"}
    assert snapshot(store, "big") == big
    assert list(store.state_scan(TASK, "big")) == sorted(big.items())
    assert snapshot(store, "small") == small
    # a fenced big commit applies nothing: neither offsets nor any batch of state (rule 28)
    steal_lease(redis_server, store, IN0)
    with pytest.raises(FencedError, match="no longer held"):
        store.write(TASK, {IN0: "2-0"}, {"big": {k: b"changed" for k in big}, "small": dict.fromkeys(small)})
    with redis_server.client() as c:
        assert c.get(store.keys.checkpoint("in", 0, "job")) == b"1-0"
    assert committed_state(redis_server, store, "big") == big
    assert committed_state(redis_server, store, "small") == small
    store.close()


def test_a_commit_moving_an_offset_back_applies_nothing(redis_server: RedisServer) -> None:
    store = open_store(redis_server.url, [IN0, IN1])
    store.write(TASK, {IN0: "7-0"}, {"counts": {b"a": b"1"}})
    with pytest.raises(FencedError, match="back from 7-0 to 3-5"):
        store.write(TASK, {IN0: "3-5"}, {"counts": {b"a": b"2", b"b": b"1"}})
    assert committed_state(redis_server, store) == {b"a": b"1"}
    assert store.load(TASK)[IN0] == "7-0"
    store.close()


def test_an_unreachable_redis_applies_nothing_and_says_where(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        store = open_store(server.url, [IN0], retry_s=0.3)
        store.write(TASK, {IN0: "1-0"}, {"counts": {b"a": b"1"}})
        server.kill()
        with pytest.raises(CheckpointError, match="unreachable"):
            store.write(TASK, {IN0: "2-0"}, {"counts": {b"a": b"2"}})
        with pytest.raises(CheckpointError, match="store 'counts'.*" + re.escape(server.url)):
            store.state_get(TASK, "counts", b"a")
        with pytest.raises(CheckpointError, match="unreachable"):
            list(store.state_scan(TASK, "counts"))
        server.start()  # the same AOF: what was committed survived, nothing else
        with server.client() as c:
            c.delete(store.keys.lease("in", 0, "job"))
        again = open_store(server.url, [IN0])
        assert again.load(TASK) == {IN0: "1-0"}
        assert snapshot(again) == {b"a": b"1"}
        again.close()
    finally:
        server.kill()


def test_reads_from_many_threads_see_whole_commits(redis_server: RedisServer) -> None:
    # CheckpointStore contract: state_get / state_scan from any thread while commits run;
    # a scan batch is read atomically, so it never mixes two commits
    store = open_store(redis_server.url, [IN0])
    keys = [b"k%03d" % i for i in range(200)]
    store.write(TASK, {IN0: "1-0"}, {"counts": dict.fromkeys(keys, b"1")})
    stop = threading.Event()
    errors: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        last = 0
        while not stop.is_set():
            if rng.random() < 0.5:
                v = store.state_get(TASK, "counts", rng.choice(keys))
                assert v is not None
                if int(v) < last:
                    errors.append(f"get went back from {last} to {int(v)}")
                last = int(v)
            else:
                seen = {v for _, v in store.state_scan(TASK, "counts")}
                if len(seen) != 1:
                    errors.append(f"a scan mixed commits: {sorted(seen)}")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        for i in range(2, 120):
            store.write(TASK, {IN0: f"{i}-0"}, {"counts": dict.fromkeys(keys, b"%d" % i)})
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    assert set(snapshot(store).values()) == {b"119"}
    store.close()


# -- crashes, takeovers, zombies --------------------------------------------------------
def spawn(spec: dict[str, Any], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "state_main.py"), json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(log, "wb"),
    )


def read_line(proc: subprocess.Popen[bytes], timeout: float = 20) -> str:
    assert proc.stdout is not None
    result: list[bytes] = []
    t = threading.Thread(target=lambda: result.append(proc.stdout.readline()))  # type: ignore[union-attr]
    t.start()
    t.join(timeout)
    assert result and result[0], f"no line from the child in {timeout} s"
    return result[0].decode().strip()


@pytest.mark.parametrize("seed", range(5))
def test_kill_9_then_takeover_sees_exactly_the_last_committed_state(
    redis_server: RedisServer, tmp_path: Path, seed: int
) -> None:
    # rules 20, 26: a committer is killed at a seeded random moment; the new owner's state
    # is exactly the fold of the messages up to its committed offset, no more, no less
    rng = random.Random(seed)
    spec = {"url": redis_server.url, "job": "job", "lease_ms": 300, "mode": "committer", "seed": seed}
    proc = spawn(spec, tmp_path / "committer.log")
    try:
        first = read_line(proc)
        assert first.startswith("C "), first
        time.sleep(rng.uniform(0.05, 0.6))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while True:  # the victim's lease blocks the takeover for up to lease_ms
        try:
            store = open_store(redis_server.url, [IN0])
            break
        except CheckpointError:
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.05)
    n = int(str(store.load(TASK)[IN0]).split("-")[0])
    assert n >= int(first.split()[1])
    want = state_main.fold(n)
    assert snapshot(store) == want
    assert list(store.state_scan(TASK, "counts")) == sorted(want.items())
    for k in {state_main.key_of(m) for m in range(1, 60)}:
        assert store.state_get(TASK, "counts", k) == want.get(k)
    # the new owner continues from there: its commits build on exactly that state
    counts = {k: int(v) for k, v in want.items()}
    state_main.commit(store, counts, n + 1, n + 25)
    assert snapshot(store) == state_main.fold(n + 25)
    store.close()


@pytest.mark.parametrize("takeover_commits", [True, False])
def test_a_sigstopped_zombie_cannot_write_state_after_its_lease_expired(
    redis_server: RedisServer, tmp_path: Path, takeover_commits: bool
) -> None:
    # rule 28: a real process paused past its lease; after SIGCONT its state write is refused
    spec = {"url": redis_server.url, "job": "job", "lease_ms": 400, "mode": "zombie"}
    proc = spawn(spec, tmp_path / "zombie.log")
    try:
        assert read_line(proc) == "ready"
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.8)  # past the lease; the zombie's renewer thread is stopped too
        takeover = open_store(redis_server.url, [IN0])
        assert takeover.load(TASK) == {IN0: "3-0"}
        assert snapshot(takeover) == state_main.fold(3)
        if takeover_commits:
            counts = {k: int(v) for k, v in state_main.fold(3).items()}
            state_main.commit(takeover, counts, 4, 5)
        proc.send_signal(signal.SIGCONT)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        line = read_line(proc)
        assert line.startswith("FENCED") and "no longer held" in line, line
        assert proc.wait(timeout=10) == 0
        upto = 5 if takeover_commits else 3
        assert takeover.load(TASK) == {IN0: f"{upto}-0"}
        assert snapshot(takeover) == state_main.fold(upto)
        takeover.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


def test_a_store_that_lost_its_lease_reads_none_of_its_successor_s_state(redis_server: RedisServer) -> None:
    # rule 28 for reads: a container paused past its lease, once resumed, reads state through
    # its store before it notices; its successor has committed since, ahead of the paused
    # container's position, so a value read there counts messages twice in what it emits
    store = open_store(redis_server.url, [IN0])
    store.write(TASK, {IN0: "1-0"}, {"counts": {b"a": b"1", b"b": b"1"}})
    assert store.state_get(TASK, "counts", b"a") == b"1"
    steal_lease(redis_server, store, IN0)
    with redis_server.client() as c:  # the successor's commit
        _, hkey = store.keys.state("in", 0, "job", TASK, "counts")
        c.hset(hkey, b"a", b"9")
    with pytest.raises(FencedError, match=r"no longer held.*refusing to read store 'counts'"):
        store.state_get(TASK, "counts", b"a")
    with pytest.raises(FencedError, match="holds no lease"):
        list(store.state_scan(TASK, "counts"))
    with pytest.raises(FencedError, match="holds no lease"):  # and it stays fenced
        store.write(TASK, {IN0: "2-0"}, {"counts": {b"a": b"2"}})
    store.close()


def test_a_lease_that_expired_unclaimed_still_fences(redis_server: RedisServer) -> None:
    # rule 28: no owner at all is not ownership either
    store = open_store(redis_server.url, [IN0])
    store.write(TASK, {IN0: "1-0"}, {"counts": {b"a": b"1"}})
    with redis_server.client() as c:
        c.delete(store.keys.lease("in", 0, "job"))
    with pytest.raises(FencedError):
        store.write(TASK, {IN0: "2-0"}, {"counts": {b"a": b"2"}})
    assert committed_state(redis_server, store) == {b"a": b"1"}
    with pytest.raises(FencedError, match="holds no lease"):  # and it stays fenced
        store.write(TASK, {IN0: "2-0"}, {"counts": {b"a": b"2"}})
    with pytest.raises(FencedError, match="holds no lease"):  # for reads too
        store.state_get(TASK, "counts", b"a")
    store.close()


# -- Redis Cluster -----------------------------------------------------------------------
def test_cluster_layout_keeps_state_and_offsets_in_one_fenced_slot(tmp_path: Path) -> None:
    from redis.crc import key_slot

    nodes = RedisClusterNodes(tmp_path / "cluster").start()
    opened: list[RedisCheckpointStore] = []
    try:
        url = nodes.url
        side0 = SystemStreamPartition("redis", "side", 0)
        store = open_store(url, [IN0, IN1, side0], cluster=True)
        opened.append(store)
        keys = store.keys
        # one input stream per task: state next to the partition's lease
        zkey, hkey = keys.state("in", 1, "job", "Partition 1", "counts")
        slot = key_slot(keys.lease("in", 1, "job").encode())
        assert key_slot(zkey.encode()) == key_slot(hkey.encode()) == slot
        store.write("Partition 1", {IN1: "4-0"}, {"counts": {b"b": b"2", b"a": b"1"}})
        assert store.state_get("Partition 1", "counts", b"b") == b"2"
        assert list(store.state_scan("Partition 1", "counts")) == [(b"a", b"1"), (b"b", b"2")]

        # task 0 reads "in" and "side": two slots; its anchor is in:0 (sorted first)
        anchor_slot = key_slot(keys.lease("in", 0, "job").encode())
        assert anchor_slot != key_slot(keys.lease("side", 0, "job").encode())
        many = {b"%05d" % i: b"v" for i in range(redis_checkpoint.STATE_BATCH + 10)}  # MULTI on a cluster
        store.write(TASK, {IN0: "3-0", side0: "9-1"}, {"counts": many})
        assert list(store.state_scan(TASK, "counts")) == sorted(many.items())
        tckpt = keys.task_offsets("in", 0, "job", TASK)
        assert key_slot(tckpt.encode()) == key_slot(keys.lease("in", 0, "job").encode())
        # offsets without state still go to the task's own record (atomic with the last state)
        store.write(TASK, {side0: "10-0"})
        store.close()

        again = open_store(url, [IN0, IN1, side0], cluster=True)
        opened.append(again)
        assert again.load(TASK) == {IN0: "3-0", IN1: "4-0", side0: "10-0"}
        assert snapshot(again) == many
        with pytest.raises(FencedError, match="back from 10-0 to 2-0"):
            again.write(TASK, {side0: "2-0"}, {"counts": {b"00000": b"x"}})
        again.fenced.clear()
        assert again.state_get(TASK, "counts", b"00000") == b"v"
        # the anchor's lease fences the whole task, state and both partitions' offsets
        import redis

        cluster = redis.RedisCluster.from_url(url)
        cluster.set(keys.lease("in", 0, "job"), "intruder|999", px=60000)
        with pytest.raises(FencedError, match="no longer held"):
            again.write(TASK, {IN0: "5-0", side0: "11-0"}, {"counts": {b"00000": b"zombie"}})
        _, hkey = keys.state("in", 0, "job", TASK, "counts")
        assert cluster.hget(hkey, b"00000") == b"v"
        cluster.close()
        with pytest.raises(FencedError, match="holds no lease"):  # nor read it now (rule 28)
            again.state_get(TASK, "counts", b"00000")
        assert again.read_committed()[side0] == "10-0"
    finally:
        for s in opened:  # stop their lease renewers before the nodes go away
            s.close()
        nodes.kill()
