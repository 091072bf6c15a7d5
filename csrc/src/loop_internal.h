/* loop_internal.h: the dispatch loop's internal structs, constants and the
 * functions its files share (see tailrace/loop.h for the contract; packed
 * words live in tailrace/encoding.h).
 *
 * The loop is split by concern, in layers: a file calls only files of a lower
 * layer (and this header's inlines), never one above it, so each can be read
 * knowing only the ones below. No call has to go up: what a lower file must
 * have happen above it (a completion or a timer that makes a task ready or
 * due) it notes in loop_state.c's worklists, which the scheduler reads.
 *   5 loop_schedule.c - the one place that decides what runs next: batches,
 *                       runs, control ops, the run loop and its wait;
 *                       next_op, control_done, run_yield
 *   4 loop_pool.c     - the worker pool (its essay: queue bounds, who blocks
 *                       where)
 *   3 loop_release.c  - completions: draining the completion queue, sequencer
 *                       release, watermarks, run_done / run_escape
 *   3 loop_input.c    - the per-partition input rings and reader states, and
 *                       taking a message out of them (with its seq)
 *   2 loop_timers.c   - the timer heap: windows, commits, user timers, callback
 *                       timeouts, and what fires when one is due
 *   1 loop_state.c    - the scheduling state the files above update: the
 *                       worklists below, the phase (drain, finish), requests
 *   1 loop.c          - the loop object and its any-thread surface: create /
 *                       destroy, errors, stop, user timers, the completion
 *                       queue's push, watermarks, counters, drain_items
 *   (this header: the structs, and inlines any layer may use: the clock, the
 *   key busy set, runnable / control_kind, run deadlines, request flags)
 * The binding's hooks (tr_loop_hooks) are the only calls out of the loop.
 *
 * Everything in `struct tr_loop` below the "loop thread only" line is touched
 * by the loop thread alone (during run, and by whichever thread calls the
 * binding's run_batch, which is the loop thread). Other threads touch only:
 * the sequencers (complete: a CAS), the completion queue (push), the notifier,
 * the per-partition `woken` words, the per-task timer words, `stop_requested`,
 * `error`, and the relaxed counters they read for metrics.
 *
 * Scheduling structures (loop thread):
 *   ready  - FIFO ring of tasks that may be dispatched to (round robin, rule 5);
 *            a task is in it at most once (in_ready) and is re-checked on pop.
 *   carry  - FIFO ring of tasks whose RUN op was cut by a barrier or a stop
 *            (a timer fell due while an earlier op of the batch ran): they keep
 *            their turn, dispatched before the ready ring once runnable again
 *            (in_ready while in it). Without it the task whose run came first
 *            would take every interval between two timers (rule 5).
 *   ctl    - tasks whose control work (commit > window > timer > end of stream)
 *            is eligible now; emitted before any normal work, in task order.
 *   dirty  - tasks with completions to release.
 *   refill - FIFO ring of partitions whose ring has room and whose reader is active.
 *   heap   - timers: window, commit, user timer, callback timeout (lazy deletion).
 */
#ifndef TAILRACE_LOOP_INTERNAL_H
#define TAILRACE_LOOP_INTERNAL_H

#include "tailrace/loop.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "tailrace/atomics.h"
#include "tailrace/clock.h"
#include "tailrace/encoding.h"
#include "tailrace/notifier.h"
#include "tailrace/queue.h"
#include "tailrace/sequencer.h"

#define MAX_PARTS (1u << 20) /* partitions per task (loop.h) */
#define BATCH_MAX 64u
/* a loop-thread PROCESS op in the batch whose message is taken when it is handed
 * out (tr_loop_next_op), not when the batch is built: a barrier or a stop that
 * fell due meanwhile (a timer set by the message before it) skips it, with
 * nothing taken to give back (rules 8, 19, 23). Never seen by the binding. */
#define OPF_LAZY 0x80000000u
/* Messages buffered across all partitions the loop aims for: with many
 * partitions each one is refilled in smaller polls (at least a run's worth,
 * never more than the input buffer, rule 6), so the messages waiting stay few
 * enough to be recycled warm instead of a cold buffer per partition. */
