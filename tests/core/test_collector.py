"""Collector.send routing (the compiled collector both engines hand to tasks)."""

from __future__ import annotations

import threading
import zlib

import pytest

from tailrace import MemorySystem
from tailrace.collector import Collector, key_partition


def _collector(partitions: int = 4, default: str | None = None) -> tuple[Collector, MemorySystem]:
    mem = MemorySystem(output_partitions=partitions)
    return Collector({"mem": mem.producer()}, default), mem


def test_explicit_partition_key_hash_and_round_robin() -> None:
    col, mem = _collector(4)
    col.send("mem.out", "p2", partition=2)
    col.send("mem.out", "k", key="user-7")
    col.send("mem.out", "kb", key=b"user-7")  # the same bytes: the same partition
    for i in range(8):
        col.send("mem.out", f"rr{i}")
    by_key = zlib.crc32(b"user-7") % 4
    assert key_partition("user-7", 4) == key_partition(b"user-7", 4) == by_key
    assert mem.records("out", 2)[0] == (None, "p2")
    assert ("user-7", "k") in mem.records("out", by_key)
    assert (b"user-7", "kb") in mem.records("out", by_key)
    for p in range(4):  # round robin: two of the eight on each partition, in order
        assert [m for k, m in mem.records("out", p) if m.startswith("rr")] == [f"rr{p}", f"rr{p + 4}"]
    assert col.sent == 11


def test_keys_of_other_types_hash_their_repr_stably() -> None:
    assert key_partition(12345, 7) == zlib.crc32(b"12345") % 7
    assert key_partition(("a", 1), 7) == zlib.crc32(repr(("a", 1)).encode()) % 7


def test_bare_stream_names_go_to_the_default_system() -> None:
    col, mem = _collector(1, default="mem")
    col.send("out", "x")
    assert mem.messages("out") == ["x"]


@pytest.mark.parametrize("partition", [4, -1, 100])
def test_a_partition_the_stream_does_not_have_is_refused(partition: int) -> None:
    col, mem = _collector(4)
    with pytest.raises(ValueError, match=rf"'mem.out' has no partition {partition} \(it has 4\)"):
        col.send("mem.out", "x", partition=partition)
    assert col.sent == 0 and mem.messages("out") == []


def test_unknown_systems_and_malformed_names_are_refused_naming_them() -> None:
    col, _ = _collector(2)
    with pytest.raises(ValueError, match=r"no system 'other' for stream 'other.out' \(systems: mem\)"):
        col.send("other.out", "x")
    with pytest.raises(ValueError, match=r"collector.send: stream 'out' must be written as 'system.stream'"):
        col.send("out", "x")
    with pytest.raises(ValueError, match=r"must be written as 'system.stream'"):
        col.send("mem.", "x")
    assert col.sent == 0


def test_round_robin_from_many_threads_spreads_exactly_evenly() -> None:
    # send is safe from any thread: each call takes its own round-robin turn
    col, mem = _collector(4)
    threads = [
        threading.Thread(target=lambda: [col.send("mem.out", i) for i in range(5000)]) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert col.sent == 20000
    assert [len(mem.messages("out", p)) for p in range(4)] == [5000] * 4


def test_remembered_str_key_partitions_match_the_hash_past_the_bound() -> None:
    # a route remembers str keys' partitions (bounded: it starts over past 65,536 keys);
    # every send, remembered or not, goes where key_partition says
    class Sub(str):
        pass

    col, mem = _collector(7)
    keys: list[object] = [f"user-{i}" for i in range(70_000)]
    keys += ["user-1", "user-69999", Sub("user-3"), b"user-4", 5, ("t", 1)]
    for k in keys:
        col.send("mem.out", "m", key=k)
    got = [k for p in range(7) for k, _ in mem.records("out", p) if key_partition(k, 7) != p]
    assert got == []
    assert sum(len(mem.records("out", p)) for p in range(7)) == len(keys)


def test_sends_that_switch_streams_or_build_the_name_each_time_go_where_named() -> None:
    # a collector keeps the route of its last send and reuses it for the same name
    # object: switching streams, names built at run time (equal strings, other objects)
    # and bare names on the default system must still land where named
    col, mem = _collector(2, default="mem")
    parts = ["a", "b"]
    sent: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(40):
        s = parts[(i // 3) % 2]
        name = ("mem." + s, "".join(["mem.", s]), s, f"mem.{s}")[i % 4]
        col.send(name, i, partition=i % 2)
        sent[s].append(i)
    for s in parts:
        assert sorted(m for p in range(2) for m in mem.messages(s, p)) == sent[s]
    assert col.sent == 40
    with pytest.raises(ValueError, match="no system 'other'"):
        col.send("other.a", "x")  # after a cached route: a bad name is still refused
    assert col.sent == 40
