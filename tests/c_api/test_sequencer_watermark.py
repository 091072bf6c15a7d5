"""tr_sequencer and tr_watermark through cffi: every status, a model-based state
machine driving both together as the loop does, and racing completions from
Python threads (cffi drops the GIL around each call)."""

import random
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)


@pytest.fixture
def sequencer(capi):
    ffi, lib = capi.ffi, capi.lib
    made = []

    def make(max_concurrency):
        out = ffi.new("tr_sequencer **")
        assert lib.tr_sequencer_create(max_concurrency, out) == lib.TR_OK
        made.append(out[0])
        return out[0]

    yield make
    for s in made:
        lib.tr_sequencer_destroy(s)


def acquire(capi, s, tag_a=0, tag_b=0):
    seq = capi.ffi.new("uint64_t *")
    rc = capi.lib.tr_sequencer_acquire(s, tag_a, tag_b, seq)
    return rc, seq[0]


def release(capi, s, max_n):
    out = capi.ffi.new("tr_seq_release[]", max(max_n, 1))
    n = capi.lib.tr_sequencer_release(s, out, max_n)
    return [(out[i].seq, out[i].tag_a, out[i].tag_b, out[i].flags) for i in range(n)]


def test_sequencer_create_statuses(capi):
    ffi, lib = capi.ffi, capi.lib
    out = ffi.new("tr_sequencer **")
    assert lib.tr_sequencer_create(0, out) == lib.TR_EINVAL
    assert lib.tr_sequencer_create(lib.TR_SEQ_MAX_CONCURRENCY + 1, out) == lib.TR_EINVAL
    assert lib.tr_sequencer_create(3, out) == lib.TR_OK
    assert lib.tr_sequencer_max_concurrency(out[0]) == 3
    lib.tr_sequencer_destroy(out[0])


# rule 2: at most max outstanding (acquired, not yet released).
def test_sequencer_limit(capi, sequencer):
    lib = capi.lib
    s = sequencer(2)
    assert acquire(capi, s) == (lib.TR_OK, 0)
    assert acquire(capi, s) == (lib.TR_OK, 1)
    assert acquire(capi, s)[0] == lib.TR_EAGAIN
    assert lib.tr_sequencer_complete(s, 1, 0) == lib.TR_OK
    assert acquire(capi, s)[0] == lib.TR_EAGAIN  # 0 is a gap: 1 is held, still outstanding
    assert lib.tr_sequencer_outstanding(s) == 2
    assert lib.tr_sequencer_next_seq(s) == 2


# rule 12, rule 15, rule 17, rule 18: every status of complete/release/head_failed.
def test_sequencer_statuses(capi, sequencer):
    ffi, lib = capi.ffi, capi.lib
    s = sequencer(8)
    assert lib.tr_sequencer_complete(s, 0, 0) == lib.TR_EUNKNOWN
    for i in range(5):
        assert acquire(capi, s, 10 + i, 20 + i) == (lib.TR_OK, i)
    assert lib.tr_sequencer_complete(s, 5, 0) == lib.TR_EUNKNOWN
    assert lib.tr_sequencer_complete(s, 2**64 - 1, 0) == lib.TR_EUNKNOWN
    assert lib.tr_sequencer_complete(s, 0, 0x10000) == lib.TR_EINVAL
    assert lib.tr_sequencer_complete(s, 1, lib.TR_SEQ_COMMIT | (0x7F << 8)) == lib.TR_OK
    assert lib.tr_sequencer_complete(s, 1, 0) == lib.TR_EALREADY
    assert release(capi, s, 8) == []  # gap at 0
    assert lib.tr_sequencer_complete(s, 0, 0) == lib.TR_OK
    assert lib.tr_sequencer_complete(s, 2, 0) == lib.TR_OK
    assert lib.tr_sequencer_complete(s, 3, lib.TR_SEQ_FAILED) == lib.TR_OK
    assert lib.tr_sequencer_complete(s, 3, lib.TR_SEQ_FAILED) == lib.TR_EALREADY
    assert lib.tr_sequencer_complete(s, 4, 0) == lib.TR_OK
    # rule 15: stops right after the commit-carrying completion
    assert release(capi, s, 8) == [(0, 10, 20, 0), (1, 11, 21, lib.TR_SEQ_COMMIT | (0x7F << 8))]
    assert lib.tr_sequencer_complete(s, 0, 0) == lib.TR_EALREADY  # released
    failed = ffi.new("uint64_t *")
    assert lib.tr_sequencer_head_failed(s, failed) == lib.TR_OK
    # rule 18: release stops before the failed one, for good
    assert release(capi, s, 8) == [(2, 12, 22, 0)]
    assert lib.tr_sequencer_head_failed(s, failed) == lib.TR_EFAILED
    assert failed[0] == 3
    assert release(capi, s, 8) == []
    assert lib.tr_sequencer_released_upto(s) == 3
    assert lib.tr_sequencer_outstanding(s) == 2