#ifndef FILL_BUDGET
#define FILL_BUDGET 65536u
#endif
#ifndef FILL_MIN
#define FILL_MIN TR_RUN_MAX
#endif
#define BATCH_BUDGET 4096u  /* ops per run_batch call before the loop looks at parking/ticks */
#define SPIN_ROUNDS 256     /* polls of the completion queue before parking */
#define TICK_NS 100000000LL /* run_batch at least this often while idle (signals) */
#define MIN_IDLE_NS 1000000LL
#define POOL_WINDOW 128u /* seqs a pool task may have queued/running on its worker */
/* ops of a pool task handed to its worker per turn: tasks sharing a worker take
 * turns of this many messages on it (rule 5), not POOL_WINDOW each */
#define POOL_TURN 16u
/* a RUN op ends after this long (coarse clock), keeping the rest of its turn: the
 * counters it reports at its end (progress, metrics) are never older than that */
#define RUN_SLICE_NS 100000000LL
#define POOL_BATCH 64u                  /* items a worker pops from its queue at once */
#define POOL_PEND 256u                  /* completions a worker buffers before one bulk push */
#define POOL_BUDGET 1024u               /* ops per run_pool_batch call (lock hold) */
#define POOL_FLUSH_NS 1000000LL         /* a completion older than this is pushed at the next one */
#define WORKER_EXIT_GRACE_NS 50000000LL /* idle workers exit at a stop within this */
/* Pool worker items (tailrace/encoding.h): a = kind << 56 | task, b = seq; the
 * message item is the task's pitem[seq & pmask], written by the loop before the
 * push (release) that the worker's pop (acquire) pairs with, and not rewritten
 * before that seq is released. */
enum { W_RUN = 1, W_RESUME = 2, W_STOP = 3 };

/* Completion-queue items (tailrace/encoding.h): a = kind << 56 | task, b = payload. */
enum { CQ_DONE = 1, CQ_WAKE = 2, CQ_TIMER = 3, CQ_UNRUN = 4, CQ_ETIMER = 5 };

/* kind << 56 | task for a task index the loop validated (t < ntasks <= TR_ENC_TASK_MAX,
 * tr_loop_create): cannot fail; a broken invariant yields 0, which no reader accepts. */
static inline uint64_t kt_word(uint32_t kind, uint32_t t) {
    uint64_t w = 0;
    if (!tr_enc_kind_task(kind, t, &w))
        return 0;
    return w;
}

enum { H_WINDOW = 1, H_COMMIT = 2, H_USER = 3, H_CBTIMEOUT = 4 };
enum { PH_RUNNING = 0, PH_DRAINING = 1, PH_FINAL = 2, PH_FINISHED = 3 };
enum {
    CTL_NONE = 0,
    CTL_COMMIT = TR_OP_COMMIT,
    CTL_WINDOW = TR_OP_WINDOW,
    CTL_TIMER = TR_OP_TIMER,
    CTL_EOS = TR_OP_END_OF_STREAM
};

typedef struct part {
    uint64_t *items;
    uint64_t *handles;
    uint64_t head; /* popped count (loop thread) */
    uint64_t tail; /* pushed count = position of the next message read */
    uint32_t mask; /* storage size - 1 (power of two >= limit) */
    uint32_t limit;
    uint32_t fill; /* refill up to this many (<= limit, see FILL_BUDGET) */
    uint32_t lent; /* pool tasks: messages out on the worker, not yet released (rule 6) */
    uint8_t state;
    uint8_t refill_queued;
    uint32_t run_taken; /* scratch while a run is filled / completed */
    uint8_t wm_pending; /* wm_pos/wm_handle not yet written to the task's tr_watermark */
    uint64_t wm_pos, wm_handle;
    _Atomic uint32_t woken;      /* 1 while a CQ_WAKE item is queued: dedupes wake-ups */
    _Atomic uint64_t read_count; /* == tail, for metrics from any thread */
    /* TR_TASK_KEYED only (rules 30, 31): `head` is the first position not yet
     * dispatched; positions in [head, tail) may be dispatched already (KS_TAKEN,
     * picked by look-ahead); kbase is the first position not yet released in
     * offset order (the low watermark + 1): slots from kbase on stay in the ring
     * (their handles move the watermark), so the buffer bound counts from kbase */
    uint64_t *khash;
    uint8_t *kst;
    uint64_t kbase;
} part;

