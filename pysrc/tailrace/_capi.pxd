# Declarations of the C library's public headers (csrc/include/tailrace/*.h).
# Nothing here touches Python objects; ownership rules live with the callers.
from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef extern from "tailrace/status.h" nogil:
    ctypedef enum tr_status:
        TR_OK
        TR_EAGAIN
        TR_ETIMEDOUT
        TR_EINVAL
        TR_ENOMEM
        TR_EALREADY
        TR_EUNKNOWN
        TR_EREGRESS
        TR_ECLOSED
        TR_EFAILED
        TR_ESYS
    const char *tr_status_str(tr_status status)
    const char *tr_status_name(tr_status status)


cdef extern from "tailrace/clock.h" nogil:
    int64_t tr_now_ns()


cdef extern from "tailrace/notifier.h" nogil:
    ctypedef struct tr_notifier:
        pass
    tr_status tr_notifier_init(tr_notifier *n)
    void tr_notifier_destroy(tr_notifier *n)
    uint64_t tr_notifier_prepare_wait(tr_notifier *n)
    void tr_notifier_cancel_wait(tr_notifier *n)
    tr_status tr_notifier_commit_wait(tr_notifier *n, uint64_t key, int64_t timeout_ns)
    void tr_notifier_notify(tr_notifier *n)


cdef extern from "tailrace/queue.h" nogil:
    ctypedef struct tr_item:
        uint64_t a
        uint64_t b
    ctypedef struct tr_queue:
        pass
    tr_status tr_queue_create(size_t capacity, tr_notifier *notifier, tr_queue **out)
    void tr_queue_destroy(tr_queue *q)
    size_t tr_queue_capacity(const tr_queue *q)
    tr_notifier *tr_queue_notifier(tr_queue *q)
    tr_status tr_queue_try_push_mpsc(tr_queue *q, tr_item item)
    size_t tr_queue_try_push_batch_mpsc(tr_queue *q, const tr_item *items, size_t n)
    tr_status tr_queue_try_pop_sc(tr_queue *q, tr_item *out)
    size_t tr_queue_try_pop_batch_sc(tr_queue *q, tr_item *out, size_t max)
    tr_status tr_queue_pop_wait_sc(tr_queue *q, tr_item *out, int64_t timeout_ns)
    int tr_queue_empty_sc(const tr_queue *q)
    size_t tr_queue_size_approx(const tr_queue *q)


cdef extern from "tailrace/sequencer.h" nogil:
    uint32_t TR_SEQ_COMMIT
    uint32_t TR_SEQ_FAILED
    uint32_t TR_SEQ_USER_SHIFT
    uint32_t TR_SEQ_FLAGS_MASK
    uint32_t TR_SEQ_MAX_CONCURRENCY
    ctypedef struct tr_seq_release:
        uint64_t seq
        uint64_t tag_a
        uint64_t tag_b
        uint32_t flags
    ctypedef struct tr_sequencer:
        pass
    tr_status tr_sequencer_create(uint32_t max_concurrency, tr_sequencer **out)
    void tr_sequencer_destroy(tr_sequencer *s)
    tr_status tr_sequencer_acquire(tr_sequencer *s, uint64_t tag_a, uint64_t tag_b, uint64_t *seq_out)
    tr_status tr_sequencer_complete(tr_sequencer *s, uint64_t seq, uint32_t flags)
    size_t tr_sequencer_release(tr_sequencer *s, tr_seq_release *out, size_t max)
    tr_status tr_sequencer_head_failed(const tr_sequencer *s, uint64_t *seq_out)
    uint32_t tr_sequencer_outstanding(const tr_sequencer *s)
    uint64_t tr_sequencer_next_seq(const tr_sequencer *s)
    uint64_t tr_sequencer_released_upto(const tr_sequencer *s)
    uint32_t tr_sequencer_max_concurrency(const tr_sequencer *s)


cdef extern from "tailrace/watermark.h" nogil:
    ctypedef struct tr_watermark:
        pass
    ctypedef struct tr_mark:
        uint64_t position
        uint64_t handle
    tr_status tr_watermark_create(uint32_t npartitions, tr_watermark **out)
    void tr_watermark_destroy(tr_watermark *w)
    uint32_t tr_watermark_partitions(const tr_watermark *w)
    tr_status tr_watermark_advance(tr_watermark *w, uint32_t partition, uint64_t position, uint64_t handle)
    tr_status tr_watermark_get(const tr_watermark *w, uint32_t partition, tr_mark *out)
    tr_status tr_watermark_mark_committed(tr_watermark *w, uint32_t partition, tr_mark mark)
    tr_status tr_watermark_committed(const tr_watermark *w, uint32_t partition, tr_mark *out)
    int tr_watermark_dirty(const tr_watermark *w)
