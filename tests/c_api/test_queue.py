"""tr_queue and tr_notifier through cffi: statuses, order, batches, blocking, threads."""

import threading
import time

import pytest


@pytest.fixture
def make_queue(capi):
    ffi, lib = capi.ffi, capi.lib
    made = []

    def make(capacity, notifier=ffi.NULL):
        out = ffi.new("tr_queue **")
        assert lib.tr_queue_create(capacity, notifier, out) == lib.TR_OK
        made.append(out[0])
        return out[0]

    yield make
    for q in made:
        lib.tr_queue_destroy(q)


def item(ffi, a, b=0):
    return ffi.new("tr_item *", {"a": a, "b": b})[0]


def test_create_statuses(capi, make_queue):
    ffi, lib = capi.ffi, capi.lib
    out = ffi.new("tr_queue **")
    assert lib.tr_queue_create(0, ffi.NULL, out) == lib.TR_EINVAL
    assert lib.tr_queue_create((1 << 30) + 1, ffi.NULL, out) == lib.TR_EINVAL
    assert lib.tr_queue_capacity(make_queue(1)) == 2
    assert lib.tr_queue_capacity(make_queue(5)) == 8
    assert lib.tr_queue_capacity(make_queue(1 << 10)) == 1 << 10


# rule 6: a full queue refuses (TR_EAGAIN) and drops nothing.
def test_fifo_full_empty(capi, make_queue):
    ffi, lib = capi.ffi, capi.lib
    q = make_queue(4)
    out = ffi.new("tr_item *")
    assert lib.tr_queue_empty_sc(q)
    assert lib.tr_queue_try_pop_sc(q, out) == lib.TR_EAGAIN
    for i in range(4):
        assert lib.tr_queue_try_push_mpsc(q, item(ffi, i, 10 * i)) == lib.TR_OK
    assert lib.tr_queue_try_push_mpsc(q, item(ffi, 99)) == lib.TR_EAGAIN
    assert lib.tr_queue_size_approx(q) == 4
    for i in range(4):
        assert lib.tr_queue_try_pop_sc(q, out) == lib.TR_OK
        assert (out.a, out.b) == (i, 10 * i)
    assert lib.tr_queue_empty_sc(q)
    assert lib.tr_queue_size_approx(q) == 0


def test_batches(capi, make_queue):
    ffi, lib = capi.ffi, capi.lib
    q = make_queue(8)
    items = ffi.new("tr_item[12]", [{"a": i, "b": 0} for i in range(12)])
    assert lib.tr_queue_try_push_batch_mpsc(q, items, 0) == 0
    assert lib.tr_queue_try_push_batch_mpsc(q, items, 12) == 8  # the prefix that fits
    assert lib.tr_queue_try_push_batch_mpsc(q, items + 8, 4) == 0
    out = ffi.new("tr_item[12]")
    assert lib.tr_queue_try_pop_batch_sc(q, out, 3) == 3
    assert lib.tr_queue_try_push_batch_mpsc(q, items + 8, 4) == 3
    assert lib.tr_queue_try_pop_batch_sc(q, out, 12) == 8
    assert [out[i].a for i in range(8)] == [3, 4, 5, 6, 7, 8, 9, 10]


# rule 7: the consumer blocks without spinning forever and wakes on a push.
def test_pop_wait(capi, make_queue):
    ffi, lib = capi.ffi, capi.lib
    q = make_queue(4)
    out = ffi.new("tr_item *")
    t0 = time.monotonic()
    assert lib.tr_queue_pop_wait_sc(q, out, 20_000_000) == lib.TR_ETIMEDOUT
    assert time.monotonic() - t0 >= 0.019

    def later():
        time.sleep(0.05)
        assert lib.tr_queue_try_push_mpsc(q, item(ffi, 7)) == lib.TR_OK

    thread = threading.Thread(target=later)
    thread.start()
    assert lib.tr_queue_pop_wait_sc(q, out, 5_000_000_000) == lib.TR_OK
    assert out.a == 7
    thread.join()
    notifier = lib.tr_queue_notifier(q)
    assert notifier != ffi.NULL


# rule 7: one notifier shared by several queues wakes the loop for any of them.
def test_shared_notifier(capi):
    ffi, lib = capi.ffi, capi.lib
    n = ffi.new("tr_notifier *")
    assert lib.tr_notifier_init(n) == lib.TR_OK
    out1, out2 = ffi.new("tr_queue **"), ffi.new("tr_queue **")
    assert lib.tr_queue_create(4, n, out1) == lib.TR_OK
    assert lib.tr_queue_create(4, n, out2) == lib.TR_OK
    q1, q2 = out1[0], out2[0]
    try:
        assert lib.tr_queue_notifier(q1) == n
        key = lib.tr_notifier_prepare_wait(n)
        assert lib.tr_queue_try_push_mpsc(q2, item(ffi, 1)) == lib.TR_OK
        assert lib.tr_notifier_commit_wait(n, key, 1_000_000_000) == lib.TR_OK
        key = lib.tr_notifier_prepare_wait(n)
        lib.tr_notifier_cancel_wait(n)
        key = lib.tr_notifier_prepare_wait(n)
        assert lib.tr_notifier_commit_wait(n, key, 1_000_000) == lib.TR_ETIMEDOUT
        out = ffi.new("tr_item *")
        assert lib.tr_queue_pop_wait_sc(q1, out, 0) == lib.TR_ETIMEDOUT
        assert lib.tr_queue_pop_wait_sc(q2, out, 0) == lib.TR_OK
    finally:
        lib.tr_queue_destroy(q1)  # the queues go first: the shared notifier outlives them
        lib.tr_queue_destroy(q2)
        lib.tr_notifier_destroy(n)


def test_notifier_init_and_wake_from_thread(capi):
    ffi, lib = capi.ffi, capi.lib
    n = ffi.new("tr_notifier *")
    assert lib.tr_notifier_init(n) == lib.TR_OK
    flag = threading.Event()

    def wake():
        time.sleep(0.02)
        flag.set()
        lib.tr_notifier_notify(n)

    thread = threading.Thread(target=wake)
    thread.start()
    while True:
        key = lib.tr_notifier_prepare_wait(n)
        if flag.is_set():
            lib.tr_notifier_cancel_wait(n)
            break
        assert lib.tr_notifier_commit_wait(n, key, 5_000_000_000) == lib.TR_OK
    thread.join()
    lib.tr_notifier_destroy(n)


# rule 6, rule 1: per-producer order, no loss, no duplicates with racing Python producers.
def test_threaded_producers(capi, make_queue):
    ffi, lib = capi.ffi, capi.lib
    q = make_queue(64)
    nprod, count = 4, 5000

    def produce(pid):
        i = 0
        batch = ffi.new("tr_item[8]")
        while i < count:
            if i % 3 == 0:
                n = min(8, count - i)
                for k in range(n):
                    batch[k].a, batch[k].b = pid, i + k
                i += lib.tr_queue_try_push_batch_mpsc(q, batch, n)
            elif lib.tr_queue_try_push_mpsc(q, item(ffi, pid, i)) == lib.TR_OK:
                i += 1

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(nprod)]
    for t in threads:
        t.start()
    expect = [0] * nprod
    out = ffi.new("tr_item *")
    for _ in range(nprod * count):
        assert lib.tr_queue_pop_wait_sc(q, out, 10_000_000_000) == lib.TR_OK
        assert out.b == expect[out.a]
        expect[out.a] += 1
    for t in threads:
        t.join()
    assert expect == [count] * nprod
    assert lib.tr_queue_empty_sc(q)
