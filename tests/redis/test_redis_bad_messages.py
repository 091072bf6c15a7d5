"""Bad messages on Redis Streams inputs (SEMANTICS rules 39, 40), both engines, a real
redis-server and Redis checkpoints: an entry the codec cannot decode under each
``task.error.policy``, dead letters to a Redis stream and to a file stream, and a dead
letter of a ``process`` failure holding the entry's bytes."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from redis_support import RedisServer

from tailrace import Container, InputError, StreamTask, SystemStreamPartition
from tailrace.files import FileSystem, read_stream
from tailrace.redis.checkpoint import RedisCheckpointStore
from tailrace.redis.system import RedisSystem

ENGINES = ["c", "python"]
JOB = "tailrace-job"  # the default job.name
SSPS = [SystemStreamPartition("redis", "in", p) for p in range(2)]
BAD_VALUE = b"{not json"
BAD_KEY = b"\xff\xfe"  # not UTF-8: a key json cannot decode (and bytes no text holds)


class Forward(StreamTask):
    """Sends each message on; raises on the one marked ``boom``."""

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        m = envelope.message
        if m.get("boom"):
            raise ValueError(f"boom at {m['i']}")
        collector.send("redis.out", m, key=m["p"])


def _fill(system: RedisSystem, boom: int | None = None) -> dict[int, list[str]]:
    """Two partitions of 20 entries {"p", "i"}: in partition 0 entry 5's message and entry
    12's key cannot be decoded; ``boom``: that entry of partition 1 makes process raise."""
    system.create_stream("in", 2)
    system.create_stream("out", 1)
    ids: dict[int, list[str]] = {0: [], 1: []}
    for p in range(2):
        key = system.keys.stream("in", p)
        for i in range(20):
            if (p, i) == (0, 5):
                eid = system.client.xadd(key, {"m": BAD_VALUE})
            elif (p, i) == (0, 12):
                eid = system.client.xadd(key, {"m": json.dumps({"p": p, "i": i}), "k": BAD_KEY})
            else:
                m: dict[str, Any] = (
                    {"p": p, "i": i, "boom": True} if (p, i) == (1, boom) else {"p": p, "i": i}
                )
                eid = system.append("in", p, m)
            ids[p].append(eid if isinstance(eid, str) else eid.decode())
    system.end_stream("in")
    return ids


def _run(server: RedisServer, engine: str, *extra: Any, **config: Any) -> Any:
    return Container(
        Forward,
        inputs=["redis.in"],
        systems=[RedisSystem("redis", server.url), *extra],
        checkpoints=RedisCheckpointStore(server.url, inputs=SSPS),
        engine=engine,
        task_commit_ms=600000,
        **config,
    )


def _committed(system: RedisSystem, p: int) -> str | None:
    raw = system.client.get(system.keys.checkpoint("in", p, JOB))
    return None if raw is None else raw.decode()


def _out(system: RedisSystem) -> list[tuple[int, int]]:
    return sorted((m["p"], m["i"]) for _, _, m in system.read_all("out", 0))


GOOD = [(p, i) for p in range(2) for i in range(20) if (p, i) not in {(0, 5), (0, 12)}]