enum { KS_TAKEN = 1, KS_DONE = 2 };
#define TR_NO_SEQ UINT64_MAX /* trl_take_one: nothing to take (keyed task, every key busy) */

/* Ring slots in use: what the input buffer bounds (rule 6, 31). */
static inline uint64_t part_used(const part *P, int keyed) {
    return keyed ? P->tail - P->kbase : P->tail - P->head + P->lent;
}

typedef struct inflight {
    int64_t t0;
    uint64_t handle;
    uint32_t part;
    uint32_t done; /* 1: completed; 2: handed back unrun by the worker (not started) */
} inflight;

typedef struct task {
    tr_sequencer *seq;
    tr_watermark *wm;
    tr_event_time *et; /* its event-time watermark (rule 33), loop thread (get: any) */
    part *parts;
    inflight *infl; /* only with callback timeouts: per seq slot */
    uint64_t infl_mask;
    uint32_t nparts, rr, flags, worker, nended;
    uint64_t buffered;    /* items in all rings */
    uint64_t acquired;    /* sequence numbers handed out */
    uint64_t completions; /* completions seen by the loop (inflight = acquired - completions) */
    /* sequence numbers released from the sequencer; never more than `completions`
     * (see release_task: the completion queue's bound rests on it) */
    uint64_t seq_released;
    /* pool tasks: seqs [redo_from, redo_from + redo_count) came back unrun from the
     * worker (the tail of the acquired seqs); their items are pitem[seq & pmask] */
    uint32_t limit; /* sequencer window: max_concurrency, or POOL_WINDOW for pool tasks */
    uint64_t *pitem;
    uint64_t pmask;
    /* the partition of each outstanding seq: spart[seq & smask] (the sequencer's
     * tags hold the read position and the handle, each a full 64-bit word) */
    uint32_t *spart;
    /* sseen[seq & smask]: the loop has popped seq's completion (a CQ_DONE item,
     * or complete_local). Release stops at the first seq not seen, even one the
     * sequencer holds completed: a completion still queued (completions from
     * other threads arrive out of order) must never find the slots of its seq
     * (spart, skey, infl) reused by a later seq (trl_release_task) */
    uint8_t *sseen;
    uint64_t smask;
    uint64_t redo_from;
    uint32_t redo_count;
    uint8_t paused; /* the worker may have stopped this task: send W_RESUME first */
    uint8_t commit_req, commit_due, window_due, timer_due, commit_hold;
    uint8_t done, voted, in_control, control_kind, in_ready, in_ctl, in_dirty, timeout_armed;
    uint8_t in_run;    /* a RUN op of this task is in the batch or being executed */
    uint32_t run_left; /* what a RUN op cut by a barrier left of its turn (0: a new turn) */
    uint8_t halted;    /* a message of a run failed: never dispatch to it again */
    /* loop thread only: a sync run moved the task's event-time watermark without
     * recomputing it (tr_loop_event_seen_run): trl_et_sync recomputes before anything
     * reads it or changes a partition's state */
    uint8_t et_stale;
    /* its last window ran past the next window's time: that one is put off a period,
     * so the task gets its messages in between (trl_fire_timers; rules 5, 8) */
    uint8_t window_overran;
    int64_t window_next; /* when the window after the pending one falls due (its heap entry) */
    uint32_t queued;     /* PROCESS ops of this task in the batch, not handed out yet */
    uint32_t timer_gen;
    /* its last partition ended while others were idle: its end of stream waits
     * for the build that follows their re-poll (L->builds; see eos_gate) */
    uint64_t eos_not_before;
    /* when the pending window and the earliest pending timer fell due (the
     * loop's clock): whichever fell due first runs first (control_kind) */
    int64_t window_due_at, timer_due_at;
    /* pool tasks: 1 while a window, timer or (sync) commit of this task is due;
     * its worker stops invoking it and hands its queued ops back (rules 8, 9,
     * 23). Set by the loop (relaxed: trl_fire_timers) and by
     * tr_loop_set_user_timer on the worker itself for a timer due at once
     * (seq_cst, see trl_pool_unhold); cleared only by trl_pool_unhold, before
     * the loop pushes the W_RESUME that re-opens the task, and that push
     * (release) / pop (acquire) orders it */
    _Atomic uint32_t hold;
    _Atomic int64_t timer_when;     /* written by set_user_timer (any thread) */
    _Atomic uint32_t timer_pending; /* 1 while a CQ_TIMER item is queued */
    /* the earliest event-time timer, ms (INT64_MAX: none; tr_loop_set_event_timer,
     * any thread) and 1 while a CQ_ETIMER item is queued (rule 38) */
    _Atomic int64_t et_timer_at;
    _Atomic uint32_t et_pending;
    /* counters: written by the loop thread, read relaxed by any thread */
    _Atomic uint64_t processed, completed, windows, commits, timers;
    /* TR_TASK_POOL: ops its worker started (written by that worker only, read
     * relaxed by any thread): the processed metric, where `processed` counts the
     * ops handed to the worker, queued ones included */
    _Atomic uint64_t invoked;
    /* loop thread only: `invoked` when a window, timer or commit last fell due
     * (pool tasks; see trl_fire_timers) */
    uint64_t invoked_at_barrier;
    _Atomic uint32_t done_pub;
    /* TR_TASK_KEYED only: bkey/bcount, the busy keys: an open-addressing set
     * (linear probing from key_slot, backward-shift deletion) of the hashes of
     * the keys with a message outstanding (invoked, its completion not yet seen
     * by the loop), each with how many (1, except a pool task's queued ops);
     * it has at least twice as many slots as a task can have seqs outstanding,
     * so a probe always ends at an empty slot. Keys are told apart by their
     * whole 64-bit hash: keys that only share a slot never wait for each other
     * (rule 30). skey[seq & smask] the hash of each outstanding seq; kblocked: the
     * last look-ahead found every buffered message's key busy (cleared by a
     * completion or new input). sdisp: dispatch time per seq slot (metrics,
     * written by the loop thread, read relaxed by any thread) */
    uint8_t keyed, kblocked;
    /* kcatchup: a commit found slots taken ahead (tr_loop_task_settled): no
     * look-ahead past each ring's head until kahead is 0, then a commit is due */
    uint8_t kcatchup;
    uint64_t kahead; /* slots taken by look-ahead at positions >= their ring's head */
    uint64_t *bkey;
    uint32_t *bcount; /* 0: an empty slot */
    uint32_t bmask;
    uint64_t *skey;
    _Atomic int64_t *sdisp;
    _Atomic uint32_t kinflight;
} task;