# rule 13: watermark statuses.
def test_watermark_statuses(capi):
    ffi, lib = capi.ffi, capi.lib
    out = ffi.new("tr_watermark **")
    assert lib.tr_watermark_create(2, out) == lib.TR_OK
    w = out[0]
    try:
        mark = ffi.new("tr_mark *")
        assert lib.tr_watermark_partitions(w) == 2
        assert lib.tr_watermark_get(w, 0, mark) == lib.TR_EAGAIN
        assert lib.tr_watermark_get(w, 2, mark) == lib.TR_EINVAL
        assert lib.tr_watermark_committed(w, 0, mark) == lib.TR_EAGAIN
        assert lib.tr_watermark_advance(w, 2, 0, 0) == lib.TR_EINVAL
        assert not lib.tr_watermark_dirty(w)
        assert lib.tr_watermark_advance(w, 0, 3, 33) == lib.TR_OK
        assert lib.tr_watermark_advance(w, 0, 3, 33) == lib.TR_EREGRESS
        assert lib.tr_watermark_advance(w, 0, 2, 22) == lib.TR_EREGRESS
        assert lib.tr_watermark_get(w, 0, mark) == lib.TR_OK
        assert (mark.position, mark.handle) == (3, 33)
        assert lib.tr_watermark_dirty(w)
        m = ffi.new("tr_mark *", {"position": 4, "handle": 44})[0]
        assert lib.tr_watermark_mark_committed(w, 0, m) == lib.TR_EREGRESS  # past the mark
        assert lib.tr_watermark_mark_committed(w, 1, m) == lib.TR_EREGRESS  # nothing completed
        assert lib.tr_watermark_mark_committed(w, 2, m) == lib.TR_EINVAL
        m.position, m.handle = 3, 33
        assert lib.tr_watermark_mark_committed(w, 0, m) == lib.TR_OK
        assert not lib.tr_watermark_dirty(w)
        assert lib.tr_watermark_committed(w, 0, mark) == lib.TR_OK
        assert (mark.position, mark.handle) == (3, 33)
        assert lib.tr_watermark_advance(w, 0, 5, 55) == lib.TR_OK
        m.position = 2
        assert lib.tr_watermark_mark_committed(w, 0, m) == lib.TR_EREGRESS  # backwards
    finally:
        lib.tr_watermark_destroy(w)


