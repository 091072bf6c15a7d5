/* tailrace/loop.h: the dispatch loop (SEMANTICS rules 1-19, 21-23).
 *
 * One loop thread owns every task's scheduling state: per-partition bounded
 * input rings (opaque 64-bit items, e.g. pinned envelope pointers), a
 * tr_sequencer and a tr_watermark per task, barrier state (window, commit,
 * user timers, end of stream, shutdown votes), a timer heap and the counters.
 * The loop never calls the binding's language runtime itself; it decides what
 * runs next (the one place that does) and hands operations to the binding:
 *
 *   tr_loop_run (no runtime lock held)
 *     for (;;) {
 *       drain completions -> release in sequence order -> advance watermarks
 *       -> fire due timers -> evaluate barriers -> build a batch of ops
 *       if (ops) hooks.run_batch(ctx, loop)   // binding takes its lock ONCE,
 *                                             // pulls ops with tr_loop_next_op
 *                                             // until it returns 0
 *       else spin briefly, then park on the notifier (timeout from the timer
 *            heap and the idle re-poll period; never a hot idle loop)
 *     }
 *
 * tr_loop_next_op rebuilds the batch when it runs dry (same steps as above,
 * without parking), so a task completed inline by the binding gets its next
 * message in the same batch: one lock acquisition covers many messages.
 *
 * Runs (TR_TASK_INLINE tasks): a task on the loop thread with nothing
 * outstanding gets a RUN op, up to TR_RUN_MAX of its buffered messages (one
 * partition's in order, or round robin message by message over its
 * partitions), which the binding processes in a row and reports with one
 * tr_loop_run_done call; the task then goes to the back of the round robin
 * (rule 5: a bounded burst per turn). A run ends early once a barrier or a
 * stop is due (tr_loop_run_yield); a RUN op that would end before its first
 * message is not handed out: its task keeps its turn and runs first once its
 * barrier is done, so a busy task cannot take every interval between two
 * timers. Per message this costs the loop nothing but a few counter updates:
 * no op, no sequencer slot, no clock read.
 *
 * Threads:
 *   - create / destroy / drain_items / take_error: the owning thread, loop not running.
 *   - run: the loop thread. next_op, push_input(s), partition_state, complete_local,
 *     run_done, control_done, watermark, mark_committed: the loop thread, inside
 *     run_batch.
 *   - pool_next, pool_done, pool_failed: worker `worker`, inside run_pool_batch.
 *   - complete, fail, post_error, wake_partition, set_user_timer, stop, stats:
 *     any thread, any time between create and destroy (also after run returned).
 *
 * Worker pool (rules 2, 3, 21): each TR_TASK_POOL task belongs to one worker
 * (task % pool_size), so its process calls run on one thread at a time, in
 * sequence order. The loop hands a worker runs of a task's buffered messages
 * ahead of time (up to a window of sequence numbers per task, not only
 * max_concurrency of them): queued-but-not-invoked messages are not
 * outstanding in the rules' sense, and the worker completes message k before
 * it invokes k+1. A worker takes the runtime lock once per run_pool_batch and
 * pulls ops with tr_loop_pool_next until it returns 0 (it refills from its
 * queue meanwhile); results go to tr_loop_pool_done / tr_loop_pool_failed and
 * reach the loop as one bulk completion-queue push per batch. When a process
 * call makes coordinator requests (or the loop is draining), the worker stops
 * invoking that task: its remaining queued ops go back to the loop unrun and
 * are handed out again, in order, once the loop has acted on the request
 * (commit before the next message, rule 9; nothing more after a shutdown).
 * With callback timeouts on, the window is max_concurrency (a message's clock
 * starts at dispatch). Items must be nonzero.
 *
 * Completion path (rules 12, 17, 22): the completing thread resolves the
 * sequencer slot itself (one CAS, so exactly one of racing resolutions wins and
 * double completion is detected exactly), then pushes the task index onto the
 * loop's MPSC completion queue, whose notifier wakes a parked loop. The queue's
 * capacity covers every outstanding sequence number plus one wake item per
 * partition and one timer item per task, and the loop releases no more of a
 * task's sequence numbers than it has popped completions of, so a push never
 * finds it full (if it did, the loop stops with TR_EAGAIN; nobody spins).
 *
 * Errors: the first error object posted (tr_loop_post_error) wins; the loop
 * stops without dispatching anything more. The binding takes the object back
 * with tr_loop_take_error once run returned.
 */
