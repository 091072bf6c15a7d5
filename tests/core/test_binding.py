"""The Cython binding of the C primitives: error mapping, wrappers, ownership.

Refcount checks pin the ownership comments in _primitives.pxi and _types.pxi:
an object held by C is pinned by exactly one reference, released exactly once.
"""

from __future__ import annotations

import gc
import pickle
import sys
import threading
from typing import Any

import pytest

from tailrace import CoreError, Envelope, Scope, SystemStreamPartition, _core


def test_status_names_map_to_core_error():
    assert _core.status_name(0) == "TR_OK"
    assert _core.status_name(1) == "TR_EAGAIN"
    assert "unknown" in _core.status_str(999).lower()
    seq = _core.Sequencer(1)
    seq.acquire()
    with pytest.raises(CoreError) as info:  # rule 2: at most max concurrency outstanding
        seq.acquire()
    assert info.value.name == "TR_EAGAIN"
    assert info.value.status == 1


def test_invalid_arguments_raise_core_error():
    with pytest.raises(CoreError, match="TR_EINVAL"):
        _core.Sequencer(0)
    w = _core.Watermark(2)
    with pytest.raises(CoreError, match="TR_EINVAL"):
        w.advance(5, 0, 0)


# rule 12, rule 15, rule 17
def test_sequencer_wrapper_releases_in_order_and_stops_after_commit():
    s = _core.Sequencer(4)
    seqs = [s.acquire(0, 100 + i) for i in range(4)]
    assert seqs == [0, 1, 2, 3]
    assert s.complete(2) == 0
    assert s.complete(1, 1) == 0  # TR_SEQ_COMMIT
    assert s.release() == []  # 0 is still pending: a gap holds everything
    assert s.complete(0) == 0
    assert s.complete(0) == 5  # TR_EALREADY: double completion is refused
    assert s.complete(9) == 6  # TR_EUNKNOWN: never handed out
    assert [r[0] for r in s.release()] == [0, 1]  # stops right after the commit request
    assert [r[0] for r in s.release()] == [2]
    assert s.outstanding == 1 and s.released_upto == 3


# rule 18
def test_failed_completion_blocks_release():
    s = _core.Sequencer(2)
    a, b = s.acquire(), s.acquire()
    assert s.complete(b) == 0
    assert s.complete(a, 2) == 0  # TR_SEQ_FAILED
    assert s.release() == []
    assert s.head_failed() == a


# rule 13
def test_watermark_wrapper_never_regresses():
    w = _core.Watermark(1)
    assert w.get(0) is None
    w.advance(0, 3, 42)
    with pytest.raises(CoreError, match="TR_EREGRESS"):
        w.advance(0, 2, 41)
    assert w.get(0) == (3, 42)
    assert w.dirty
    w.mark_committed(0, 3, 42)
    assert w.committed(0) == (3, 42) and not w.dirty
    with pytest.raises(CoreError, match="TR_EREGRESS"):
        w.mark_committed(0, 4, 43)  # past the low watermark: never commit past incomplete work


def test_object_queue_pins_exactly_one_reference():
    q = _core.ObjectQueue(4)
    obj = object()
    base = sys.getrefcount(obj)
    assert q.push(obj)
    assert sys.getrefcount(obj) == base + 1  # pinned while queued
    out = q.pop()
    assert out is obj
    del out
    assert sys.getrefcount(obj) == base  # handed back, not leaked


def test_object_queue_full_stores_nothing_and_dealloc_releases():
    q = _core.ObjectQueue(2)
    objs = [object() for _ in range(3)]
    bases = [sys.getrefcount(o) for o in objs]
    assert q.push(objs[0]) and q.push(objs[1])
    assert not q.push(objs[2])  # rule 6: full means refused, never dropped silently
    assert sys.getrefcount(objs[2]) == bases[2]
    del q
    gc.collect()
    assert [sys.getrefcount(o) for o in objs] == bases


def test_object_queue_many_producers_keep_per_producer_order():
    q = _core.ObjectQueue(64)
    n, producers = 2000, 3
    done = threading.Event()

    def produce(pid: int) -> None:
        for i in range(n):
            while not q.push((pid, i)):
                pass

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    seen = [0] * producers
    got = 0
    while got < n * producers:
        try:
            pid, i = q.pop(timeout=1.0)
        except IndexError:
            continue
        assert i == seen[pid]  # per-producer order, no loss, no duplicate
        seen[pid] += 1
        got += 1
    for t in threads:
        t.join()
    done.set()
    assert seen == [n] * producers
    with pytest.raises(IndexError):
        q.pop()


def test_envelope_fields_equality_pickle():
    e = Envelope("mem", "in", 3, 7, "k", {"v": 1})
    assert (e.system, e.stream, e.partition, e.offset, e.key, e.message) == ("mem", "in", 3, 7, "k", {"v": 1})
    assert e.ssp == SystemStreamPartition("mem", "in", 3)
    assert e == Envelope("mem", "in", 3, 7, "k", {"v": 1})
    assert pickle.loads(pickle.dumps(e)) == e
    with pytest.raises(AttributeError):
        e.offset = 8  # type: ignore[misc]
    assert "offset=7" in repr(e)


