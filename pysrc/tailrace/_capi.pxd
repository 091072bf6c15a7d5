# Declarations of the C library's public headers (csrc/include/tailrace/*.h).
# Nothing here touches Python objects; ownership rules live with the callers.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t


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
    ctypedef struct tr_manual_clock:
        pass
    int64_t tr_manual_clock_read(void *clock)
    void tr_manual_clock_set(tr_manual_clock *clock, int64_t ns)


cdef extern from "tailrace/encoding.h" nogil:
    # every packed word, with range-checked helpers (0: does not fit)
    uint64_t TR_LAZY_OFFSET_LIMIT
    uint64_t TR_HANDLE_LIMIT
    int tr_lazy_item(uint64_t offset, uint32_t partition, uint64_t *out)
    uint64_t tr_lazy_offset(uint64_t item)
    uint32_t tr_lazy_partition(uint64_t item)
    int tr_handle_int(uint64_t offset, uint64_t *out)
    int tr_handle_pinned(uint64_t id, uint64_t *out)

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


cdef extern from "tailrace/loop.h" nogil:
    uint32_t TR_REQ_COMMIT_CURRENT
    uint32_t TR_REQ_COMMIT_ALL
    uint32_t TR_REQ_SHUTDOWN_CURRENT
    uint32_t TR_REQ_SHUTDOWN_ALL
    uint32_t TR_REQ_MASK
    uint32_t TR_TASK_POOL
    uint32_t TR_TASK_WINDOW
    uint32_t TR_TASK_INLINE
    uint32_t TR_TASK_KEYED
    uint32_t TR_TASK_EVENT_TRACK
    uint32_t TR_RUN_MAX
    uint32_t TR_OPF_FINAL
    uint32_t TR_OPF_DISCARD
    int TR_PART_ACTIVE
    int TR_PART_IDLE
    int TR_PART_ENDED
    ctypedef enum tr_op_kind:
        TR_OP_NONE
        TR_OP_PROCESS
        TR_OP_REFILL
        TR_OP_WINDOW
        TR_OP_COMMIT
        TR_OP_TIMER
        TR_OP_END_OF_STREAM
        TR_OP_RUN
    ctypedef enum tr_stop_reason:
        TR_STOP_NONE
        TR_STOP_END_OF_STREAM
        TR_STOP_SHUTDOWN
        TR_STOP_EXTERNAL
        TR_STOP_ERROR
        TR_STOP_TIMEOUT
    ctypedef struct tr_loop:
        pass
    ctypedef struct tr_op:
        uint32_t kind
        uint32_t task
        uint32_t partition
        uint32_t flags
        uint64_t seq
        uint64_t item
        uint64_t handle
        uint32_t count
    ctypedef struct tr_loop_config:
        uint32_t ntasks
        uint32_t max_concurrency
        uint32_t input_buffer
        uint32_t pool_size
        int32_t async_commit
        int64_t window_ns
        int64_t commit_ns
        int64_t callback_timeout_ns
        int64_t max_idle_ns
        int64_t shutdown_ns
        int64_t (*clock_fn)(void *clock_ctx) noexcept nogil
        void *clock_ctx
        int32_t clock_manual
        int64_t event_lag_ms
        int64_t event_idle_ns
    ctypedef struct tr_loop_task:
        uint32_t npartitions
        uint32_t flags
    ctypedef struct tr_loop_hooks:
        void *ctx
        int (*run_batch)(void *ctx, tr_loop *loop) noexcept nogil
        void (*run_pool_batch)(void *ctx, tr_loop *loop, uint32_t worker) noexcept nogil
        void (*worker_started)(void *ctx, uint32_t worker) noexcept nogil
        void (*worker_stopping)(void *ctx, uint32_t worker) noexcept nogil
    ctypedef struct tr_task_stats:
        uint64_t processed
        uint64_t completed
        uint64_t outstanding
        uint64_t windows
        uint64_t commits
        uint64_t timers
        uint32_t done
        uint32_t keys_in_flight
        int64_t oldest_ns
    ctypedef struct tr_loop_stats:
        uint64_t envelopes_chosen
        uint64_t idle_wakeups
        uint64_t loop_iterations
        uint64_t batches

    tr_status tr_loop_create(const tr_loop_config *cfg, const tr_loop_task *tasks, tr_loop **out)
    void tr_loop_destroy(tr_loop *loop)
    tr_status tr_loop_run(tr_loop *loop, const tr_loop_hooks *hooks)
    int tr_loop_next_op(tr_loop *loop, tr_op *out)
    tr_status tr_loop_push_input(tr_loop *loop, uint32_t task, uint32_t partition,
                                 uint64_t item, uint64_t handle)
    int tr_loop_next_of_task(tr_loop *loop, uint32_t task, tr_op *out)
    int tr_loop_run_yield(tr_loop *loop)
    tr_status tr_loop_push_inputs(tr_loop *loop, uint32_t task, uint32_t partition,
                                  const uint64_t *items, const uint64_t *handles, size_t n)
    tr_status tr_loop_push_inputs_keyed(tr_loop *loop, uint32_t task, uint32_t partition,
                                        const uint64_t *items, const uint64_t *handles,
                                        const uint64_t *hashes, size_t n)
    tr_status tr_loop_run_escape(tr_loop *loop, uint32_t task, uint32_t consumed, uint64_t *seq)
    void tr_loop_invoked_at(tr_loop *loop, uint32_t task, uint64_t seq, int64_t ns)
    tr_status tr_loop_run_done(tr_loop *loop, uint32_t task, uint32_t consumed, uint32_t completed,
                               uint32_t requests)
    void tr_loop_partition_state(tr_loop *loop, uint32_t task, uint32_t partition, int state)
    tr_status tr_loop_partition_fill(tr_loop *loop, uint32_t task, uint32_t partition, uint32_t fill)
    void tr_loop_control_done(tr_loop *loop, uint32_t task, uint32_t requests)
    tr_status tr_loop_complete(tr_loop *loop, uint32_t task, uint64_t seq, uint32_t requests)
    int tr_loop_pool_next(tr_loop *loop, uint32_t worker, tr_op *out)
    tr_status tr_loop_pool_done(tr_loop *loop, uint32_t worker, const tr_op *op, uint32_t requests)
    tr_status tr_loop_pool_failed(tr_loop *loop, uint32_t worker, const tr_op *op)
    tr_status tr_loop_complete_local(tr_loop *loop, uint32_t task, uint64_t seq, uint32_t requests)
    tr_status tr_loop_fail(tr_loop *loop, uint32_t task, uint64_t seq)
    tr_status tr_loop_post_error(tr_loop *loop, uint64_t error)
    uint64_t tr_loop_take_error(tr_loop *loop)
    void tr_loop_wake_partition(tr_loop *loop, uint32_t task, uint32_t partition)
    void tr_loop_set_user_timer(tr_loop *loop, uint32_t task, int64_t when_ns)
    void tr_loop_stop(tr_loop *loop)
    void tr_loop_clock_moved(tr_loop *loop)
    int tr_loop_idle(tr_loop *loop)
    tr_status tr_loop_watermark(tr_loop *loop, uint32_t task, uint32_t partition, tr_mark *out)
    tr_status tr_loop_event_time_read(tr_loop *loop, uint32_t task, uint32_t partition, int64_t max_ts,
                                      uint64_t count)
    int tr_loop_event_seen(tr_loop *loop, uint32_t task, uint32_t partition, int64_t ts) nogil
    int tr_loop_event_seen_run(tr_loop *loop, uint32_t task, uint32_t index, int64_t ts) nogil
    int tr_loop_event_done(tr_loop *loop, uint32_t task, uint32_t partition) nogil
    void tr_loop_set_event_timer(tr_loop *loop, uint32_t task, int64_t at_ms) nogil
    int64_t tr_loop_event_watermark(tr_loop *loop, uint32_t task)
    void tr_loop_event_floor(tr_loop *loop, uint32_t task, int64_t floor)
    int tr_loop_task_settled(tr_loop *loop, uint32_t task)
    tr_status tr_loop_committed(const tr_loop *loop, uint32_t task, uint32_t partition, tr_mark *out)
    uint64_t tr_loop_read_count(const tr_loop *loop, uint32_t task, uint32_t partition)
    void tr_loop_task_stats(const tr_loop *loop, uint32_t task, tr_task_stats *out)
    void tr_loop_get_stats(const tr_loop *loop, tr_loop_stats *out)
    tr_stop_reason tr_loop_stop_reason(const tr_loop *loop)
    void tr_loop_timeout_info(const tr_loop *loop, uint32_t *task, uint32_t *partition, uint64_t *seq,
                              uint64_t *handle)
    size_t tr_loop_drain_items(tr_loop *loop, uint64_t *out, size_t max)