#ifndef TAILRACE_LOOP_H
#define TAILRACE_LOOP_H

#include <stddef.h>
#include <stdint.h>

#include "tailrace/event_time.h"
#include "tailrace/status.h"
#include "tailrace/watermark.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_loop tr_loop;

/* Request bits reported by the binding (the Coordinator's take() bits). */
#define TR_REQ_COMMIT_CURRENT 0x1u
#define TR_REQ_COMMIT_ALL 0x2u
#define TR_REQ_SHUTDOWN_CURRENT 0x4u
#define TR_REQ_SHUTDOWN_ALL 0x8u
#define TR_REQ_MASK 0xfu

/* Task flags (tr_loop_task.flags). */
#define TR_TASK_POOL 0x1u   /* process runs on the worker pool (sync tasks, pool size > 0) */
#define TR_TASK_WINDOW 0x2u /* the task has a window hook (rule 8) */
/* process runs on the loop thread (a sync task without a pool, or an async
 * task): the loop may hand it RUN ops instead of PROCESS ops */
#define TR_TASK_INLINE 0x4u
/* per-key ordering (rules 30, 31): messages with the same key hash are invoked
 * in partition order with at most one of them outstanding; the loop looks ahead
 * in the partition's ring (at most the input buffer, counted from the low
 * watermark) for the first message whose key is free. Items are pushed with
 * tr_loop_push_inputs_keyed. No RUN ops: messages go one by one. Equal hashes
 * (or hashes that share a busy bucket) are serialised, never reordered. */
#define TR_TASK_KEYED 0x8u
/* Its event-time watermark follows the messages handed to it (tr_loop_event_seen), not
 * those read (see tr_event_time_track): set for a task with event-time timers or
 * windows (rules 35, 38). */
#define TR_TASK_EVENT_TRACK 0x10u

/* Operation kinds handed to the binding. */
typedef enum tr_op_kind {
    TR_OP_NONE = 0,
    TR_OP_PROCESS = 1, /* task, partition, seq, item (ownership passes to the binding), handle */
    TR_OP_REFILL = 2,  /* task, partition, count = free ring slots: poll the reader */
    TR_OP_WINDOW = 3,  /* task: run window(); then tr_loop_control_done */
    TR_OP_COMMIT = 4,  /* task (flags TR_OPF_FINAL for the last one); then control_done */
    TR_OP_TIMER = 5,   /* task: run due user timers; then control_done. handle: when the
                        * task's pending window fell due (INT64_MAX: none): run only the
                        * timers due before it, the window runs next (rules 8, 23: in
                        * time order) */
    TR_OP_END_OF_STREAM = 6, /* task: run end_of_stream(); then control_done */
    TR_OP_RUN = 7            /* TR_TASK_INLINE task: `count` messages in dispatch order (one
                              * partition's in order, several partitions' round robin), items
                              * at `item`; partition: the first one's (see tr_loop_run_done) */
} tr_op_kind;

#define TR_OPF_FINAL 0x1u   /* TR_OP_COMMIT: the final commit of a graceful stop */
#define TR_OPF_DISCARD 0x2u /* pool PROCESS op: the loop stopped; drop the item, run nothing */