def test_envelope_fields_are_member_descriptors_a_task_reads_without_a_getter():
    # system, stream, key and message are slots (CPython specialises reading them in a
    # task's process: LOAD_ATTR_SLOT), read-only, and right for every way an envelope is made
    for name in ("system", "stream", "key", "message"):
        assert type(Envelope.__dict__[name]).__name__ == "member_descriptor", name
    made = Envelope("mem", "in", 3, 7, "k", {"v": 1})
    (fast,) = _core.make_envelopes("mem", "in", 3, 7, [{"v": 1}], ["k"])
    for e in (made, fast, pickle.loads(pickle.dumps(made))):
        assert (e.system, e.stream, e.key, e.message) == ("mem", "in", "k", {"v": 1})
        for name in ("system", "stream", "key", "message"):
            with pytest.raises(AttributeError):
                setattr(e, name, "x")
            with pytest.raises(AttributeError):
                delattr(e, name)
        assert e.message == {"v": 1}  # unchanged by the refused writes

    def read(env: Envelope) -> object:  # specialised after a few calls: still the right field
        return (env.system, env.stream, env.key, env.message)

    for i in range(50):
        (e,) = _core.make_envelopes("s", f"t{i}", 0, i, [i], [str(i)])
        assert read(e) == ("s", f"t{i}", str(i), i)
    bare = Envelope.__new__(Envelope)  # no __init__: fields are None, not missing
    assert (bare.system, bare.stream, bare.key, bare.message) == (None, None, None, None)


def test_envelopes_with_c_int_offsets_are_the_same_as_constructed_ones():
    # inputs with int offsets (files, memory) keep the offset as a C integer until read
    big = 2**63 - 1
    for first in (0, 7, 2**62 + 5, big):
        (e,) = _core.make_envelopes("mem", "in", 3, first, [{"v": 1}], ["k"])
        made = Envelope("mem", "in", 3, first, "k", {"v": 1})
        assert type(e.offset) is int and e.offset == first
        assert e == made and made == e and hash(e) == hash(made)
        assert pickle.loads(pickle.dumps(e)) == made
        assert repr(e) == repr(made) and f"offset={first}" in repr(e)
        with pytest.raises(AttributeError):
            e.offset = 8  # type: ignore[misc]
    e.__init__("mem", "in", 3, "id-1", "k", "v")  # type: ignore[misc]  # re-initialised: its new offset
    assert e.offset == "id-1"


def test_make_envelopes_owns_its_references():
    msgs = [object() for _ in range(5)]
    keys = [object() for _ in range(5)]
    base_m = [sys.getrefcount(m) for m in msgs]
    envs = _core.make_envelopes("mem", "in", 0, 10, msgs, keys)
    assert [e.offset for e in envs] == list(range(10, 15))
    after = [sys.getrefcount(m) for m in msgs]
    assert [a - b for a, b in zip(after, base_m)] == [1] * 5  # one per envelope
    del envs
    gc.collect()
    assert [sys.getrefcount(m) for m in msgs] == base_m
    with pytest.raises(ValueError):
        _core.make_envelopes("mem", "in", 0, 0, msgs, keys[:2])


def test_envelopes_of_atomic_values_are_untracked_and_cycles_are_still_collected():
    import weakref

    envs = _core.make_envelopes("mem", "in", 0, 0, ["s", 1, 2.5, b"b", None, True, {}, [], (1,)])
    assert [gc.is_tracked(e) for e in envs] == [False] * 6 + [True] * 3
    assert not gc.is_tracked(Envelope("mem", "in", 0, "id-1", "k", "v"))
    e = Envelope("mem", "in", 0, 1, None, "v")
    e.__init__("mem", "in", 0, 1, None, [])  # re-initialised with a container: tracked again
    assert gc.is_tracked(e)

    class Message:
        env: Any = None

    m = Message()
    e = Envelope("mem", "in", 0, 1, None, m)
    m.env = e  # a cycle through the envelope
    alive = weakref.ref(m)
    del m, e
    gc.collect()
    assert alive() is None


# rule 14
def test_coordinator_records_widest_scope_and_take_clears():
    c = _core.Coordinator()
    assert c.commit_requested is None and c.shutdown_requested is None
    c.commit()
    c.commit(Scope.ALL_TASKS_IN_CONTAINER)
    c.shutdown(Scope.CURRENT_TASK)
    assert c.commit_requested is Scope.ALL_TASKS_IN_CONTAINER
    assert c.shutdown_requested is Scope.CURRENT_TASK
    bits = c.take()
    assert bits == _core.COMMIT_CURRENT | _core.COMMIT_ALL | _core.SHUTDOWN_CURRENT
    assert c.take() == 0
    with pytest.raises(ValueError, match="scope"):
        c.commit(3)
