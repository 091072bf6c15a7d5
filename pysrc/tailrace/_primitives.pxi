# Python wrappers of the C primitives, for tests, tools and the pure-Python
# engine's optional use. The run loop uses the C structs directly.


cdef class Sequencer:
    """Per-task callback sequencer (csrc/include/tailrace/sequencer.h).

    ``acquire``/``release`` from the owning thread; ``complete`` from any thread
    (it releases the GIL for the CAS, so racing threads really race).
    """

    cdef capi.tr_sequencer *_s

    def __cinit__(self, uint32_t max_concurrency):
        check(capi.tr_sequencer_create(max_concurrency, &self._s), "Sequencer")

    def __dealloc__(self):
        if self._s is not NULL:
            capi.tr_sequencer_destroy(self._s)
            self._s = NULL

    def acquire(self, uint64_t tag_a=0, uint64_t tag_b=0):
        """The next sequence number; CoreError TR_EAGAIN at the concurrency limit."""
        cdef uint64_t seq
        check(capi.tr_sequencer_acquire(self._s, tag_a, tag_b, &seq))
        return seq

    def complete(self, uint64_t seq, uint32_t flags=0):
        """Resolve ``seq``; returns the status code (0 = this call won)."""
        cdef capi.tr_status st
        with nogil:
            st = capi.tr_sequencer_complete(self._s, seq, flags)
        return <int>st

    def release(self, size_t max=64):
        """Released completions, in order: a list of (seq, flags, tag_a, tag_b)."""
        cdef capi.tr_seq_release buf[64]
        cdef size_t n, i
        cdef list out = []
        while max > 0:
            n = capi.tr_sequencer_release(self._s, buf, max if max < 64 else 64)
            for i in range(n):
                out.append((buf[i].seq, buf[i].flags, buf[i].tag_a, buf[i].tag_b))
            max -= n
            if n == 0 or (buf[n - 1].flags & capi.TR_SEQ_COMMIT):
                break
        return out

    def head_failed(self):
        """The failed seq blocking release, or None."""
        cdef uint64_t seq
        if capi.tr_sequencer_head_failed(self._s, &seq) == capi.TR_EFAILED:
            return seq
        return None

    @property
    def outstanding(self):
        return capi.tr_sequencer_outstanding(self._s)

    @property
    def next_seq(self):
        return capi.tr_sequencer_next_seq(self._s)

    @property
    def released_upto(self):
        return capi.tr_sequencer_released_upto(self._s)

    @property
    def max_concurrency(self):
        return capi.tr_sequencer_max_concurrency(self._s)


cdef class Watermark:
    """Per-partition low watermarks of one task (csrc/include/tailrace/watermark.h)."""

    cdef capi.tr_watermark *_w

    def __cinit__(self, uint32_t npartitions):
        check(capi.tr_watermark_create(npartitions, &self._w), "Watermark")

    def __dealloc__(self):
        if self._w is not NULL:
            capi.tr_watermark_destroy(self._w)
            self._w = NULL

    def advance(self, uint32_t partition, uint64_t position, uint64_t handle):
        """Move a partition's watermark forward; CoreError TR_EREGRESS if not forward."""
        check(capi.tr_watermark_advance(self._w, partition, position, handle))

    def get(self, uint32_t partition):
        """(position, handle), or None before anything completed."""
        cdef capi.tr_mark m
        cdef capi.tr_status st = capi.tr_watermark_get(self._w, partition, &m)
        if st == capi.TR_EAGAIN:
            return None
        check(st)
        return (m.position, m.handle)

    def mark_committed(self, uint32_t partition, uint64_t position, uint64_t handle):
        cdef capi.tr_mark m
        m.position = position
        m.handle = handle
        check(capi.tr_watermark_mark_committed(self._w, partition, m))

    def committed(self, uint32_t partition):
        cdef capi.tr_mark m
        cdef capi.tr_status st = capi.tr_watermark_committed(self._w, partition, &m)
        if st == capi.TR_EAGAIN:
            return None
        check(st)
        return (m.position, m.handle)

    @property
    def dirty(self):
        return bool(capi.tr_watermark_dirty(self._w))

    def __len__(self):
        return capi.tr_watermark_partitions(self._w)


cdef class ObjectQueue:
    """A bounded MPSC queue of Python objects over the C queue.

    Ownership: ``push`` takes a new reference to the object and stores the
    pointer in the C item (the object is pinned while queued); ``pop`` hands that
    reference to the caller (steals it back); ``__dealloc__`` drops the
    references of anything still queued. push from any thread; pop from one.
    """

    cdef capi.tr_queue *_q

    def __cinit__(self, size_t capacity):
        check(capi.tr_queue_create(capacity, NULL, &self._q), "ObjectQueue")

    def __dealloc__(self):
        cdef capi.tr_item item
        if self._q is NULL:
            return
        while capi.tr_queue_try_pop_sc(self._q, &item) == capi.TR_OK:
            Py_DECREF(<object><PyObject *>item.a)
        capi.tr_queue_destroy(self._q)
        self._q = NULL

    def push(self, obj):
        """True if queued, False when full (nothing is stored then)."""
        cdef capi.tr_item item
        item.a = <uint64_t><PyObject *>obj
        item.b = 0
        Py_INCREF(obj)  # released by pop (handed to caller) or __dealloc__
        if capi.tr_queue_try_push_mpsc(self._q, item) == capi.TR_OK:
            return True
        Py_DECREF(obj)
        return False

    def pop(self, timeout=None):
        """The oldest object; raises IndexError when empty (after ``timeout`` seconds if given)."""
        cdef capi.tr_item item
        cdef capi.tr_status st
        cdef int64_t ns
        if timeout is None:
            st = capi.tr_queue_try_pop_sc(self._q, &item)
        else:
            ns = <int64_t>(float(timeout) * 1e9)
            with nogil:
                st = capi.tr_queue_pop_wait_sc(self._q, &item, ns)
        if st != capi.TR_OK:
            raise IndexError("queue is empty")
        obj = <object><PyObject *>item.a  # takes a new reference ...
        Py_DECREF(obj)  # ... so drop the one push took: obj now holds it alone
        return obj

    def __len__(self):
        return capi.tr_queue_size_approx(self._q)

    @property
    def capacity(self):
        return capi.tr_queue_capacity(self._q)