typedef struct tr_op {
    uint32_t kind;
    uint32_t task;
    uint32_t partition;
    uint32_t flags;
    uint64_t seq;
    uint64_t item;   /* PROCESS: the item pushed with push_input; RUN: the address of an
                      * array of `count` items (valid until the next next_op call) */
    uint64_t handle; /* PROCESS: the offset handle; REFILL: free slots */
    uint32_t count;  /* RUN: messages in the run (1..TR_RUN_MAX) */
    uint32_t reserved;
} tr_op;

/* Longest RUN op. */
#define TR_RUN_MAX 64u

/* Why the loop stopped. */
typedef enum tr_stop_reason {
    TR_STOP_NONE = 0,
    TR_STOP_END_OF_STREAM = 1, /* every task done (rule 11) */
    TR_STOP_SHUTDOWN = 2,      /* shutdown requests (rule 14) */
    TR_STOP_EXTERNAL = 3,      /* tr_loop_stop (rule 19) */
    TR_STOP_ERROR = 4,         /* an error was posted (rule 16) */
    TR_STOP_TIMEOUT = 5        /* a callback timed out (rule 16); see tr_loop_timeout_info */
} tr_stop_reason;

/* Partition states for tr_loop_partition_state. */
#define TR_PART_ACTIVE 0 /* poll again when the ring has room */
#define TR_PART_IDLE 1   /* nothing ready: poll after a wake-up or max_idle_ns */
#define TR_PART_ENDED 2  /* exhausted (bounded source): never poll again */

typedef struct tr_loop_config {
    uint32_t ntasks;             /* >= 1 */
    uint32_t max_concurrency;    /* 1..TR_SEQ_MAX_CONCURRENCY */
    uint32_t input_buffer;       /* items buffered per partition, >= 1 (rule 6) */
    uint32_t pool_size;          /* worker threads for TR_TASK_POOL tasks (0: none) */
    int32_t async_commit;        /* rule 10 */
    int64_t window_ns;           /* <= 0 disables (rule 8) */
    int64_t commit_ns;           /* <= 0 disables timer commits (rule 9) */
    int64_t callback_timeout_ns; /* <= 0 disables (rule 16) */
    int64_t max_idle_ns;         /* idle re-poll period (clamped to >= 1 ms) */
    int64_t shutdown_ns;         /* graceful wait for outstanding callbacks (rule 19) */
    /* The loop's clock (ns; NULL: tr_now_ns). Every period, deadline and timer reads it. With
     * clock_manual set it is virtual (tr_manual_clock_read): the loop never waits for real time
     * to reach a deadline; the clock's owner moves it and calls tr_loop_clock_moved. */
    int64_t (*clock_fn)(void *clock_ctx);
    void *clock_ctx;
    int32_t clock_manual;
    /* Event time (rules 33, 37; tailrace/event_time.h): each task's watermark is coalesced
     * from its partitions' timestamps (tr_loop_event_time_read), their empty polls and
     * ends (tr_loop_partition_state), on the loop's clock. */
    int64_t event_lag_ms;  /* task.watermark.lag.ms, >= 0 */
    int64_t event_idle_ns; /* task.watermark.idle.ms in ns; <= 0: no partition is ever idle */
} tr_loop_config;

typedef struct tr_loop_hooks {
    void *ctx;
    /* Loop thread, runtime lock not held. Take it once, execute ops from
     * tr_loop_next_op until it returns 0, release it. Return 0 to go on,
     * nonzero to stop with an error (post the error object first). */
    int (*run_batch)(void *ctx, tr_loop *loop);
    /* (run_batch is also called with no ops after an idle timeout, at least
     * every 100 ms, so the binding can check for signals.) */
    /* Worker thread `worker`, runtime lock not held. Take it once, pull PROCESS
     * ops with tr_loop_pool_next until it returns 0, release it. An op with
     * TR_OPF_DISCARD: only drop its item. Any other op: run it, then resolve
     * it with tr_loop_pool_done or tr_loop_pool_failed (before the next
     * tr_loop_pool_next). NULL when pool_size is 0. */
    void (*run_pool_batch)(void *ctx, tr_loop *loop, uint32_t worker);
    /* Optional (may be NULL): called on each worker thread when it starts and
     * before it exits, e.g. to keep a runtime thread state for its lifetime. */
    void (*worker_started)(void *ctx, uint32_t worker);
    void (*worker_stopping)(void *ctx, uint32_t worker);
} tr_loop_hooks;

