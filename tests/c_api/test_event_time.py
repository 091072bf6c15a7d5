"""The event-time watermark coalescer (csrc/src/event_time.c, SEMANTICS rules 33, 37)
through cffi: the rule's cases, then a hypothesis property that the C code computes exactly
what the reference engine's tailrace.engine.event_time.EventTime does, operation by operation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailrace.engine.event_time import END, NONE, EventTime

MS = 1_000_000  # ns per ms


@pytest.fixture
def make(capi: Any) -> Any:
    ffi, lib = capi.ffi, capi.lib
    made: list[Any] = []

    def _make(n: int, lag_ms: int = 0, idle_ms: int = 0, start_ms: int = 0) -> Any:
        out = ffi.new("tr_event_time **")
        assert lib.tr_event_time_create(n, lag_ms, idle_ms * MS, start_ms * MS, out) == lib.TR_OK
        made.append(out[0])
        return out[0]

    yield _make
    for et in made:
        lib.tr_event_time_destroy(et)


def test_constants_match_the_python_mirror(capi: Any) -> None:
    assert (capi.lib.TR_ET_NONE, capi.lib.TR_ET_END) == (NONE, END)


def test_create_refuses_a_negative_lag(capi: Any) -> None:
    out = capi.ffi.new("tr_event_time **")
    assert capi.lib.tr_event_time_create(1, -1, 0, 0, out) == capi.lib.TR_EINVAL


def test_rule33_minimum_over_partitions_minus_the_lag(capi: Any, make: Any) -> None:
    lib = capi.lib
    et = make(2, lag_ms=100)
    assert lib.tr_event_time_get(et) == NONE
    lib.tr_event_time_read(et, 0, 5000, 0)
    assert lib.tr_event_time_get(et) == NONE  # partition 1 read nothing yet: it holds it
    lib.tr_event_time_read(et, 1, 3000, 0)
    assert lib.tr_event_time_get(et) == 2900
    lib.tr_event_time_read(et, 1, 2000, 0)  # out of order: the largest read counts
    assert lib.tr_event_time_get(et) == 2900 and lib.tr_event_time_partition(et, 1) == 2900
    lib.tr_event_time_read(et, 1, 9000, 0)
    assert lib.tr_event_time_get(et) == 4900
    assert lib.tr_event_time_read(et, 2, 1, 0) == lib.TR_EINVAL


def test_rule33_an_idle_partition_is_skipped_and_cannot_lower_it_back(capi: Any, make: Any) -> None:
    lib = capi.lib
    et = make(2, idle_ms=1000)
    lib.tr_event_time_read(et, 0, 100, 0)
    lib.tr_event_time_read(et, 1, 50, 0)
    lib.tr_event_time_read(et, 0, 700, 10 * MS)
    lib.tr_event_time_empty(et, 1, 10 * MS)  # its empty streak begins at 10 ms
    assert lib.tr_event_time_update(et, 1009 * MS) == 50
    assert lib.tr_event_time_update(et, 1010 * MS) == 700  # idle: skipped
    lib.tr_event_time_read(et, 1, 60, 1020 * MS)  # back, behind: the watermark stays
    assert lib.tr_event_time_get(et) == 700 and lib.tr_event_time_partition(et, 1) == 60
    lib.tr_event_time_read(et, 0, 900, 1030 * MS)
    assert lib.tr_event_time_get(et) == 700  # partition 1 holds it again (at 60)
    lib.tr_event_time_read(et, 1, 800, 1040 * MS)
    assert lib.tr_event_time_get(et) == 800


def test_rule33_never_read_is_idle_from_the_start_and_all_idle_takes_the_largest(
    capi: Any, make: Any
) -> None:
    lib = capi.lib
    et = make(3, idle_ms=500, start_ms=1000)
    lib.tr_event_time_read(et, 0, 40, 1100 * MS)
    assert lib.tr_event_time_update(et, 1499 * MS) == NONE
    assert lib.tr_event_time_update(et, 1500 * MS) == 40  # 1 and 2: idle since the start
    lib.tr_event_time_empty(et, 0, 1600 * MS)
    lib.tr_event_time_read(et, 1, 30, 1600 * MS)  # 1 is back, behind: no regression
    assert lib.tr_event_time_update(et, 2100 * MS) == 40  # every one not at end idle: largest
    lib.tr_event_time_read(et, 2, 90, 2200 * MS)
    assert lib.tr_event_time_update(et, 2700 * MS) == 40  # 1 (read at 1600, at 30) holds it
    lib.tr_event_time_empty(et, 1, 2700 * MS)
    assert lib.tr_event_time_update(et, 3200 * MS) == 90  # 0 and 1 idle: 2 alone counts


def test_rule37_end_of_every_partition_is_plus_infinity(capi: Any, make: Any) -> None:
    lib = capi.lib
    et = make(2)
    lib.tr_event_time_read(et, 0, 10, 0)
    lib.tr_event_time_ended(et, 0, 0)
    assert lib.tr_event_time_get(et) == NONE  # partition 1 never read, not idle (idle off)
    lib.tr_event_time_read(et, 1, 20, 0)
    assert lib.tr_event_time_get(et) == 20  # an ended partition is +infinity
    lib.tr_event_time_ended(et, 1, 0)
    assert lib.tr_event_time_get(et) == END


def test_rule33_floor_resumes_from_the_committed_value(capi: Any, make: Any) -> None:
    lib = capi.lib
    et = make(1, lag_ms=10)
    lib.tr_event_time_floor(et, 500)
    lib.tr_event_time_read(et, 0, 100, 0)
    assert lib.tr_event_time_get(et) == 500
    lib.tr_event_time_read(et, 0, 800, 0)
    assert lib.tr_event_time_get(et) == 790


_ops = st.lists(
    st.tuples(
        st.sampled_from(["read", "read", "read", "empty", "ended", "update", "floor"]),
        st.integers(0, 3),  # partition
        st.integers(-50, 10_000),  # timestamp / floor
        st.integers(0, 300),  # ms the clock moves first
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 4),
    lag=st.integers(0, 500),
    idle=st.sampled_from([0, 1, 100, 1000]),
    ops=_ops,
    bad=st.booleans(),
)
def test_rule33_the_c_coalescer_is_the_reference_engines(
    capi: Any, n: int, lag: int, idle: int, ops: list[Any], bad: bool
) -> None:
    ffi, lib = capi.ffi, capi.lib
    out = ffi.new("tr_event_time **")
    assert lib.tr_event_time_create(n, lag, idle * MS, 0, out) == lib.TR_OK
    et, model = out[0], EventTime(n, lag, idle * MS, 0)
    now = 0
    try:
        for op, p, ts, dt in ops:
            now += dt * MS
            p %= n
            if op == "read":
                lib.tr_event_time_read(et, p, NONE if bad and ts < 0 else ts, now)
                model.read(p, NONE if bad and ts < 0 else ts, now)
            elif op == "empty":
                lib.tr_event_time_empty(et, p, now)
                model.empty(p, now)
            elif op == "ended":
                lib.tr_event_time_ended(et, p, now)
                model.ended(p, now)
            elif op == "update":
                assert lib.tr_event_time_update(et, now) == model.update(now)
            else:
                lib.tr_event_time_floor(et, ts)
                model.floor(ts)
            assert lib.tr_event_time_get(et) == model.value
            marks = [lib.tr_event_time_partition(et, i) for i in range(n)]
            assert marks == [model.partition(i) for i in range(n)]
    finally:
        lib.tr_event_time_destroy(et)


def test_rule35_tracking_follows_messages_handed_over_not_read(capi: Any, make: Any) -> None:
    # tracking (windows, event-time timers): a message read ahead into the buffer moves
    # nothing until the task gets it; an ended partition counts as +infinity, and an empty
    # one as idle, only once it is drained
    lib = capi.lib
    et = make(2, idle_ms=100)
    lib.tr_event_time_track(et)
    assert lib.tr_event_time_tracking(et) == 1
    lib.tr_event_time_read_n(et, 0, 9000, 3, 0)  # 1000, 9000, 2000 read
    lib.tr_event_time_read_n(et, 1, 500, 1, 0)
    assert lib.tr_event_time_get(et) == NONE  # nothing handed over yet
    lib.tr_event_time_seen(et, 0, 1000)
    lib.tr_event_time_done(et, 0)
    lib.tr_event_time_seen(et, 1, 500)
    assert lib.tr_event_time_update(et, 0) == 500
    lib.tr_event_time_ended(et, 1, 0)  # its message is in its call: not ended yet
    assert lib.tr_event_time_get(et) == 500
    lib.tr_event_time_done(et, 1)  # drained: +infinity
    assert lib.tr_event_time_update(et, 0) == 1000
    lib.tr_event_time_seen(et, 0, 9000)
    lib.tr_event_time_done(et, 0)
    assert lib.tr_event_time_update(et, 0) == 9000
    lib.tr_event_time_empty(et, 0, 0)
    lib.tr_event_time_ended(et, 0, 0)  # one message (2000) still buffered: not ended yet
    assert lib.tr_event_time_update(et, 10**12) == 9000
    lib.tr_event_time_seen(et, 0, 2000)
    assert lib.tr_event_time_update(et, 10**12) == 9000  # in its call
    lib.tr_event_time_done(et, 0)
    assert lib.tr_event_time_update(et, 10**12) == END


_tracked_ops = st.lists(
    st.tuples(
        st.sampled_from(["read", "read", "seen", "seen", "done", "done", "empty", "ended", "update"]),
        st.integers(0, 3),  # partition
        st.integers(-50, 10_000),  # timestamp
        st.integers(0, 3),  # messages read
        st.integers(0, 300),  # ms the clock moves first
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 4), lag=st.integers(0, 500), idle=st.sampled_from([0, 1, 100]), ops=_tracked_ops)
def test_rule35_tracking_in_c_is_the_reference_engines(
    capi: Any, n: int, lag: int, idle: int, ops: list[Any]
) -> None:
    ffi, lib = capi.ffi, capi.lib
    out = ffi.new("tr_event_time **")
    assert lib.tr_event_time_create(n, lag, idle * MS, 0, out) == lib.TR_OK
    et, model = out[0], EventTime(n, lag, idle * MS, 0, track=True)
    lib.tr_event_time_track(et)
    now = 0
    try:
        for op, p, ts, count, dt in ops:
            now += dt * MS
            p %= n
            if op == "read":
                lib.tr_event_time_read_n(et, p, ts, count, now)
                model.read(p, ts, now, count)
            elif op == "seen":
                lib.tr_event_time_seen(et, p, ts)
                lib.tr_event_time_update(et, now)
                model.seen(p, ts, now)
            elif op == "done":
                lib.tr_event_time_done(et, p)
                lib.tr_event_time_update(et, now)
                model.done(p, now)
            elif op == "empty":
                lib.tr_event_time_empty(et, p, now)
                model.empty(p, now)
            elif op == "ended":
                lib.tr_event_time_ended(et, p, now)
                model.ended(p, now)
            else:
                assert lib.tr_event_time_update(et, now) == model.update(now)
            assert lib.tr_event_time_get(et) == model.value
            assert [lib.tr_event_time_partition(et, i) for i in range(n)] == [
                model.partition(i) for i in range(n)
            ]
    finally:
        lib.tr_event_time_destroy(et)