# rule 12, rule 13, rule 15, rule 17, rule 18: sequencer + watermark against a model.
class SequencerWatermarkMachine(RuleBasedStateMachine):
    NPART = 2

    def __init__(self, capi):
        super().__init__()
        self.ffi, self.lib = capi.ffi, capi.lib
        self.s = None

    @initialize(max_concurrency=st.integers(1, 8))
    def setup(self, max_concurrency):
        out = self.ffi.new("tr_sequencer **")
        assert self.lib.tr_sequencer_create(max_concurrency, out) == self.lib.TR_OK
        self.s = out[0]
        wout = self.ffi.new("tr_watermark **")
        assert self.lib.tr_watermark_create(self.NPART, wout) == self.lib.TR_OK
        self.w = wout[0]
        self.max = max_concurrency
        self.next_seq = 0
        self.released_upto = 0
        self.state = {}  # seq -> None (pending) or flags
        self.tags = {}  # seq -> (partition, position)
        self.next_pos = [0] * self.NPART
        self.wm = [None] * self.NPART  # model low watermark position
        self.committed = [None] * self.NPART

    def teardown(self):
        if self.s is not None:
            self.lib.tr_sequencer_destroy(self.s)
            self.lib.tr_watermark_destroy(self.w)

    def outstanding(self):
        return self.next_seq - self.released_upto

    @rule(partition=st.integers(0, NPART - 1))
    def acquire(self, partition):
        seq = self.ffi.new("uint64_t *")
        pos = self.next_pos[partition]
        rc = self.lib.tr_sequencer_acquire(self.s, partition, pos, seq)
        if self.outstanding() >= self.max:
            assert rc == self.lib.TR_EAGAIN  # rule 2
            return
        assert rc == self.lib.TR_OK and seq[0] == self.next_seq
        self.state[self.next_seq] = None
        self.tags[self.next_seq] = (partition, pos)
        self.next_pos[partition] += 1
        self.next_seq += 1

    @precondition(lambda self: self.outstanding() > 0)
    @rule(
        data=st.data(),
        commit=st.booleans(),
        failed=st.integers(0, 9),
        user=st.integers(0, 255),
    )
    def complete(self, data, commit, failed, user):
        seq = data.draw(st.integers(self.released_upto, self.next_seq - 1))
        flags = (user << 8) | (self.lib.TR_SEQ_COMMIT if commit else 0)
        if failed == 0:
            flags |= self.lib.TR_SEQ_FAILED
        rc = self.lib.tr_sequencer_complete(self.s, seq, flags)
        if self.state[seq] is None:
            assert rc == self.lib.TR_OK
            self.state[seq] = flags
        else:
            assert rc == self.lib.TR_EALREADY  # rule 17

    @precondition(lambda self: self.released_upto > 0)
    @rule(data=st.data())
    def complete_released(self, data):
        seq = data.draw(st.integers(0, self.released_upto - 1))
        assert self.lib.tr_sequencer_complete(self.s, seq, 0) == self.lib.TR_EALREADY  # rule 17

    @rule(offset=st.integers(0, 1000))
    def complete_unknown(self, offset):
        rc = self.lib.tr_sequencer_complete(self.s, self.next_seq + offset, 0)
        assert rc == self.lib.TR_EUNKNOWN

    @rule(flags=st.integers(0x10000, 0xFFFFFFFF))
    def complete_bad_flags(self, flags):
        assert self.lib.tr_sequencer_complete(self.s, self.released_upto, flags) == self.lib.TR_EINVAL

    @rule(max_n=st.integers(0, 10))
    def release(self, max_n):
        expected = []
        seq = self.released_upto
        while len(expected) < max_n and seq < self.next_seq:
            flags = self.state[seq]
            if flags is None or flags & self.lib.TR_SEQ_FAILED:
                break  # rule 12 (gap), rule 18 (failure)
            expected.append((seq, *self.tags[seq], flags))
            seq += 1
            if flags & self.lib.TR_SEQ_COMMIT:
                break  # rule 15
        out = self.ffi.new("tr_seq_release[]", max(max_n, 1))
        n = self.lib.tr_sequencer_release(self.s, out, max_n)
        got = [(out[i].seq, out[i].tag_a, out[i].tag_b, out[i].flags) for i in range(n)]
        assert got == expected
        for seq, partition, pos, _ in got:
            rc = self.lib.tr_watermark_advance(self.w, partition, pos, pos * 10 + partition)
            assert rc == self.lib.TR_OK
            self.wm[partition] = pos
            del self.state[seq]
        self.released_upto += n

    @rule(partition=st.integers(0, NPART - 1), ahead=st.booleans())
    def commit(self, partition, ahead):
        mark = self.ffi.new("tr_mark *")
        current = self.wm[partition]
        position = (current if current is not None else 0) + (1 if ahead else 0)
        mark.position, mark.handle = position, position * 10 + partition
        rc = self.lib.tr_watermark_mark_committed(self.w, partition, mark[0])
        if current is None or ahead:
            assert rc == self.lib.TR_EREGRESS  # rule 13: never past an incomplete message
        else:
            assert rc == self.lib.TR_OK
            self.committed[partition] = position

    @invariant()
    def counters(self):
        if self.s is None:
            return
        assert self.lib.tr_sequencer_outstanding(self.s) == self.outstanding() <= self.max
        assert self.lib.tr_sequencer_next_seq(self.s) == self.next_seq
        assert self.lib.tr_sequencer_released_upto(self.s) == self.released_upto

    @invariant()
    def head_failed(self):
        if self.s is None:
            return
        seq = self.ffi.new("uint64_t *")
        rc = self.lib.tr_sequencer_head_failed(self.s, seq)
        head = self.state.get(self.released_upto)
        if head is not None and head & self.lib.TR_SEQ_FAILED:
            assert rc == self.lib.TR_EFAILED and seq[0] == self.released_upto  # rule 18
        else:
            assert rc == self.lib.TR_OK

    @invariant()
    def watermarks(self):
        if self.s is None:
            return
        mark = self.ffi.new("tr_mark *")
        dirty = False
        for p in range(self.NPART):
            rc = self.lib.tr_watermark_get(self.w, p, mark)
            if self.wm[p] is None:
                assert rc == self.lib.TR_EAGAIN
            else:
                assert rc == self.lib.TR_OK
                assert (mark.position, mark.handle) == (self.wm[p], self.wm[p] * 10 + p)
                dirty |= self.committed[p] is None or self.committed[p] < self.wm[p]
        assert bool(self.lib.tr_watermark_dirty(self.w)) == dirty