/* Per-task counters (a snapshot; any thread). */
typedef struct tr_task_stats {
    uint64_t processed; /* messages dispatched (a pool task: the ops its worker started) */
    uint64_t completed; /* completions released in order */
    uint64_t outstanding;
    uint64_t windows;
    uint64_t commits;
    uint64_t timers;
    uint32_t done;
    uint32_t keys_in_flight; /* TR_TASK_KEYED: keys with a message outstanding */
    int64_t oldest_ns;       /* TR_TASK_KEYED: loop-clock dispatch time of the oldest
                              * unreleased message (INT64_MAX: none): head-of-line age */
} tr_task_stats;

typedef struct tr_loop_stats {
    uint64_t envelopes_chosen;
    uint64_t idle_wakeups;
    uint64_t loop_iterations;
    uint64_t batches;
    uint64_t cq_high_water; /* most items seen in the completion queue at one drain */
    uint64_t cq_bound;      /* the most it can ever hold (see tr_loop_create); never reached */
} tr_loop_stats;

typedef struct tr_loop_task {
    uint32_t npartitions; /* 0..2^20 */
    uint32_t flags;       /* TR_TASK_* */
} tr_loop_task;

/* tasks: cfg->ntasks entries. TR_EINVAL (bad config), TR_ENOMEM. */
tr_status tr_loop_create(const tr_loop_config *cfg, const tr_loop_task *tasks, tr_loop **out);
/* The owning thread; the loop must not be running, and no other thread may
 * still call into it. Items and errors it still holds must be drained first.
 * A pool worker abandoned by a bounded stop (still inside run_pool_batch when
 * tr_loop_run returned, rule 19) keeps the memory alive: the loop is freed when
 * the last of the owner and such workers lets go. The binding must keep its
 * hooks' context alive for such a worker until its worker_stopping hook. */
void tr_loop_destroy(tr_loop *loop);

/* Run until stopped. Returns TR_OK (see tr_loop_stop_reason), TR_ESYS if a
 * worker thread could not start, TR_ENOMEM, TR_EINVAL if run is called twice. */
tr_status tr_loop_run(tr_loop *loop, const tr_loop_hooks *hooks);

/* Loop thread, inside run_batch: the next op, 1; 0 when the batch is over. */
int tr_loop_next_op(tr_loop *loop, tr_op *out);

/* Loop thread, inside run_batch, right after executing a PROCESS op of `task`
 * (not a TR_TASK_POOL task) whose callback completed inline
 * with tr_loop_complete_local: the task's next PROCESS op, 1, when it may take
 * one now (its completions released, no barrier or request pending, room
 * under max concurrency), so an async task completing inline runs a bounded
 * burst (at most TR_RUN_MAX per next_op) without a batch rebuild per message;
 * 0 otherwise (go on with tr_loop_next_op). */
int tr_loop_next_of_task(tr_loop *loop, uint32_t task, tr_op *out);
/* Loop thread, inside run_batch, before each message of a RUN op (the first
 * one included): 1 when the run must end here (run_done with what was taken):
 * a stop was requested, an error was posted (rule 16), or a timer (window,
 * commit, user timer, callback timeout) is due, so at most the message in
 * progress runs after a barrier is due (rules 8, 9, 19, 23). Costs one coarse
 * clock read while nothing is near. */
int tr_loop_run_yield(tr_loop *L);
/* Loop thread, inside run_batch (REFILL): append one item with its offset
 * handle. TR_EAGAIN when the ring is full (nothing stored); TR_ENOMEM when
 * growing the ring failed (rings start at the refill size, grow to the limit). */