/* Where a key hash's probe starts in the busy set (Fibonacci hashing of the
 * binding's hash). */
static inline uint32_t key_slot(const task *T, uint64_t h) {
    return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> 40) & T->bmask;
}

/* The busy set's slot of hash h, or the empty slot where its probe ends. */
static inline uint32_t key_find(const task *T, uint64_t h) {
    uint32_t i = key_slot(T, h);
    while (T->bcount[i] && T->bkey[i] != h)
        i = (i + 1) & T->bmask;
    return i;
}

/* Is a message with key hash h outstanding (rule 30)? */
static inline int key_busy(const task *T, uint64_t h) {
    return T->bcount[key_find(T, h)] != 0;
}

/* A message with key hash h is outstanding now. */
static inline void key_hold(task *T, uint64_t h) {
    uint32_t i = key_find(T, h);
    T->bkey[i] = h;
    T->bcount[i]++;
}

/* One outstanding message with key hash h is done: the key is free once none
 * is left. Emptying a slot shifts back the entries after it that probed past
 * it (linear probing keeps every entry reachable from its key_slot with no
 * empty slot between). */
static inline void key_unhold(task *T, uint64_t h) {
    uint32_t i = key_find(T, h);
    if (T->bcount[i] == 0 || --T->bcount[i] != 0)
        return; /* (not held cannot happen) */
    for (uint32_t j = (i + 1) & T->bmask; T->bcount[j]; j = (j + 1) & T->bmask) {
        /* j's entry may fill the hole at i when i lies on its probe path: from
         * its key_slot to j, cyclically */
        uint32_t home = key_slot(T, T->bkey[j]);
        if (((j - home) & T->bmask) >= ((j - i) & T->bmask)) {
            T->bkey[i] = T->bkey[j];
            T->bcount[i] = T->bcount[j];
            T->bcount[j] = 0;
            i = j;
        }
    }
}