def test_sequencer_watermark_model(capi):
    run_state_machine_as_test(
        lambda: SequencerWatermarkMachine(capi),
        settings=settings(max_examples=150, stateful_step_count=60, deadline=None),
    )


# rule 17, rule 22: racing completions from Python threads: exactly one wins per seq.
def test_racing_completions_from_threads(capi, sequencer):
    lib = capi.lib
    nthreads, window, rounds = 4, 512, 4
    s = sequencer(window)
    for _ in range(rounds):
        base = lib.tr_sequencer_next_seq(s)
        for i in range(window):
            assert acquire(capi, s, i, 0) == (lib.TR_OK, base + i)
        results = [[] for _ in range(nthreads)]
        barrier = threading.Barrier(nthreads)

        def complete_all(tid, base=base, results=results, barrier=barrier):
            order = list(range(base, base + window))
            random.Random(tid).shuffle(order)
            barrier.wait()
            for seq in order:
                results[tid].append((seq, lib.tr_sequencer_complete(s, seq, tid << 8)))

        threads = [threading.Thread(target=complete_all, args=(t,)) for t in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = {}
        for tid, res in enumerate(results):
            for seq, rc in res:
                assert rc in (lib.TR_OK, lib.TR_EALREADY)
                if rc == lib.TR_OK:
                    assert seq not in winners
                    winners[seq] = tid
        assert sorted(winners) == list(range(base, base + window))
        released = release(capi, s, window)
        assert [r[0] for r in released] == list(range(base, base + window))
        # flags are the winner's, untouched
        assert all(r[3] == winners[r[0]] << 8 for r in released)
        assert lib.tr_sequencer_outstanding(s) == 0