tr_status tr_loop_push_input(tr_loop *loop, uint32_t task, uint32_t partition, uint64_t item,
                             uint64_t handle);
/* Loop thread, inside run_batch (REFILL): append n items with their handles;
 * TR_EAGAIN when they do not all fit (nothing stored); TR_ENOMEM as above. */
tr_status tr_loop_push_inputs(tr_loop *loop, uint32_t task, uint32_t partition,
                              const uint64_t *items, const uint64_t *handles, size_t n);
/* The same for a TR_TASK_KEYED task: hashes[i] is item i's key hash (the
 * binding's: one fixed hash for messages without a key). */
tr_status tr_loop_push_inputs_keyed(tr_loop *loop, uint32_t task, uint32_t partition,
                                    const uint64_t *items, const uint64_t *handles,
                                    const uint64_t *hashes, size_t n);
/* Loop thread, inside run_batch: TR_PART_IDLE or TR_PART_ENDED after a poll (for
 * event time: an empty poll, every time, or the partition's end). */
void tr_loop_partition_state(tr_loop *loop, uint32_t task, uint32_t partition, int state);
/* Loop thread, inside run_batch: refill this partition up to `fill` items from now on
 * (clamped to 1..input_buffer). The loop starts every partition at a share of a
 * global budget so that many partitions do not keep many buffered objects cold;
 * a source whose buffered items cost nothing (no object per item) raises it to
 * the input buffer and is polled less often. TR_EINVAL for an unknown partition. */
tr_status tr_loop_partition_fill(tr_loop *loop, uint32_t task, uint32_t partition, uint32_t fill);
/* Loop thread, inside run_batch: the WINDOW/COMMIT/TIMER/END_OF_STREAM op of
 * `task` has finished; `requests` are its coordinator's TR_REQ_* bits. */
void tr_loop_control_done(tr_loop *loop, uint32_t task, uint32_t requests);

/* Loop thread, inside run_batch, once after each RUN op of `task`, before the
 * next next_op call: the binding took the first `consumed` items of the run
 * (their pins are its own now) and invoked process on them in order; the first
 * `completed` of those completed (consumed - completed is 0, or 1 for a message
 * that failed: the binding posts the error, the task is never dispatched to
 * again and the watermark stays before that message, rule 18). `requests`: the
 * coordinator bits of the last completed message; the binding ends a run right
 * after a message that made a request. Items past `consumed` stay buffered.
 * Nothing of a run passes through the sequencer: the loop hands a run only to a
 * task with nothing outstanding or held, so completing it in order is exactly
 * releasing it (rules 2, 12, 15). TR_EINVAL when no run of `task` is open. */
tr_status tr_loop_run_done(tr_loop *loop, uint32_t task, uint32_t consumed, uint32_t completed,
                           uint32_t requests);
/* Loop thread, inside run_batch, instead of run_done: the last of the
 * `consumed` items taken did not complete during its call (an async task whose
 * callback escaped): the others completed in order, without requests; that
 * one is outstanding now, with sequence number *seq (complete / complete_local
 * / fail resolve it, as for a PROCESS op). TR_EINVAL when no run is open. */
tr_status tr_loop_run_escape(tr_loop *loop, uint32_t task, uint32_t consumed, uint64_t *seq);
/* Loop thread, right after run_escape: the escaped message's call began when
 * the loop's clock read `ns` (its callback timeout counts from there: rule 16;
 * a PROCESS op's counts from when next_op handed it out). No-op without
 * callback timeouts. */
void tr_loop_invoked_at(tr_loop *loop, uint32_t task, uint64_t seq, int64_t ns);
/* Any thread: resolve callback `seq` of `task` as completed, with the
 * coordinator requests made for that message. TR_OK (this call won),
 * TR_EALREADY (resolved before: rule 17), TR_EUNKNOWN, TR_EINVAL. */