typedef struct hent {
    int64_t when;
    uint32_t task;
    uint32_t kind;
    uint32_t gen;
} hent;

typedef struct worker {
    tr_loop *loop;
    tr_queue *q;
    pthread_t thread;
    uint32_t index;
    int started;
    /* 1 once the worker thread is past its last use of the binding's hooks
     * (release: stop_workers' acquire load, then it may join) */
    _Atomic uint32_t exited;
    /* worker thread only */
    int stop;           /* popped the stop sentinel */
    uint8_t *stopped;   /* [task / pool_size]: a request was made; hand the rest back */
    size_t n, pos;      /* items[pos..n) still to hand out */
    uint32_t budget;    /* ops left in this run_pool_batch call */
    size_t npend;       /* completions buffered for the next bulk push */
    int64_t pend_t0;    /* when the first of them was buffered */
    uint32_t pend_task; /* the task of the last one */
    tr_item items[POOL_BATCH];
    tr_item pend[POOL_PEND];
} worker;

struct tr_loop {
    tr_loop_config cfg;
    task *tasks;
    tr_notifier notifier; /* the loop sleeps here; cq pushes and stop notify it */
    tr_queue *cq;         /* completions, wake-ups, timer updates (MPSC) */
    worker *workers;
    const tr_loop_hooks *hooks; /* &hooks_copy while running */
    tr_loop_hooks hooks_copy;   /* workers outlive the caller's struct (see stop_workers) */
    /* the owner's reference plus one per live worker thread; the last one out
     * frees the loop (a worker abandoned by a bounded stop may outlive run) */
    _Atomic uint32_t refs;
    _Atomic uint32_t stop_requested; /* any thread sets; the loop reads after its notifier wait */
    _Atomic uint32_t parked;         /* in wait_for_work's sleep (tr_loop_idle) */
    _Atomic uint64_t error;          /* first posted error word (CAS from 0) */
    _Atomic uint32_t reason;
    _Atomic uint32_t discard;  /* workers drop remaining ops */
    _Atomic uint32_t draining; /* graceful stop: workers hand queued ops back unrun */
    _Atomic uint64_t chosen, idle_wakeups, iterations, batches;
    _Atomic uint64_t cq_high; /* most completion-queue items seen at one drain */
    /* a broken invariant found off the loop thread (a completion queue push that
     * found it full): the status, 0 while none; the loop stops with it */
    _Atomic uint32_t broken;
    uint64_t cq_bound; /* items the completion queue can hold at most (tr_loop_create) */
    /* loop thread: the earliest timer (window, commit, user timer, callback
     * timeout) as of the last build; a run ends before a message that would
     * start after it (tr_loop_run_yield, rule 8, 9, 23) */
    int64_t run_until;
    int64_t run_check_from; /* min(run_until - coarse lag, run_slice_end): earlier, go on */
    /* the coarse clock's reading past which a RUN op in progress ends (RUN_SLICE_NS
     * after it began; INT64_MAX outside runs) */
    int64_t run_slice_end;
    int64_t coarse_lag;
    /* the earliest user timer set (tr_loop_set_user_timer, any thread, usually a
     * process call inside a run) since the last build took it (exchange to
     * INT64_MAX): tr_loop_run_yield folds it into run_until, so a timer a
     * message schedules ends the run before the next message once it is due
     * (rules 8, 23). relaxed: the setter that matters is the loop thread itself;
     * one set from another thread reaches the loop through its CQ_TIMER item */
    _Atomic int64_t timer_min_new;