@pytest.mark.parametrize("ordering", ["partition", "key"])
@pytest.mark.parametrize("engine", ENGINES)
def test_fail_stops_at_an_undecodable_entry_with_everything_before_it_committed(
    redis_server: RedisServer, engine: str, ordering: str
) -> None:
    # rules 39, 40: the default policy stops the container with an InputError naming the
    # entry, the partition and the codec; its partition's checkpoint is the entry before
    # it, with or without key ordering
    system = RedisSystem("redis", redis_server.url)
    ids = _fill(system)
    with pytest.raises(InputError) as info:
        _run(redis_server, engine, task_ordering=ordering).run()
    text = str(info.value)
    assert ids[0][5] in text and "redis.in[0]" in text and "'json'" in text, text
    assert "task.error.policy" in text
    assert _committed(system, 0) == ids[0][4]
    assert (0, 5) not in _out(system) and (0, 4) in _out(system)
    system.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_skip_counts_undecodable_entries_and_processes_everything_else(
    redis_server: RedisServer, engine: str
) -> None:
    system = RedisSystem("redis", redis_server.url)
    ids = _fill(system)
    result = _run(redis_server, engine, task_error_policy="skip").run()
    assert result.reason == "end_of_stream"
    assert _out(system) == GOOD
    assert result.tasks["Partition 0"].skipped == 2 and result.tasks["Partition 1"].skipped == 0
    assert [_committed(system, p) for p in range(2)] == [ids[0][-1], ids[1][-1]]
    system.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_dead_letters_of_undecodable_entries_go_to_a_redis_stream_with_their_bytes(
    redis_server: RedisServer, engine: str
) -> None:
    system = RedisSystem("redis", redis_server.url)
    ids = _fill(system)
    result = _run(redis_server, engine, task_error_policy="dead-letter", task_error_stream="redis.dead").run()
    assert _out(system) == GOOD
    assert result.tasks["Partition 0"].dead_lettered == 2
    letters = [m for p in range(system.partitions("dead")) for _, _, m in system.read_all("dead", p)]
    by_offset = {d["offset"]: d for d in letters}
    assert sorted(by_offset) == sorted([ids[0][5], ids[0][12]])
    for i, raw in ((5, BAD_VALUE), (12, json.dumps({"p": 0, "i": 12}).encode())):
        d = by_offset[ids[0][i]]
        assert (d["system"], d["stream"], d["partition"], d["key"]) == ("redis", "in", 0, None)
        assert d["bytes"].encode() == raw and "value" not in d
        assert d["error"]["type"] == "tailrace.errors.InputError" and ids[0][i] in d["error"]["message"]
    assert "its key (field k)" in by_offset[ids[0][12]]["error"]["message"]
    assert [_committed(system, p) for p in range(2)] == [ids[0][-1], ids[1][-1]]
    system.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_dead_letters_of_redis_entries_go_to_a_file_stream(
    redis_server: RedisServer, engine: str, tmp_path: Path
) -> None:
    # the error stream may be another system's; bytes that are not UTF-8 as bytes_base64
    system = RedisSystem("redis", redis_server.url)
    system.create_stream("in", 2)
    system.create_stream("out", 1)
    key = system.keys.stream("in", 1)
    system.append("in", 1, {"p": 1, "i": 0})
    bad = system.client.xadd(key, {"m": b"\xff\x00"}).decode()
    last = system.append("in", 1, {"p": 1, "i": 2})
    system.end_stream("in")
    files = FileSystem("files", tmp_path / "data")
    result = _run(
        redis_server, engine, files, task_error_policy="dead-letter", task_error_stream="files.dead"
    ).run()
    assert result.reason == "end_of_stream"
    assert _out(system) == [(1, 0), (1, 2)]
    (letter,) = [d for part in read_stream(tmp_path / "data" / "dead") for d in part]
    assert letter["offset"] == bad and letter["partition"] == 1 and letter["stream"] == "in"
    assert base64.b64decode(letter["bytes_base64"]) == b"\xff\x00"
    assert letter["error"]["type"] == "tailrace.errors.InputError" and bad in letter["error"]["message"]
    assert _committed(system, 1) == last
    system.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_process_failure_is_dead_lettered_to_a_redis_stream_with_the_entry_bytes(
    redis_server: RedisServer, engine: str
) -> None:
    # the reader reads the entry's bytes back (XRANGE of its id): the dead letter holds them
    system = RedisSystem("redis", redis_server.url)
    ids = _fill(system, boom=7)
    result = _run(redis_server, engine, task_error_policy="dead-letter", task_error_stream="redis.dead").run()
    assert _out(system) == [x for x in GOOD if x != (1, 7)]
    letters = [m for p in range(system.partitions("dead")) for _, _, m in system.read_all("dead", p)]
    (boom,) = [d for d in letters if d["partition"] == 1]
    assert boom["offset"] == ids[1][7] and boom["key"] is None
    assert json.loads(boom["bytes"]) == {"p": 1, "i": 7, "boom": True}
    assert boom["error"]["type"] == "ValueError" and boom["error"]["message"] == "boom at 7"
    assert __file__.rstrip("c") in boom["error"]["frame"]
    assert result.tasks["Partition 1"].dead_lettered == 1 and result.tasks["Partition 0"].dead_lettered == 2
    system.close()