tr_status tr_loop_complete(tr_loop *loop, uint32_t task, uint64_t seq, uint32_t requests);
/* Worker `worker`, inside run_pool_batch: the next op of the worker's batch, 1;
 * 0 when the batch is over (the binding then releases its lock). */
int tr_loop_pool_next(tr_loop *loop, uint32_t worker, tr_op *out);
/* Worker `worker`, inside run_pool_batch: the op from tr_loop_pool_next ran;
 * `requests` are its coordinator's TR_REQ_* bits. The completion reaches the
 * loop with the worker's next bulk push (end of batch, or within ~1 ms).
 * Same statuses as tr_loop_complete. */
tr_status tr_loop_pool_done(tr_loop *loop, uint32_t worker, const tr_op *op, uint32_t requests);
/* Worker `worker`, inside run_pool_batch: the op raised; resolve it as failed
 * (the binding posts the error object with tr_loop_post_error). */
tr_status tr_loop_pool_failed(tr_loop *loop, uint32_t worker, const tr_op *op);
/* Loop thread inside run_batch: the same, without the completion queue. */
tr_status tr_loop_complete_local(tr_loop *loop, uint32_t task, uint64_t seq, uint32_t requests);
/* Any thread: resolve as failed (never released, rule 18). Same statuses.
 * The caller then posts the error object with tr_loop_post_error. */
tr_status tr_loop_fail(tr_loop *loop, uint32_t task, uint64_t seq);
/* Any thread: stop the loop with an error. `error` is an opaque nonzero word
 * (the binding: a pinned exception). TR_OK: the loop owns it now (give it back
 * with tr_loop_take_error). TR_EALREADY: an earlier error won; the caller keeps it. */
tr_status tr_loop_post_error(tr_loop *loop, uint64_t error);
/* Owning thread after run (or before destroy): the posted error word, or 0; clears it. */
uint64_t tr_loop_take_error(tr_loop *loop);

/* Any thread: new input (or its end) may be ready for this partition. */
void tr_loop_wake_partition(tr_loop *loop, uint32_t task, uint32_t partition);
/* Any thread: the task's earliest user timer is due at when_ns (tr_now_ns
 * clock); INT64_MAX: no timer. The latest call wins. */
void tr_loop_set_user_timer(tr_loop *loop, uint32_t task, int64_t when_ns);
/* Any thread, and a signal handler where TR_NOTIFIER_FUTEX is 1 (Linux): one
 * lock-free atomic store and a notify, which there is atomics plus a
 * FUTEX_WAKE syscall, no lock (elsewhere the notify takes a mutex: call it
 * from a thread, not a handler). Stops gracefully (rule 19). */
void tr_loop_stop(tr_loop *loop);
/* Any thread: a manual clock moved; wake the loop to run what became due. */
void tr_loop_clock_moved(tr_loop *loop);
/* Any thread: 1 when the loop is parked with nothing to do (no completion, wake-up or stop
 * queued for it): what a test driver on a manual clock waits for. */
int tr_loop_idle(tr_loop *loop);

/* Loop thread, inside run_batch (REFILL), after pushing a poll's messages: max_ts is the
 * largest of their event timestamps (ms; TR_ET_NONE when none has one). Moves the task's
 * event-time watermark (rule 33). TR_EINVAL for an unknown task or partition. */
tr_status tr_loop_event_time_read(tr_loop *loop, uint32_t task, uint32_t partition, int64_t max_ts,
                                  uint64_t count);
/* The thread invoking the task (TR_TASK_EVENT_TRACK): a message of `partition` with
 * timestamp ts (TR_ET_NONE: none) is being handed to the task (before its call), and
 * tr_loop_event_done: that call returned (not for a RUN op's messages: tr_loop_run_done
 * and tr_loop_run_escape count those). Each returns 1 when, on the loop thread, the
 * task's watermark now reaches its event-time timer: the caller ends its run after
 * this message, so the timer runs (a barrier) before the task's next message (rules 35,
 * 38). A pool worker's call returns 0: the loop thread checks. */