    /* ---- loop thread only ---- */
    uint32_t *ready;
    uint32_t ready_head, ready_count;
    uint32_t *carry;
    uint32_t carry_head, carry_count;
    uint32_t *ctl;
    uint32_t nctl;
    uint32_t *dirty;
    uint32_t ndirty;
    uint64_t *wm_dirty; /* task << 32 | partition: partitions with a pending advance */
    uint64_t nwm_dirty;
    uint64_t *refill; /* task << 32 | partition */
    uint64_t refill_head, refill_count, refill_cap;
    hent *heap;
    size_t nheap, heap_cap;
    tr_op batch[BATCH_MAX];
    uint64_t run_items[TR_RUN_MAX]; /* the items of the RUN op handed out last */
    uint32_t run_parts[TR_RUN_MAX]; /* their partitions */
    uint32_t run_task, run_count;
    uint32_t chain; /* PROCESS ops handed by tr_loop_next_of_task since next_op */
    uint32_t nbatch, bpos, budget;
    int phase;
    int64_t now;
    int64_t drain_deadline;
    uint32_t final_cursor;
    uint32_t done_count, settled_count;
    /* an end-of-stream hook requested shutdown ALL: the drain begins at the next
     * build, once the hooks that fell due with it have run (tr_loop_control_done) */
    uint8_t eos_shutdown;
    uint32_t nidle;
    int64_t next_idle_poll;
    uint64_t builds;      /* build_batch calls */
    uint32_t eos_waiting; /* tasks whose end of stream waits for L->builds (eos_not_before) */
    int progress, tick, ran;
    uint64_t handed; /* ops returned by next_op */
    tr_status internal;
    uint32_t to_task, to_part;
    uint64_t to_seq, to_handle;
    uint32_t drain_task, drain_part;
};

/* The loop's clock (tr_loop_config.clock_fn; virtual under a test driver). */
static inline int64_t trl_now(const tr_loop *L) {
    return L->cfg.clock_fn ? L->cfg.clock_fn(L->cfg.clock_ctx) : tr_now_ns();
}

/* The same clock read cheaply (tr_coarse_now_ns); a configured clock is read as is. */
static inline int64_t trl_coarse_now(const tr_loop *L) {
    return L->cfg.clock_fn ? L->cfg.clock_fn(L->cfg.clock_ctx) : tr_coarse_now_ns();
}

static inline void bump(_Atomic uint64_t *c) {
    /* single writer (the loop thread); relaxed: readers want a snapshot only */
    atomic_store_explicit(c, atomic_load_explicit(c, TR_RELAXED) + 1, TR_RELAXED);
}

static inline void bump_n(_Atomic uint64_t *c, uint64_t n) {
    atomic_store_explicit(c, atomic_load_explicit(c, TR_RELAXED) + n, TR_RELAXED);
}

/* The keys-in-flight gauge of a keyed task: single writer (the loop thread);
 * relaxed, a metric read by any thread. */
static inline void kinflight_add(task *T, int32_t d) {
    atomic_store_explicit(&T->kinflight,
                          (uint32_t)((int32_t)atomic_load_explicit(&T->kinflight, TR_RELAXED) + d),
                          TR_RELAXED);
}

/* a pool op handed back unrun was not processed after all (see CQ_UNRUN) */
static inline void unbump_n(_Atomic uint64_t *c, uint64_t n) {
    atomic_store_explicit(c, atomic_load_explicit(c, TR_RELAXED) - n, TR_RELAXED);
}

static inline uint32_t pow2_at_least(uint64_t n) {
    uint64_t p = 2;
    while (p < n && p < (1ull << 30))
        p <<= 1;
    return (uint32_t)p;
}

static inline int commit_pending(const task *T) {
    return T->commit_req || T->commit_due;
}

