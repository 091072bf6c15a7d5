"""Several member processes sharing 8 partitions through Redis: rebalancing, crashes,
pauses past the lease, a Redis restart, and a Redis Cluster (rules 13, 20)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from redis_support import REDIS_CLI, RedisClusterNodes, RedisServer, finish_members, spawn_member

from tailrace.redis._io import entry_id
from tailrace.redis.membership import wait_for
from tailrace.redis.system import RedisSystem

P = 8


def fill(system: RedisSystem, start: int, count: int, *, end: bool) -> None:
    """Append {"p": p, "i": i} for i in [start, start+count) to every partition of "in"."""
    pipe = system.client.pipeline(transaction=False)
    for p in range(P):
        for i in range(start, start + count):
            pipe.xadd(system.keys.stream("in", p), {"m": json.dumps({"p": p, "i": i})})
    pipe.execute()
    if end:
        system.end_stream("in")


def outputs(system: RedisSystem) -> list[dict[str, Any]]:
    return [m for _, _, m in system.read_all("out", 0)]


def members_of(system: RedisSystem, job: str) -> list[str]:
    return sorted(m.decode() for m in system.client.zrange(system.keys.members(job), 0, -1))


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def check_complete(out: list[dict[str, Any]], per_partition: int) -> Counter[tuple[int, int]]:
    """0 lost: every input message produced output; returns the copies per message."""
    copies = Counter((m["p"], m["i"]) for m in out)
    missing = [(p, i) for p in range(P) for i in range(per_partition) if (p, i) not in copies]
    assert not missing, f"{len(missing)} messages lost, e.g. {missing[:5]}"
    assert set(copies) == {(p, i) for p in range(P) for i in range(per_partition)}
    return copies


def setup_streams(url: str, *, cluster: bool = False) -> RedisSystem:
    system = RedisSystem("redis", url, cluster=cluster)
    system.create_stream("in", P)
    system.create_stream("out", 1)
    return system


@pytest.mark.parametrize("n", [2, 3])
def test_members_share_partitions_by_the_deterministic_assignment(
    redis_server: RedisServer, tmp_path: Path, n: int
) -> None:
    system = setup_streams(redis_server.url)
    spec = {"url": redis_server.url, "job": "share", "partitions": P, "lease_ms": 1500}
    logs = [tmp_path / f"m{i}.log" for i in range(n)]
    procs = [spawn_member(spec, log) for log in logs]
    try:
        assert wait_for(lambda: len(members_of(system, "share")) == n, 30), "members did not all join"
        ids = members_of(system, "share")

        # Let the rebalance settle (each member holds exactly its own leases) before input arrives.
        def settled() -> bool:
            owners = [system.client.get(system.keys.lease("in", p, "share")) for p in range(P)]
            return all(o is not None and o.decode().split("|")[0] == ids[p % n] for p, o in enumerate(owners))

        assert wait_for(settled, 30), "leases did not settle on the assignment"
        fill(system, 0, 200, end=True)
        results = finish_members(procs, logs, timeout=60)
    finally:
        kill_all(procs)
    out = outputs(system)
    copies = check_complete(out, 200)
    assert max(copies.values()) == 1  # graceful rebalances only: nothing processed twice
    by = {(m["p"], m["by"]) for m in out}
    assert by == {(p, ids[p % n]) for p in range(P)}  # partition p on the (p mod n)-th member
    assert sum(r["processed"] for r in results) == P * 200
    assert all(r["reason"] == "done" for r in results)
    for p in range(P):  # committed to the end
        assert system.client.get(system.keys.checkpoint("in", p, "share")) is not None
    system.close()


def test_kill_9_of_a_member_moves_its_partitions_after_the_lease(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # rule 20: nothing lost; duplicates only of messages processed after the last commit
    system = setup_streams(redis_server.url)
    fill(system, 0, 150, end=True)
    spec = {"url": redis_server.url, "job": "crash", "partitions": P, "lease_ms": 1000, "task": "slow"}
    logs = [tmp_path / f"m{i}.log" for i in range(3)]
    procs = [spawn_member(spec, log) for log in logs]
    try:
        victim = procs[1]
        name = f"m{victim.pid}"
        assert wait_for(lambda: sum(m["by"] == name for m in outputs(system)) >= 40, 30), (
            "victim never worked"
        )
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        # What the victim had committed when it died (its leases still block everyone for lease_ms).
        committed = {}
        for p in range(P):
            raw = system.client.get(system.keys.checkpoint("in", p, "crash"))
            committed[p] = None if raw is None else entry_id(raw, "checkpoint")
        ids = {p: {entry_id(e, "id"): m["i"] for e, _, m in system.read_all("in", p)} for p in range(P)}
        done_upto = {p: -1 if committed[p] is None else ids[p][committed[p]] for p in range(P)}
        results = finish_members([procs[0], procs[2]], [logs[0], logs[2]], timeout=60)
    finally:
        kill_all(procs)
    out = outputs(system)
    copies = check_complete(out, 150)
    dups = {k for k, c in copies.items() if c > 1}
    assert all(c <= 2 for c in copies.values())
    for p, i in dups:  # a duplicate was processed by the victim and not yet committed
        assert i > done_upto[p], f"{(p, i)} was committed before the crash but processed again"
        assert any(m["by"] == name for m in out if (m["p"], m["i"]) == (p, i))
    assert sum(r["processed"] for r in results) >= P * 150 - sum(m["by"] == name for m in out)
    system.close()


def test_a_paused_member_cannot_commit_after_losing_its_lease(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    system = setup_streams(redis_server.url)
    fill(system, 0, 150, end=True)
    spec = {
        "url": redis_server.url,
        "job": "pause",
        "partitions": P,
        "lease_ms": 1000,
        "task": "slow",
        "commit_ms": 100,
    }
    logs = [tmp_path / f"m{i}.log" for i in range(2)]
    procs = [spawn_member(spec, log) for log in logs]
    went_back: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # rule 13: a committed offset never goes backwards
        client = system.client
        last: dict[int, tuple[int, int]] = {}
        while not stop.is_set():
            for p in range(P):
                raw = client.get(system.keys.checkpoint("in", p, "pause"))
                if raw is None:
                    continue
                cur = entry_id(raw, "checkpoint")
                if p in last and cur < last[p]:
                    went_back.append(f"partition {p}: {last[p]} -> {cur}")
                last[p] = cur
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        paused = procs[0]
        name = f"m{paused.pid}"
        assert wait_for(lambda: sum(m["by"] == name for m in outputs(system)) >= 30, 30)
        paused.send_signal(signal.SIGSTOP)
        time.sleep(3.0)  # three lease periods: the other member takes everything over
        holders = {system.client.get(system.keys.lease("in", p, "pause")) for p in range(P)}
        assert all(h is not None and not h.decode().startswith(name + "|") for h in holders)
        paused.send_signal(signal.SIGCONT)
        finish_members(procs, logs, timeout=60)
    finally:
        stop.set()
        watcher.join()
        for p in procs:  # never leave a stopped process behind
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        kill_all(procs)
    assert not went_back, went_back
    text = logs[0].read_text()
    assert "no longer held" in text or "lost the lease" in text, text[-3000:]
    check_complete(outputs(system), 150)
    system.close()


def test_redis_restart_loses_no_acknowledged_write(redis_server: RedisServer, tmp_path: Path) -> None:
    # appendfsync always: every acknowledged XADD and checkpoint survives kill -9 of redis-server
    system = setup_streams(redis_server.url)
    fill(system, 0, 100, end=False)
    spec = {"url": redis_server.url, "job": "restart", "partitions": P, "lease_ms": 8000, "commit_ms": 50}
    log = tmp_path / "m.log"
    proc = spawn_member(spec, log)
    try:
        assert wait_for(lambda: len(outputs(system)) >= P * 100, 30), log.read_text()[-3000:]
        before = {p: system.client.get(system.keys.checkpoint("in", p, "restart")) for p in range(P)}
        system.close()
        redis_server.kill()
        time.sleep(1.0)  # the member keeps retrying meanwhile
        redis_server.start()
        system = RedisSystem("redis", redis_server.url)
        assert len(outputs(system)) >= P * 100  # acknowledged output survived
        for p in range(P):
            after = system.client.get(system.keys.checkpoint("in", p, "restart"))
            assert before[p] is None or entry_id(after, "after") >= entry_id(before[p], "before")
        fill(system, 100, 100, end=True)
        finish_members([proc], [log], timeout=60)
    finally:
        kill_all([proc])
    check_complete(outputs(system), 200)
    system.close()


@pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli is not installed")
def test_two_members_on_a_three_node_redis_cluster(tmp_path: Path) -> None:
    nodes = RedisClusterNodes(tmp_path / "cluster").start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        system = setup_streams(nodes.url, cluster=True)
        fill(system, 0, 100, end=True)
        # the partitions really are spread over the nodes
        slots = {system.client.keyslot(system.keys.stream("in", p)) for p in range(P)}
        assert len({system.client.nodes_manager.get_node_from_slot(s).port for s in slots}) > 1
        assert all(
            system.client.keyslot(system.keys.checkpoint("in", p, "c"))
            == system.client.keyslot(system.keys.stream("in", p))
            for p in range(P)
        )
        spec = {"url": nodes.url, "job": "cluster", "partitions": P, "lease_ms": 1500, "cluster": True}
        logs = [tmp_path / f"m{i}.log" for i in range(2)]
        procs = [spawn_member(spec, log) for log in logs]
        results = finish_members(procs, logs, timeout=60)
        check_complete(outputs(system), 100)
        assert sum(r["processed"] for r in results) >= P * 100
        system.close()
    finally:
        kill_all(procs)
        nodes.kill()


def test_run_local_containers_starts_n_members(redis_server: RedisServer, tmp_path: Path) -> None:
    from redis_support import MEMBER_MAIN

    from tailrace.redis.membership import run_local_containers

    system = setup_streams(redis_server.url)
    fill(system, 0, 50, end=True)
    spec = {"url": redis_server.url, "job": "local", "partitions": P, "lease_ms": 1500}
    import sys

    codes = run_local_containers(2, [sys.executable, MEMBER_MAIN, json.dumps(spec)], env={**os.environ})
    assert codes == [0, 0]
    check_complete(outputs(system), 50)
    system.close()


def test_a_graceful_leave_hands_partitions_over_without_replay(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # rule 19 across containers: SIGTERM commits and releases, so the other member takes
    # over at its next heartbeat (long before the 60 s lease would expire), nothing twice
    system = setup_streams(redis_server.url)
    fill(system, 0, 150, end=True)
    spec = {"url": redis_server.url, "job": "leave", "partitions": P, "lease_ms": 60000, "task": "slow"}
    logs = [tmp_path / f"m{i}.log" for i in range(2)]
    procs = [spawn_member(spec, log) for log in logs]
    try:
        leaving, staying = procs
        name = f"m{leaving.pid}"
        assert wait_for(lambda: sum(m["by"] == name for m in outputs(system)) >= 30, 30)
        leaving.send_signal(signal.SIGTERM)
        left = finish_members([leaving], [logs[0]], timeout=15)[0]
        assert left["reason"] == "stop"
        finish_members([staying], [logs[1]], timeout=40)  # would wait out the lease without the release
    finally:
        kill_all(procs)
    copies = check_complete(outputs(system), 150)
    assert max(copies.values()) == 1
    system.close()


def test_a_join_and_a_graceful_leave_are_acted_on_between_heartbeats(redis_server: RedisServer) -> None:
    # heartbeats every 60 s: none falls inside this test, so every hand-over below
    # comes from the membership watch between heartbeats (Member.WATCH_S)
    from tailrace import StreamTask
    from tailrace.redis.membership import Member, MemberSpec

    system = setup_streams(redis_server.url)

    class Forward(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            collector.send("redis.out", envelope.message)

    def member(name: str) -> Member:
        return Member(
            MemberSpec(
                task=Forward,
                inputs=["redis.in"],
                systems=lambda: [RedisSystem("redis", redis_server.url, streams={"in": P})],
                url=redis_server.url,
                config={"job.name": "watch", "task.commit.ms": 100},
                lease_ms=180_000,
                heartbeat_ms=60_000,
                member_id=name,
                exit_when_done=False,
            )
        )

    def owners() -> list[str | None]:
        values = [system.client.get(system.keys.lease("in", p, "watch")) for p in range(P)]
        return [None if v is None else v.decode().split("|")[0] for v in values]

    a, b = member("a"), member("b")
    errors: list[BaseException] = []

    def run(m: Member) -> None:
        try:
            m.run()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(m,)) for m in (a, b)]
    threads[0].start()
    try:
        assert wait_for(lambda: owners() == ["a"] * P, 20), owners()
        threads[1].start()  # joins: "a" hands over the odd partitions
        assert wait_for(lambda: owners() == ["a", "b"] * (P // 2), 20), owners()
        fill(system, 0, 20, end=False)
        assert wait_for(lambda: len(outputs(system)) == P * 20, 20)
        b.stop()  # leaves gracefully: "a" takes everything back
        threads[1].join(20)
        assert wait_for(lambda: owners() == ["a"] * P, 20), owners()
        fill(system, 20, 20, end=False)
        assert wait_for(lambda: len(outputs(system)) == P * 40, 20)
    finally:
        for m in (a, b):
            m.stop()
        for t in threads:
            if t.is_alive():
                t.join(30)
    assert not errors
    assert sorted((m["p"], m["i"]) for m in outputs(system)) == [(p, i) for p in range(P) for i in range(40)]
    system.close()


def test_a_member_with_nothing_to_run_plans_again_soon_then_less_often(redis_server: RedisServer) -> None:
    # its partitions done or held by another: it looks again after 10 ms, then twice as long
    # each time up to Member.WATCH_S, so a job's end or a partition let go is seen at once
    # without a member that waits long polling Redis every 10 ms
    from tailrace import StreamTask
    from tailrace.redis.membership import Member, MemberSpec

    system = setup_streams(redis_server.url)
    m = Member(
        MemberSpec(
            task=StreamTask,
            inputs=["redis.in"],
            systems=lambda: [RedisSystem("redis", redis_server.url, streams={"in": P})],
            url=redis_server.url,
            config={"job.name": "idle"},
            lease_ms=180_000,
            heartbeat_ms=60_000,
            member_id="idle",
            exit_when_done=False,
        )
    )
    leases = [system.keys.lease("in", p, "idle") for p in range(P)]
    for key in leases:
        system.client.set(key, "other|1", px=60_000)  # another member holds every partition
    waits: list[float] = []
    m._cond.wait_for = lambda predicate, timeout: waits.append(timeout) or False  # type: ignore[method-assign]
    m._join()
    try:
        for _ in range(6):
            assert m._plan() == []
        assert waits == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.1, 0.1])
        system.client.delete(*leases)  # let go: taken at the next plan
        assert m._plan() == list(range(P)) and len(waits) == 6
        for p in range(P):
            m._release(p)
            system.client.set(leases[p], "other|2", px=60_000)
        assert m._plan() == [] and waits[-1] == pytest.approx(0.01)  # soon again after a run
    finally:
        m._leave()
    system.close()