int tr_loop_event_seen(tr_loop *loop, uint32_t task, uint32_t partition, int64_t ts);
int tr_loop_event_done(tr_loop *loop, uint32_t task, uint32_t partition);
/* Loop thread, inside a RUN op of a sync task (whose code reads the watermark on this
 * thread only): tr_loop_event_seen for the run's message `index` (from 0, in the order
 * the run hands them over), whose recompute waits, while the task has no event-time
 * timer, until the run ends or the watermark is read on this thread
 * (tr_loop_event_watermark). Not for an async task's run: its coroutines read the
 * watermark from another thread. 0 for an index outside the task's current run. */
int tr_loop_event_seen_run(tr_loop *loop, uint32_t task, uint32_t index, int64_t ts);
/* Any thread: the task's earliest event-time timer (ms; INT64_MAX: none). When the
 * task's watermark reaches it, the task's timer barrier falls due (a TR_OP_TIMER, as
 * for tr_loop_set_user_timer), whose handler runs the event-time timers due and sets
 * the next one. */
void tr_loop_set_event_timer(tr_loop *loop, uint32_t task, int64_t at_ms);
/* Any thread: the task's event-time watermark (ms; TR_ET_NONE: none yet; TR_ET_END: every
 * input ended); TR_ET_NONE for an unknown task. On the loop thread it counts every message
 * handed over so far; on any other, as last computed (at the end of a run at the latest:
 * see tr_loop_event_seen_run). */
int64_t tr_loop_event_watermark(tr_loop *loop, uint32_t task);
/* The owning thread before run, or the loop thread: the task's watermark is at least
 * `floor` (its committed value: a restart resumes from it, rule 33). */
void tr_loop_event_floor(tr_loop *loop, uint32_t task, int64_t floor);

/* Loop thread: the task partition's low watermark / record a durable commit. */
tr_status tr_loop_watermark(tr_loop *loop, uint32_t task, uint32_t partition, tr_mark *out);
tr_status tr_loop_mark_committed(tr_loop *loop, uint32_t task, uint32_t partition, tr_mark mark);
/* Loop thread, from a hook (a commit op): 1 when the task's state holds exactly
 * the effects of its released messages, the prefix its low watermarks cover:
 * every message invoked is released (ops a pool worker handed back unrun were
 * never invoked) and, for TR_TASK_KEYED, none was taken ahead of an earlier
 * message still buffered (rule 30's look-ahead). Else 0; a keyed task that took
 * ahead then looks no further than each partition's first buffered message
 * until none is left behind, and a commit falls due again (rule 27: a commit
 * with state stores writes only a settled task). */
int tr_loop_task_settled(tr_loop *loop, uint32_t task);
/* Any thread: the last committed mark (TR_EAGAIN if none), messages read. */
tr_status tr_loop_committed(const tr_loop *loop, uint32_t task, uint32_t partition, tr_mark *out);
uint64_t tr_loop_read_count(const tr_loop *loop, uint32_t task, uint32_t partition);

/* Any thread: counters. */
void tr_loop_task_stats(const tr_loop *loop, uint32_t task, tr_task_stats *out);
void tr_loop_get_stats(const tr_loop *loop, tr_loop_stats *out);
tr_stop_reason tr_loop_stop_reason(const tr_loop *loop);
/* After a TR_STOP_TIMEOUT: the task, partition, seq and offset handle of the
 * callback that timed out. */
void tr_loop_timeout_info(const tr_loop *loop, uint32_t *task, uint32_t *partition, uint64_t *seq,
                          uint64_t *handle);

/* Owning thread, after run: items the binding still owns a pin for (buffered
 * in rings, or handed out in a batch the binding abandoned). Returns how many
 * were written to out (call until 0). */
size_t tr_loop_drain_items(tr_loop *loop, uint64_t *out, size_t max);

#ifdef __cplusplus
}
#endif
#endif