/* A pending synchronous commit: no new message goes to T until it has run (rule 9). */
static inline int commit_holds(const tr_loop *L, const task *T) {
    return !L->cfg.async_commit && commit_pending(T);
}

/* Messages T's next RUN op may take: what a cut run left of its turn, else a whole
 * turn (trl_carry). */
static inline uint32_t run_quota(const task *T) {
    return T->run_left ? T->run_left : TR_RUN_MAX;
}

/* Loop thread: runs end before `when` (the earliest timer); run_check_from is
 * when the coarse clock may already be past it. */
static inline void set_run_until(tr_loop *L, int64_t when) {
    L->run_until = when;
    int64_t from = when > INT64_MIN + L->coarse_lag ? when - L->coarse_lag : INT64_MIN;
    L->run_check_from = from < L->run_slice_end ? from : L->run_slice_end;
}

/* A RUN op begins (end: RUN_SLICE_NS from now) or ended (INT64_MAX). */
static inline void run_slice(tr_loop *L, int64_t end) {
    L->run_slice_end = end;
    set_run_until(L, L->run_until);
}

/* Ops of a pool task queued or running on its worker (not completed, not handed back). */
static inline uint64_t at_worker(const task *T) {
    return T->acquired - T->completions - T->redo_count;
}

/* The sequencer flags of a completion whose process call made `requests`: the
 * bits ride in its user field, and a commit request holds the releases after
 * it until the commit has run (TR_SEQ_COMMIT, rule 15). */
static inline uint32_t seq_flags(uint32_t requests) {
    requests &= TR_REQ_MASK;
    uint32_t f = requests << TR_SEQ_USER_SHIFT;
    if (requests & (TR_REQ_COMMIT_CURRENT | TR_REQ_COMMIT_ALL))
        f |= TR_SEQ_COMMIT;
    return f;
}

static inline int worker_has_room(const tr_loop *L, const task *T) {
    const worker *W = &L->workers[T->worker];
    /* the loop is the only producer, so the size can only shrink meanwhile; one
     * slot stays free for the stop sentinel */
    return tr_queue_size_approx(W->q) + 2 <= tr_queue_capacity(W->q);
}

/* May T be dispatched to now? (trl_maybe_ready, and the scheduler before each
 * dispatch.) */
/* The task's watermark has reached its earliest event-time timer (rule 38). */
static inline int et_due(const task *T) {
    int64_t at = atomic_load_explicit(&T->et_timer_at, TR_RELAXED); /* a number only */
    return at != INT64_MAX && tr_event_time_get(T->et) >= at;
}

static inline int runnable(const tr_loop *L, const task *T) {
    if (L->phase != PH_RUNNING || T->done || T->in_control || T->window_due || T->timer_due ||
        T->in_run || T->halted)
        return 0;
    if (commit_holds(L, T))
        return 0;
    if (T->flags & TR_TASK_POOL) {
        /* after the worker stopped this task, hand out again only once everything
         * it still had came back, so the handed-back tail stays in seq order */
        if ((T->paused || T->redo_count) && at_worker(T) != 0)
            return 0;
        if (!worker_has_room(L, T))
            return 0;
        if (T->redo_count)
            return 1; /* already hold their seqs */
    }
    /* queued: lazy PROCESS ops in the batch, each to take one message (pool
     * tasks have none) */
    if (T->buffered <= T->queued || T->kblocked)
        return 0;
    /* keyed loop-thread tasks: max concurrency counts invoked, not completed
     * (rule 2); the wider sequencer window holds the completed-unreleased */
    if (T->keyed && !(T->flags & TR_TASK_POOL) &&
        T->acquired - T->completions + T->queued >= L->cfg.max_concurrency)
        return 0;
    if (tr_sequencer_outstanding(T->seq) + T->queued >= T->limit)
        return 0;
    return 1;
}

/* Which control op may run for T now (commit > window > timer > end of stream). */
static inline int control_kind(const tr_loop *L, const task *T) {
    if (T->in_control || L->phase >= PH_FINAL)
        return CTL_NONE;
    /* a done task (rule 11) still commits: a commit ALL request (rule 14) and its
     * commit period (rule 9) write what it released since its last commit */
    if (commit_pending(T)) {
        /* rule 9: nothing invoked-and-incomplete, unless async commit (rule 10);
         * completed-but-held messages are fine: they are exactly the tail the
         * commit must not cover (rule 15) */
        if (L->cfg.async_commit || T->acquired == T->completions + T->redo_count)
            return CTL_COMMIT;
        return CTL_NONE;
    }
    if (L->phase != PH_RUNNING || T->done)
        return CTL_NONE;
    uint32_t out = tr_sequencer_outstanding(T->seq);
    /* ops handed back unrun (the tail) were never invoked: they do not hold
     * a window or timer back (they run after it) */
    /* windows and timers in the order they fell due; at one instant the window first */
    if (T->window_due && !(T->timer_due && T->timer_due_at < T->window_due_at))
        return out == T->redo_count ? CTL_WINDOW : CTL_NONE;
    if (T->timer_due)
        return out == T->redo_count ? CTL_TIMER : CTL_NONE;
    if (T->nended == T->nparts && T->buffered == 0 && out == 0 && !T->halted &&
        L->builds >= T->eos_not_before)
        return CTL_EOS;
    return CTL_NONE;
}

/* ---- shared between the loop's files, by the file that defines them ---- */

/* loop.c (layer 1) */
void trl_loop_unref(tr_loop *L);
void trl_cq_push(tr_loop *L, tr_item it);

/* loop_state.c (layer 1) */
void trl_maybe_ready(tr_loop *L, uint32_t t);
void trl_carry(tr_loop *L, uint32_t t);
void trl_maybe_control(tr_loop *L, uint32_t t);
void trl_et_check(tr_loop *L, uint32_t t);
/* The loop thread, or NULL: the tr_loop whose tr_loop_run this thread is in. */
extern _Thread_local tr_loop *trl_thread_loop;
/* Loop thread: recompute the task's event-time watermark if a sync run left it stale
 * (tr_loop_event_seen_run), with the partitions' state as the run left it. */
static inline void trl_et_sync(tr_loop *L, task *T) {
    if (T->et_stale) {
        T->et_stale = 0;
        tr_event_time_update(T->et, trl_coarse_now(L));
    }
}
void trl_mark_dirty(tr_loop *L, uint32_t t);
void trl_queue_refill(tr_loop *L, uint32_t t, uint32_t p);
void trl_repoll_idle(tr_loop *L);
void trl_eos_gate(tr_loop *L, uint32_t t);
void trl_finish(tr_loop *L, tr_stop_reason reason);
void trl_begin_drain(tr_loop *L, tr_stop_reason reason);
void trl_settle_check(tr_loop *L, int after_batch);
void trl_apply_requests(tr_loop *L, uint32_t t, uint32_t req);
void trl_pool_unhold(tr_loop *L, task *T);

/* loop_timers.c (layer 2) */
int trl_heap_push(tr_loop *L, int64_t when, uint32_t t, uint32_t kind, uint32_t gen);
void trl_heap_compact(tr_loop *L);
void trl_fire_timers(tr_loop *L);
void trl_arm_timeout(tr_loop *L, uint32_t t, uint64_t seq, uint64_t handle, uint32_t p);

/* loop_input.c (layer 3) */
uint64_t trl_take_one(tr_loop *L, uint32_t t, uint32_t *part_out, uint64_t *item_out,
                      uint64_t *handle_out);

/* loop_release.c (layer 3) */
void trl_wm_flush(tr_loop *L);
void trl_release_task(tr_loop *L, uint32_t t, int all);
void trl_process_dirty(tr_loop *L);
void trl_drain_completions(tr_loop *L);

/* loop_pool.c (layer 4) */
tr_status trl_start_workers(tr_loop *L);
uint32_t trl_dispatch_pool(tr_loop *L, uint32_t t, uint32_t budget);
void trl_stop_workers(tr_loop *L);

#endif
