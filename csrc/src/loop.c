/* The dispatch loop: see tailrace/loop.h for the contract.
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
 *   ctl    - stack of tasks whose control work (commit > window > timer > end of
 *            stream) is eligible now; emitted before any normal work.
 *   dirty  - tasks with completions to release.
 *   refill - FIFO ring of partitions whose ring has room and whose reader is active.
 *   heap   - timers: window, commit, user timer, callback timeout (lazy deletion).
 */
#include "tailrace/loop.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tailrace/atomics.h"
#include "tailrace/clock.h"
#include "tailrace/notifier.h"
#include "tailrace/queue.h"
#include "tailrace/sequencer.h"

#define PART_BITS 20u
#define PART_MASK ((1u << PART_BITS) - 1u)
#define POS_MAX (UINT64_MAX >> PART_BITS)
#define BATCH_MAX 64u
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
#define POOL_TASK_BITS 24u
#define POOL_TASK_MASK ((1u << POOL_TASK_BITS) - 1u)
#define POOL_WINDOW 128u         /* seqs a pool task may have queued/running on its worker */
#define POOL_BATCH 64u           /* items a worker pops from its queue at once */
#define POOL_PEND 256u           /* completions a worker buffers before one bulk push */
#define POOL_BUDGET 1024u        /* ops per run_pool_batch call (lock hold) */
#define POOL_FLUSH_NS 1000000LL  /* push buffered completions at least this often */
#define POOL_RESUME (1ull << 63) /* worker item {0, RESUME | task}: run that task again */

/* Completion-queue items: a = kind << 56 | task, b = payload. */
enum { CQ_DONE = 1, CQ_WAKE = 2, CQ_TIMER = 3, CQ_UNRUN = 4 };
#define CQ_KIND_SHIFT 56

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
} part;

typedef struct inflight {
    int64_t t0;
    uint64_t handle;
    uint32_t part;
    uint32_t done; /* 1: completed; 2: handed back unrun by the worker (not started) */
} inflight;

typedef struct task {
    tr_sequencer *seq;
    tr_watermark *wm;
    part *parts;
    inflight *infl; /* only with callback timeouts: per seq slot */
    uint64_t infl_mask;
    uint32_t nparts, rr, flags, worker, nended;
    uint64_t buffered;    /* items in all rings */
    uint64_t acquired;    /* sequence numbers handed out */
    uint64_t completions; /* completions seen by the loop (inflight = acquired - completions) */
    /* pool tasks: seqs [redo_from, redo_from + redo_count) came back unrun from the
     * worker (the tail of the acquired seqs); their items are pitem[seq & pmask] */
    uint32_t limit; /* sequencer window: max_concurrency, or POOL_WINDOW for pool tasks */
    uint64_t *pitem;
    uint64_t pmask;
    uint64_t redo_from;
    uint32_t redo_count;
    uint8_t paused; /* the worker may have stopped this task: send POOL_RESUME first */
    uint8_t commit_req, commit_due, window_due, timer_due, commit_hold;
    uint8_t done, voted, in_control, control_kind, in_ready, in_ctl, in_dirty, timeout_armed;
    uint8_t in_run;  /* a RUN op of this task is in the batch or being executed */
    uint8_t halted;  /* a message of a run failed: never dispatch to it again */
    uint32_t queued; /* PROCESS ops of this task in the batch, not handed out yet */
    uint32_t timer_gen;
    _Atomic int64_t timer_when;     /* written by set_user_timer (any thread) */
    _Atomic uint32_t timer_pending; /* 1 while a CQ_TIMER item is queued */
    /* counters: written by the loop thread, read relaxed by any thread */
    _Atomic uint64_t processed, completed, windows, commits, timers;
    _Atomic uint32_t done_pub;
} task;

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
    /* worker thread only */
    int stop;         /* popped the stop sentinel */
    uint8_t *stopped; /* [task / pool_size]: a request was made; hand the rest back */
    size_t n, pos;    /* items[pos..n) still to hand out */
    uint32_t budget;  /* ops left in this run_pool_batch call */
    size_t npend;     /* completions buffered for the next bulk push */
    int64_t pend_t0;  /* when the first of them was buffered */
    tr_item items[POOL_BATCH];
    tr_item pend[POOL_PEND];
} worker;

struct tr_loop {
    tr_loop_config cfg;
    task *tasks;
    tr_notifier notifier; /* the loop sleeps here; cq pushes and stop notify it */
    tr_queue *cq;         /* completions, wake-ups, timer updates (MPSC) */
    worker *workers;
    const tr_loop_hooks *hooks;
    _Atomic uint32_t stop_requested; /* any thread sets; the loop reads after its notifier wait */
    _Atomic uint32_t parked;         /* in wait_for_work's sleep (tr_loop_idle) */
    _Atomic uint64_t error;          /* first posted error word (CAS from 0) */
    _Atomic uint32_t reason;
    _Atomic uint32_t discard;  /* workers drop remaining ops */
    _Atomic uint32_t draining; /* graceful stop: workers hand queued ops back unrun */
    _Atomic uint64_t chosen, idle_wakeups, iterations, batches;

    /* ---- loop thread only ---- */
    uint32_t *ready;
    uint32_t ready_head, ready_count;
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
    uint32_t nidle;
    int64_t next_idle_poll;
    int progress, tick, ran;
    uint64_t handed; /* ops returned by next_op */
    tr_status internal;
    uint32_t to_task, to_part;
    uint64_t to_seq, to_handle;
    uint32_t drain_task, drain_part;
};

/* The loop's clock (tr_loop_config.clock_fn; virtual under a test driver). */
static inline int64_t loop_now(const tr_loop *L) {
    return L->cfg.clock_fn ? L->cfg.clock_fn(L->cfg.clock_ctx) : tr_now_ns();
}

static inline void bump(_Atomic uint64_t *c) {
    /* single writer (the loop thread); relaxed: readers want a snapshot only */
    atomic_store_explicit(c, atomic_load_explicit(c, TR_RELAXED) + 1, TR_RELAXED);
}

static inline void bump_n(_Atomic uint64_t *c, uint64_t n) {
    atomic_store_explicit(c, atomic_load_explicit(c, TR_RELAXED) + n, TR_RELAXED);
}

static uint32_t pow2_at_least(uint64_t n) {
    uint64_t p = 2;
    while (p < n && p < (1ull << 30))
        p <<= 1;
    return (uint32_t)p;
}

/* ------------------------------------------------------------------ heap */

static int heap_push(tr_loop *L, int64_t when, uint32_t t, uint32_t kind, uint32_t gen) {
    if (L->nheap == L->heap_cap) {
        size_t cap = L->heap_cap * 2;
        hent *h = realloc(L->heap, cap * sizeof *h);
        if (!h) {
            L->internal = TR_ENOMEM;
            return -1;
        }
        L->heap = h;
        L->heap_cap = cap;
    }
    size_t i = L->nheap++;
    hent e = {when, t, kind, gen};
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (L->heap[up].when <= when)
            break;
        L->heap[i] = L->heap[up];
        i = up;
    }
    L->heap[i] = e;
    return 0;
}

static void heap_sift_down(tr_loop *L, size_t i) {
    hent e = L->heap[i];
    size_t n = L->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && L->heap[c + 1].when < L->heap[c].when)
            c++;
        if (L->heap[c].when >= e.when)
            break;
        L->heap[i] = L->heap[c];
        i = c;
    }
    L->heap[i] = e;
}

static hent heap_pop(tr_loop *L) {
    hent top = L->heap[0];
    L->heap[0] = L->heap[--L->nheap];
    if (L->nheap)
        heap_sift_down(L, 0);
    return top;
}

/* Drop superseded user-timer entries when they pile up (a task re-scheduling
 * its earliest timer again and again). */
static void heap_compact(tr_loop *L) {
    size_t j = 0;
    for (size_t i = 0; i < L->nheap; i++) {
        hent e = L->heap[i];
        if (e.kind == H_USER && e.gen != L->tasks[e.task].timer_gen)
            continue;
        L->heap[j++] = e;
    }
    L->nheap = j;
    for (size_t i = j / 2; i-- > 0;)
        heap_sift_down(L, i);
}

/* ------------------------------------------------------------ scheduling */

static inline int commit_pending(const task *T) {
    return T->commit_req || T->commit_due;
}

static inline int worker_has_room(const tr_loop *L, const task *T) {
    const worker *W = &L->workers[T->worker];
    /* the loop is the only producer, so the size can only shrink meanwhile; one
     * slot stays free for the stop sentinel */
    return tr_queue_size_approx(W->q) + 2 <= tr_queue_capacity(W->q);
}

/* Ops of a pool task queued or running on its worker (not completed, not handed back). */
static inline uint64_t at_worker(const task *T) {
    return T->acquired - T->completions - T->redo_count;
}

static int runnable(const tr_loop *L, const task *T) {
    if (L->phase != PH_RUNNING || T->done || T->in_control || T->window_due || T->timer_due ||
        T->in_run || T->halted)
        return 0;
    if (!L->cfg.async_commit && commit_pending(T))
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
    if (T->buffered == 0)
        return 0;
    if (tr_sequencer_outstanding(T->seq) >= T->limit)
        return 0;
    return 1;
}

static void maybe_ready(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    if (T->in_ready || !runnable(L, T))
        return;
    T->in_ready = 1;
    L->ready[(L->ready_head + L->ready_count) % L->cfg.ntasks] = t;
    L->ready_count++;
}

/* Which control op may run for T now (commit > window > timer > end of stream). */
static int control_kind(const tr_loop *L, const task *T) {
    if (T->in_control || T->done || L->phase >= PH_FINAL)
        return CTL_NONE;
    if (commit_pending(T)) {
        /* rule 9: nothing invoked-and-incomplete, unless async commit (rule 10);
         * completed-but-held messages are fine: they are exactly the tail the
         * commit must not cover (rule 15) */
        if (L->cfg.async_commit || T->acquired == T->completions + T->redo_count)
            return CTL_COMMIT;
        return CTL_NONE;
    }
    if (L->phase != PH_RUNNING)
        return CTL_NONE;
    uint32_t out = tr_sequencer_outstanding(T->seq);
    /* ops handed back unrun (the tail) were never invoked: they do not hold
     * a window or timer back (they run after it) */
    if (T->window_due)
        return out == T->redo_count ? CTL_WINDOW : CTL_NONE;
    if (T->timer_due)
        return out == T->redo_count ? CTL_TIMER : CTL_NONE;
    if (T->nended == T->nparts && T->buffered == 0 && out == 0 && !T->halted)
        return CTL_EOS;
    return CTL_NONE;
}

static void maybe_control(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    if (T->in_ctl || control_kind(L, T) == CTL_NONE)
        return;
    T->in_ctl = 1;
    L->ctl[L->nctl++] = t;
}

static void mark_dirty(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    if (T->in_dirty)
        return;
    T->in_dirty = 1;
    L->dirty[L->ndirty++] = t;
}

static void queue_refill(tr_loop *L, uint32_t t, uint32_t p) {
    part *P = &L->tasks[t].parts[p];
    if (P->refill_queued || P->state != TR_PART_ACTIVE)
        return;
    P->refill_queued = 1;
    L->refill[(L->refill_head + L->refill_count) % L->refill_cap] = ((uint64_t)t << 32) | p;
    L->refill_count++;
}

static void finish(tr_loop *L, tr_stop_reason reason) {
    uint32_t none = TR_STOP_NONE;
    /* relaxed: read by stats and by the owner after run returns (join orders it) */
    atomic_compare_exchange_strong_explicit(&L->reason, &none, (uint32_t)reason, TR_RELAXED,
                                            TR_RELAXED);
    L->phase = PH_FINISHED;
}

static void begin_drain(tr_loop *L, tr_stop_reason reason) {
    if (L->phase != PH_RUNNING)
        return;
    uint32_t none = TR_STOP_NONE;
    /* relaxed: the first reason wins; readers (stop_reason) need only the value,
     * and the binding reads it after tr_loop_run returned */
    atomic_compare_exchange_strong_explicit(&L->reason, &none, (uint32_t)reason, TR_RELAXED,
                                            TR_RELAXED);
    L->phase = PH_DRAINING;
    /* workers stop invoking queued ops: dispatch has stopped (rule 19). relaxed:
     * a worker that reads 0 late invokes one more op it already held, which is
     * still a correct outstanding callback the drain waits for; nothing else is
     * published through this flag */
    atomic_store_explicit(&L->draining, 1, TR_RELAXED);
    L->drain_deadline = L->now + (L->cfg.shutdown_ns > 0 ? L->cfg.shutdown_ns : 0);
    for (uint32_t t = 0; t < L->cfg.ntasks; t++)
        maybe_control(L, t);
}

static void settle_check(tr_loop *L) {
    if (L->done_count == L->cfg.ntasks)
        begin_drain(L, TR_STOP_END_OF_STREAM);
    else if (L->settled_count == L->cfg.ntasks)
        begin_drain(L, TR_STOP_SHUTDOWN);
}

static void apply_requests(tr_loop *L, uint32_t t, uint32_t req) {
    task *T = &L->tasks[t];
    if (req & TR_REQ_COMMIT_ALL) {
        for (uint32_t u = 0; u < L->cfg.ntasks; u++) {
            L->tasks[u].commit_req = 1;
            maybe_control(L, u);
        }
    } else if (req & TR_REQ_COMMIT_CURRENT) {
        T->commit_req = 1;
        maybe_control(L, t);
    }
    if ((req & TR_REQ_SHUTDOWN_CURRENT) && !T->voted) {
        T->voted = 1;
        if (!T->done)
            L->settled_count++;
        settle_check(L);
    }
    if (req & TR_REQ_SHUTDOWN_ALL)
        begin_drain(L, TR_STOP_SHUTDOWN);
}

/* A released message moves its partition's low watermark. The write to the
 * tr_watermark (a seqlock write) is deferred to wm_flush: once per batch and
 * before anything reads the watermark, so a burst of releases costs one. */
static inline void wm_note(tr_loop *L, uint32_t t, uint32_t p, uint64_t pos, uint64_t handle) {
    part *P = &L->tasks[t].parts[p];
    P->wm_pos = pos;
    P->wm_handle = handle;
    if (!P->wm_pending) {
        P->wm_pending = 1;
        L->wm_dirty[L->nwm_dirty++] = ((uint64_t)t << 32) | p;
    }
}

static void wm_flush(tr_loop *L) {
    for (uint64_t i = 0; i < L->nwm_dirty; i++) {
        uint32_t t = (uint32_t)(L->wm_dirty[i] >> 32), p = (uint32_t)L->wm_dirty[i];
        part *P = &L->tasks[t].parts[p];
        P->wm_pending = 0;
        /* positions of one partition are released in increasing order, so
         * advance cannot regress */
        (void)tr_watermark_advance(L->tasks[t].wm, p, P->wm_pos, P->wm_handle);
    }
    L->nwm_dirty = 0;
}

/* Release T's contiguous completed prefix into its watermarks (rule 12). Stops
 * right after a completion carrying a commit request and holds the rest until
 * that commit has run (rule 15), unless `all` (the final commit). */
static void release_task(tr_loop *L, uint32_t t, int all) {
    task *T = &L->tasks[t];
    tr_seq_release buf[64];
    for (;;) {
        if (T->commit_hold && !all)
            break;
        size_t n = tr_sequencer_release(T->seq, buf, 64);
        for (size_t i = 0; i < n; i++) {
            uint32_t p = (uint32_t)(buf[i].tag_a & PART_MASK);
            uint64_t pos = buf[i].tag_a >> PART_BITS;
            wm_note(L, t, p, pos, buf[i].tag_b);
            bump(&T->completed);
            if (T->flags & TR_TASK_POOL) {
                part *P = &T->parts[p];
                P->lent--;
                if (P->tail - P->head + P->lent <= P->fill / 2)
                    queue_refill(L, t, p);
            }
            uint32_t req = (buf[i].flags >> TR_SEQ_USER_SHIFT) & TR_REQ_MASK;
            if (req && (T->flags & TR_TASK_POOL))
                T->paused = 1; /* its worker stopped invoking this task */
            if (req && !all)
                apply_requests(L, t, req);
        }
        if (n == 0)
            break;
        if ((buf[n - 1].flags & TR_SEQ_COMMIT) && !all)
            T->commit_hold = 1;
    }
    maybe_ready(L, t);
    maybe_control(L, t);
}

static void process_dirty(tr_loop *L) {
    while (L->ndirty) {
        uint32_t t = L->dirty[--L->ndirty];
        L->tasks[t].in_dirty = 0;
        release_task(L, t, 0);
    }
}

static void drain_completions(tr_loop *L) {
    tr_item items[64];
    size_t n;
    while ((n = tr_queue_try_pop_batch_sc(L->cq, items, 64)) > 0) {
        L->progress = 1;
        for (size_t i = 0; i < n; i++) {
            uint32_t kind = (uint32_t)(items[i].a >> CQ_KIND_SHIFT);
            uint32_t t = (uint32_t)(items[i].a & 0xffffffffu);
            task *T = &L->tasks[t];
            if (kind == CQ_DONE) {
                T->completions++;
                if (T->infl)
                    T->infl[items[i].b & T->infl_mask].done = 1;
                mark_dirty(L, t);
            } else if (kind == CQ_UNRUN) {
                /* a pool op the worker did not run: its seq joins the tail */
                if (T->redo_count == 0)
                    T->redo_from = items[i].b;
                else if (items[i].b != T->redo_from + T->redo_count)
                    L->internal = TR_EINVAL; /* cannot happen: a worker keeps seq order */
                T->redo_count++;
                T->paused = 1;
                if (T->infl)
                    T->infl[items[i].b & T->infl_mask].done = 2;
                mark_dirty(L, t);
            } else if (kind == CQ_WAKE) {
                uint32_t p = (uint32_t)items[i].b;
                part *P = &T->parts[p];
                /* acq_rel: pairs with wake_partition's exchange; a wake after this
                 * point queues a new item */
                atomic_exchange_explicit(&P->woken, 0, TR_ACQ_REL);
                if (P->state == TR_PART_IDLE) {
                    P->state = TR_PART_ACTIVE;
                    L->nidle--;
                    queue_refill(L, t, p);
                }
            } else if (kind == CQ_TIMER) {
                /* clear the flag before reading `when`: a newer set_user_timer
                 * either is seen by the load below or queues another item */
                atomic_exchange_explicit(&T->timer_pending, 0, TR_ACQ_REL);
                int64_t when = atomic_load_explicit(&T->timer_when, TR_ACQUIRE);
                T->timer_gen++;
                if (when != INT64_MAX && !T->done)
                    heap_push(L, when, t, H_USER, T->timer_gen);
            }
        }
    }
    if (L->nheap > 8u * L->cfg.ntasks + 64u)
        heap_compact(L);
}

static void check_timeout(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    uint64_t s = tr_sequencer_released_upto(T->seq);
    uint64_t end = tr_sequencer_next_seq(T->seq);
    while (s < end && T->infl[s & T->infl_mask].done)
        s++;
    if (s == end) {
        T->timeout_armed = 0;
        return;
    }
    inflight *f = &T->infl[s & T->infl_mask];
    int64_t deadline = f->t0 + L->cfg.callback_timeout_ns;
    if (deadline <= L->now) {
        L->to_task = t;
        L->to_part = f->part;
        L->to_seq = s;
        L->to_handle = f->handle;
        finish(L, TR_STOP_TIMEOUT);
        return;
    }
    heap_push(L, deadline, t, H_CBTIMEOUT, 0);
}

static int64_t rearm(int64_t when, int64_t period, int64_t now) {
    int64_t next = when + period;
    return next <= now ? now + period : next;
}

static void fire_timers(tr_loop *L) {
    while (L->nheap && L->heap[0].when <= L->now && L->phase != PH_FINISHED) {
        hent e = heap_pop(L);
        task *T = &L->tasks[e.task];
        if (e.kind == H_CBTIMEOUT) {
            check_timeout(L, e.task);
            continue;
        }
        if (T->done || L->phase != PH_RUNNING)
            continue;
        if (e.kind == H_WINDOW) {
            T->window_due = 1; /* coalesces: one pending window at a time */
            heap_push(L, rearm(e.when, L->cfg.window_ns, L->now), e.task, H_WINDOW, 0);
        } else if (e.kind == H_COMMIT) {
            T->commit_due = 1;
            heap_push(L, rearm(e.when, L->cfg.commit_ns, L->now), e.task, H_COMMIT, 0);
        } else if (e.kind == H_USER) {
            if (e.gen != T->timer_gen)
                continue;
            T->timer_due = 1;
        }
        maybe_control(L, e.task);
    }
}

static void emit(tr_loop *L, uint32_t kind, uint32_t t, uint32_t p, uint32_t flags, uint64_t seq,
                 uint64_t item, uint64_t handle) {
    tr_op *op = &L->batch[L->nbatch++];
    op->kind = kind;
    op->task = t;
    op->partition = p;
    op->flags = flags;
    op->seq = seq;
    op->item = item;
    op->handle = handle;
    op->count = 0;
    op->reserved = 0;
}

/* Pick the partition to serve next (round robin over non-empty rings). */
static inline uint32_t next_part(task *T) {
    uint32_t p = T->rr;
    for (uint32_t i = 0; i < T->nparts; i++, p = (p + 1 == T->nparts) ? 0 : p + 1) {
        if (T->parts[p].tail != T->parts[p].head)
            break;
    }
    T->rr = (p + 1 == T->nparts) ? 0 : p + 1;
    return p;
}

/* A TR_TASK_INLINE task with nothing outstanding or held: hand it a run of up
 * to TR_RUN_MAX of its buffered messages (fill_run picks them when the op is
 * handed out). The items stay in the rings until tr_loop_run_done pops the
 * ones the binding took. */
static void dispatch_run(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    T->in_run = 1;
    emit(L, TR_OP_RUN, t, 0, 0, 0, 0, 0);
    L->batch[L->nbatch - 1].count = T->buffered < TR_RUN_MAX ? (uint32_t)T->buffered : TR_RUN_MAX;
}

/* The messages of a run, in dispatch order: one partition's in a row, or
 * round robin message by message over the task's partitions (rule 5). */
static uint32_t fill_run(tr_loop *L, uint32_t t, uint32_t max) {
    task *T = &L->tasks[t];
    uint32_t n = 0;
    L->run_task = t;
    if (T->nparts == 1) {
        part *P = &T->parts[0];
        uint64_t avail = P->tail - P->head;
        n = avail < max ? (uint32_t)avail : max;
        for (uint32_t i = 0; i < n; i++) {
            L->run_items[i] = P->items[(P->head + i) & P->mask];
            L->run_parts[i] = 0;
        }
    } else {
        uint32_t p = T->rr, misses = 0;
        while (n < max && misses < T->nparts) {
            part *P = &T->parts[p];
            if (P->tail - P->head > P->run_taken) {
                L->run_items[n] = P->items[(P->head + P->run_taken) & P->mask];
                L->run_parts[n++] = p;
                P->run_taken++;
                misses = 0;
            } else {
                misses++;
            }
            p = (p + 1 == T->nparts) ? 0 : p + 1;
        }
        T->rr = p;
        for (uint32_t i = 0; i < n; i++)
            T->parts[L->run_parts[i]].run_taken = 0;
    }
    L->run_count = n;
    return n;
}

static inline void arm_timeout(tr_loop *L, uint32_t t, uint64_t seq, uint64_t handle, uint32_t p) {
    task *T = &L->tasks[t];
    inflight *f = &T->infl[seq & T->infl_mask];
    f->t0 = L->now;
    f->handle = handle;
    f->part = p;
    f->done = 0;
    if (!T->timeout_armed) {
        T->timeout_armed = 1;
        heap_push(L, L->now + L->cfg.callback_timeout_ns, t, H_CBTIMEOUT, 0);
    }
}

/* Pop T's next message (round robin over its partitions) and acquire its seq. */
static uint64_t take_one(tr_loop *L, uint32_t t, uint32_t *part_out, uint64_t *item_out,
                         uint64_t *handle_out) {
    task *T = &L->tasks[t];
    uint32_t p = next_part(T);
    part *P = &T->parts[p];
    uint64_t pos = P->head;
    uint64_t item = P->items[pos & P->mask];
    uint64_t handle = P->handles[pos & P->mask];
    P->head++;
    T->buffered--;
    uint64_t seq = 0;
    /* cannot fail: the caller checked outstanding < limit */
    (void)tr_sequencer_acquire(T->seq, ((pos & POS_MAX) << PART_BITS) | p, handle, &seq);
    T->acquired++;
    bump(&T->processed);
    bump(&L->chosen);
    if (T->infl)
        arm_timeout(L, t, seq, handle, p);
    if (T->flags & TR_TASK_POOL)
        P->lent++;
    if (P->tail - P->head + P->lent <= P->fill / 2)
        queue_refill(L, t, p);
    *part_out = p;
    *item_out = item;
    *handle_out = handle;
    return seq;
}

/* A loop-thread task's next PROCESS op: to `dst`, or to the batch when dst is NULL. */
static void dispatch_one(tr_loop *L, uint32_t t, tr_op *dst) {
    uint32_t p;
    uint64_t item, handle;
    uint64_t seq = take_one(L, t, &p, &item, &handle);
    if (dst) {
        memset(dst, 0, sizeof *dst);
        dst->kind = TR_OP_PROCESS;
        dst->task = t;
        dst->partition = p;
        dst->seq = seq;
        dst->item = item;
        dst->handle = handle;
    } else {
        emit(L, TR_OP_PROCESS, t, p, 0, seq, item, handle);
        L->tasks[t].queued++;
    }
}

static void push_worker(tr_queue *q, const tr_item *items, size_t n) {
    /* the loop is the only producer and the queue has room for every op its
     * tasks can have out (tr_loop_create), so this does not spin in practice */
    while (n) {
        size_t k = tr_queue_try_push_batch_mpsc(q, items, n);
        items += k;
        n -= k;
        if (n)
            tr_cpu_relax();
    }
}

/* Hand a pool task's work to its worker in one burst: the ops it gave back
 * (first, in seq order), then buffered messages up to the task's window.
 * Returns how many new messages were taken from the rings. */
static uint32_t dispatch_pool(tr_loop *L, uint32_t t, uint32_t budget) {
    task *T = &L->tasks[t];
    tr_queue *q = L->workers[T->worker].q;
    tr_item its[64];
    size_t n = 0;
    uint32_t taken = 0;
    if (T->paused) {
        /* every op the worker had for T is back (runnable): a fresh run */
        its[n++] = (tr_item){0, POOL_RESUME | t};
        T->paused = 0;
    }
    for (uint32_t i = 0; i < T->redo_count; i++) {
        uint64_t seq = T->redo_from + i;
        its[n++] = (tr_item){T->pitem[seq & T->pmask], (seq << POOL_TASK_BITS) | t};
        if (T->infl) {
            inflight *f = &T->infl[seq & T->infl_mask];
            arm_timeout(L, t, seq, f->handle, f->part);
        }
        if (n == 64) {
            push_worker(q, its, n);
            n = 0;
        }
    }
    T->redo_count = 0;
    while (taken < budget && T->buffered && tr_sequencer_outstanding(T->seq) < T->limit) {
        uint32_t p;
        uint64_t item, handle;
        uint64_t seq = take_one(L, t, &p, &item, &handle);
        T->pitem[seq & T->pmask] = item;
        its[n++] = (tr_item){item, (seq << POOL_TASK_BITS) | t};
        taken++;
        if (n == 64) {
            push_worker(q, its, n);
            n = 0;
        }
    }
    if (n)
        push_worker(q, its, n);
    L->progress = 1;
    return taken;
}

/* Graceful stop may proceed to the final commit: nothing invoked is
 * incomplete, and no commit request of a live task is still to run. */
static int drained(const tr_loop *L) {
    for (uint32_t t = 0; t < L->cfg.ntasks; t++) {
        const task *T = &L->tasks[t];
        if (T->acquired != T->completions + T->redo_count)
            return 0; /* handed-back ops were never invoked: nothing to await */
        if (!T->done && (T->in_control || commit_pending(T)))
            return 0;
    }
    return 1;
}

static void start_final(tr_loop *L) {
    for (uint32_t t = 0; t < L->cfg.ntasks; t++)
        release_task(L, t, 1);
    L->phase = PH_FINAL;
    L->final_cursor = 0;
}

/* Fill the batch: the one place that decides what runs next. */
static void build_batch(tr_loop *L) {
    if (L->phase == PH_FINISHED)
        return;
    L->nbatch = L->bpos = 0;
    if (atomic_load_explicit(&L->error, TR_ACQUIRE)) { /* pairs with post_error's CAS */
        finish(L, TR_STOP_ERROR);
        return;
    }
    if (L->internal != TR_OK) {
        finish(L, TR_STOP_ERROR);
        return;
    }
    L->now = loop_now(L);
    drain_completions(L);
    process_dirty(L);
    fire_timers(L);
    if (L->phase == PH_FINISHED)
        return;
    /* acquire: pairs with tr_loop_stop's release store */
    if (L->phase == PH_RUNNING && atomic_load_explicit(&L->stop_requested, TR_ACQUIRE))
        begin_drain(L, TR_STOP_EXTERNAL);
    if (L->phase == PH_RUNNING && L->nidle && L->now >= L->next_idle_poll) {
        for (uint32_t t = 0; t < L->cfg.ntasks; t++) {
            task *T = &L->tasks[t];
            for (uint32_t p = 0; p < T->nparts; p++) {
                if (T->parts[p].state == TR_PART_IDLE) {
                    T->parts[p].state = TR_PART_ACTIVE;
                    queue_refill(L, t, p);
                }
            }
        }
        L->nidle = 0;
    }
    if (L->phase == PH_DRAINING && L->nctl == 0 && (drained(L) || L->now >= L->drain_deadline))
        start_final(L);
    if (L->phase == PH_FINAL) {
        if (L->final_cursor == L->cfg.ntasks) {
            finish(L, TR_STOP_NONE);
            return;
        }
        while (L->final_cursor < L->cfg.ntasks && L->nbatch < BATCH_MAX)
            emit(L, TR_OP_COMMIT, L->final_cursor++, 0, TR_OPF_FINAL, 0, 0, 0);
        return;
    }

    /* control work first (rules 8, 9, 11, 23) */
    while (L->nctl && L->nbatch < BATCH_MAX) {
        uint32_t t = L->ctl[--L->nctl];
        task *T = &L->tasks[t];
        T->in_ctl = 0;
        int k = control_kind(L, T);
        if (k == CTL_NONE)
            continue;
        T->in_control = 1;
        T->control_kind = (uint8_t)k;
        if (k == CTL_COMMIT) {
            T->commit_req = T->commit_due = 0;
        } else if (k == CTL_WINDOW) {
            T->window_due = 0;
        } else if (k == CTL_TIMER) {
            T->timer_due = 0;
        }
        emit(L, (uint32_t)k, t, 0, 0, 0, 0, 0);
    }
    if (L->phase != PH_RUNNING)
        return;

    while (L->refill_count && L->nbatch < BATCH_MAX) {
        uint64_t e = L->refill[L->refill_head];
        L->refill_head = (L->refill_head + 1) % L->refill_cap;
        L->refill_count--;
        uint32_t t = (uint32_t)(e >> 32), p = (uint32_t)e;
        part *P = &L->tasks[t].parts[p];
        P->refill_queued = 0;
        uint64_t count = P->tail - P->head + P->lent;
        if (P->state == TR_PART_ACTIVE && count < P->fill)
            emit(L, TR_OP_REFILL, t, p, 0, 0, 0, P->fill - count);
    }

    /* normal work, round robin over ready tasks (rules 4, 5) */
    uint32_t pool_budget = 16 * BATCH_MAX;
    while (L->ready_count && L->nbatch < BATCH_MAX && pool_budget) {
        uint32_t t = L->ready[L->ready_head];
        L->ready_head = (L->ready_head + 1) % L->cfg.ntasks;
        L->ready_count--;
        task *T = &L->tasks[t];
        T->in_ready = 0;
        if (!runnable(L, T))
            continue;
        if ((T->flags & TR_TASK_INLINE) && !T->commit_hold &&
            tr_sequencer_outstanding(T->seq) == 0) {
            dispatch_run(L, t); /* back in the ready ring after run_done */
            continue;
        }
        if (T->flags & TR_TASK_POOL) {
            uint32_t taken =
                dispatch_pool(L, t, pool_budget < POOL_WINDOW ? pool_budget : POOL_WINDOW);
            pool_budget = taken < pool_budget ? pool_budget - taken : 0;
        } else {
            dispatch_one(L, t, NULL);
        }
        maybe_ready(L, t);
    }
}

/* Every op of a batch sees the watermarks of everything released before it
 * was built: a control op of a task is built only when nothing of that task
 * runs in between (rules 9, 15); other threads read at most a batch behind. */
static void build(tr_loop *L) {
    build_batch(L);
    wm_flush(L);
}

/* ------------------------------------------------------------- public API */

tr_status tr_loop_create(const tr_loop_config *cfg, const tr_loop_task *tasks, tr_loop **out) {
    if (!cfg || !tasks || !out || cfg->ntasks == 0 || cfg->ntasks > POOL_TASK_MASK ||
        cfg->max_concurrency == 0 || cfg->max_concurrency > TR_SEQ_MAX_CONCURRENCY ||
        cfg->input_buffer == 0 || cfg->input_buffer > (1u << 30) || cfg->pool_size > 4096)
        return TR_EINVAL;
    uint64_t total_parts = 0;
    for (uint32_t t = 0; t < cfg->ntasks; t++) {
        if (tasks[t].npartitions > PART_MASK + 1u)
            return TR_EINVAL;
        total_parts += tasks[t].npartitions;
    }
    /* pool tasks may have POOL_WINDOW seqs out (more than max_concurrency) on
     * their worker, unless callback timeouts are on (see loop.h) */
    uint32_t pool_limit = cfg->max_concurrency;
    if (cfg->pool_size && cfg->callback_timeout_ns <= 0 && pool_limit < POOL_WINDOW)
        pool_limit = POOL_WINDOW;
    uint64_t nlimit = 0; /* sum of the tasks' windows */
    for (uint32_t t = 0; t < cfg->ntasks; t++)
        nlimit +=
            (cfg->pool_size && (tasks[t].flags & TR_TASK_POOL)) ? pool_limit : cfg->max_concurrency;
    /* one item per outstanding seq, per partition (wake), per task (timer) */
    uint64_t cq_cap = nlimit + total_parts + cfg->ntasks + 16;
    if (cq_cap > (1ull << 30))
        return TR_EINVAL;

    tr_loop *L = calloc(1, sizeof *L);
    if (!L)
        return TR_ENOMEM;
    L->cfg = *cfg;
    if (L->cfg.max_idle_ns < MIN_IDLE_NS)
        L->cfg.max_idle_ns = MIN_IDLE_NS;
    tr_status st = tr_notifier_init(&L->notifier);
    if (st != TR_OK) {
        free(L);
        return st;
    }
    st = tr_queue_create((size_t)cq_cap, &L->notifier, &L->cq);
    if (st != TR_OK)
        goto fail;
    st = TR_ENOMEM;
    L->tasks = calloc(cfg->ntasks, sizeof *L->tasks);
    L->ready = calloc(cfg->ntasks, sizeof *L->ready);
    L->ctl = calloc(cfg->ntasks, sizeof *L->ctl);
    L->dirty = calloc(cfg->ntasks, sizeof *L->dirty);
    L->refill_cap = total_parts ? total_parts : 1;
    L->refill = calloc(L->refill_cap, sizeof *L->refill);
    L->wm_dirty = calloc(L->refill_cap, sizeof *L->wm_dirty);
    L->heap_cap = 4u * cfg->ntasks + 16u;
    L->heap = malloc(L->heap_cap * sizeof *L->heap);
    if (!L->tasks || !L->ready || !L->ctl || !L->dirty || !L->refill || !L->wm_dirty || !L->heap)
        goto fail;
    uint32_t infl_size = cfg->callback_timeout_ns > 0 ? pow2_at_least(cfg->max_concurrency) : 0;
    uint64_t fill = total_parts ? FILL_BUDGET / total_parts : cfg->input_buffer;
    if (fill < FILL_MIN)
        fill = FILL_MIN;
    if (fill > cfg->input_buffer)
        fill = cfg->input_buffer;
    /* (with callback timeouts, every task's window is max_concurrency) */
    for (uint32_t t = 0; t < cfg->ntasks; t++) {
        task *T = &L->tasks[t];
        T->nparts = tasks[t].npartitions;
        T->flags = tasks[t].flags;
        if (cfg->pool_size == 0)
            T->flags &= ~TR_TASK_POOL;
        if (T->flags & TR_TASK_POOL)
            T->flags &= ~TR_TASK_INLINE;
        T->worker = cfg->pool_size ? t % cfg->pool_size : 0;
        T->limit = (T->flags & TR_TASK_POOL) ? pool_limit : cfg->max_concurrency;
        atomic_init(&T->timer_when, INT64_MAX);
        st = tr_sequencer_create(T->limit, &T->seq);
        if (st != TR_OK)
            goto fail;
        st = tr_watermark_create(T->nparts, &T->wm);
        if (st != TR_OK)
            goto fail;
        st = TR_ENOMEM;
        if (T->flags & TR_TASK_POOL) {
            uint32_t size = pow2_at_least(T->limit);
            T->pitem = calloc(size, sizeof *T->pitem);
            if (!T->pitem)
                goto fail;
            T->pmask = size - 1;
        }
        if (infl_size) {
            T->infl = calloc(infl_size, sizeof *T->infl);
            if (!T->infl)
                goto fail;
            T->infl_mask = infl_size - 1;
        }
        if (T->nparts) {
            T->parts = calloc(T->nparts, sizeof *T->parts);
            if (!T->parts)
                goto fail;
        }
        for (uint32_t p = 0; p < T->nparts; p++) {
            part *P = &T->parts[p];
            /* sized for the fill, grown up to the limit if a push needs it (see
             * ring_room): the part of a big ring in use moves on every refill, so
             * with many partitions a ring the size of the limit is cold memory */
            uint32_t size = pow2_at_least(fill);
            P->items = malloc((size_t)size * sizeof *P->items);
            P->handles = malloc((size_t)size * sizeof *P->handles);
            if (!P->items || !P->handles)
                goto fail;
            P->mask = size - 1;
            P->limit = cfg->input_buffer;
            P->fill = (uint32_t)fill;
            P->state = TR_PART_ACTIVE;
        }
    }
    if (cfg->pool_size) {
        L->workers = calloc(cfg->pool_size, sizeof *L->workers);
        if (!L->workers)
            goto fail;
        uint64_t ntask_w = cfg->ntasks / cfg->pool_size + 1;
        for (uint32_t w = 0; w < cfg->pool_size; w++) {
            /* every op its tasks can have out, one resume item each, the sentinel */
            uint64_t cap = ntask_w * ((uint64_t)pool_limit + 1) + 2;
            if (cap > (1ull << 30))
                cap = 1ull << 30;
            L->workers[w].loop = L;
            L->workers[w].index = w;
            L->workers[w].stopped = calloc((size_t)ntask_w, 1);
            if (!L->workers[w].stopped)
                goto fail;
            st = tr_queue_create((size_t)cap, NULL, &L->workers[w].q);
            if (st != TR_OK)
                goto fail;
        }
    }
    *out = L;
    return TR_OK;
fail:
    tr_loop_destroy(L);
    return st;
}

void tr_loop_destroy(tr_loop *L) {
    if (!L)
        return;
    if (L->tasks) {
        for (uint32_t t = 0; t < L->cfg.ntasks; t++) {
            task *T = &L->tasks[t];
            if (T->seq)
                tr_sequencer_destroy(T->seq);
            if (T->wm)
                tr_watermark_destroy(T->wm);
            free(T->infl);
            free(T->pitem);
            if (T->parts) {
                for (uint32_t p = 0; p < T->nparts; p++) {
                    free(T->parts[p].items);
                    free(T->parts[p].handles);
                }
                free(T->parts);
            }
        }
    }
    if (L->workers) {
        for (uint32_t w = 0; w < L->cfg.pool_size; w++) {
            if (L->workers[w].q)
                tr_queue_destroy(L->workers[w].q);
            free(L->workers[w].stopped);
        }
        free(L->workers);
    }
    if (L->cq)
        tr_queue_destroy(L->cq);
    tr_notifier_destroy(&L->notifier);
    free(L->tasks);
    free(L->ready);
    free(L->ctl);
    free(L->dirty);
    free(L->refill);
    free(L->wm_dirty);
    free(L->heap);
    free(L);
}

static uint32_t seq_flags(uint32_t requests) {
    requests &= TR_REQ_MASK;
    uint32_t f = requests << TR_SEQ_USER_SHIFT;
    if (requests & (TR_REQ_COMMIT_CURRENT | TR_REQ_COMMIT_ALL))
        f |= TR_SEQ_COMMIT;
    return f;
}

/* Worker: push the buffered completions to the loop in one go (one notify). */
static void pool_flush(tr_loop *L, worker *W) {
    const tr_item *p = W->pend;
    size_t n = W->npend;
    while (n) {
        /* capacity covers every outstanding seq: only spins if that bound were wrong */
        size_t k = tr_queue_try_push_batch_mpsc(L->cq, p, n);
        p += k;
        n -= k;
        if (n)
            tr_cpu_relax();
    }
    W->npend = 0;
}

static inline void pool_note(tr_loop *L, worker *W, uint32_t kind, uint32_t t, uint64_t seq) {
    if (W->npend == 0)
        W->pend_t0 = tr_now_ns();
    W->pend[W->npend++] = (tr_item){((uint64_t)kind << CQ_KIND_SHIFT) | t, seq};
    if (W->npend == POOL_PEND)
        pool_flush(L, W);
}

static void *worker_main(void *arg) {
    worker *W = arg;
    tr_loop *L = W->loop;
    const tr_loop_hooks *H = L->hooks;
    if (H->worker_started)
        H->worker_started(H->ctx, W->index);
    while (!W->stop) {
        if (W->pos == W->n) {
            /* spin briefly, then park on the queue's notifier (rule 7) */
            W->pos = 0;
            W->n = tr_queue_try_pop_batch_sc(W->q, W->items, POOL_BATCH);
            if (W->n == 0) {
                if (tr_queue_pop_wait_sc(W->q, &W->items[0], -1) != TR_OK)
                    continue;
                W->n = 1 + tr_queue_try_pop_batch_sc(W->q, W->items + 1, POOL_BATCH - 1);
            }
        }
        W->budget = POOL_BUDGET;
        H->run_pool_batch(H->ctx, L, W->index);
        pool_flush(L, W);
    }
    if (H->worker_stopping)
        H->worker_stopping(H->ctx, W->index);
    return NULL;
}

int tr_loop_pool_next(tr_loop *L, uint32_t w, tr_op *out) {
    worker *W = &L->workers[w];
    for (;;) {
        if (W->pos == W->n) {
            /* the batch ran dry: let the loop see what is done, then take more
             * without giving the runtime lock back, within the budget */
            if (W->npend && (W->budget == 0 || tr_queue_empty_sc(W->q)))
                pool_flush(L, W);
            if (W->stop || W->budget == 0)
                return 0;
            W->pos = 0;
            W->n = tr_queue_try_pop_batch_sc(W->q, W->items, POOL_BATCH);
            if (W->n == 0)
                return 0;
        }
        tr_item it = W->items[W->pos++];
        if (it.a == 0) {
            if (it.b == 0) { /* the stop sentinel: pushed last */
                W->stop = 1;
                W->pos = W->n;
                return 0;
            }
            W->stopped[(uint32_t)(it.b & POOL_TASK_MASK) / L->cfg.pool_size] = 0; /* POOL_RESUME */
            continue;
        }
        uint32_t t = (uint32_t)(it.b & POOL_TASK_MASK);
        uint64_t seq = it.b >> POOL_TASK_BITS;
        memset(out, 0, sizeof *out);
        out->kind = TR_OP_PROCESS;
        out->task = t;
        out->seq = seq;
        out->item = it.a;
        /* acquire: pairs with the release store before the sentinel / post_error's CAS */
        if (atomic_load_explicit(&L->discard, TR_ACQUIRE) ||
            atomic_load_explicit(&L->error, TR_ACQUIRE)) {
            out->flags = TR_OPF_DISCARD; /* the loop has stopped: only drop the item */
            return 1;
        }
        /* relaxed: see begin_drain (a late read only runs an op already handed out) */
        if (W->stopped[t / L->cfg.pool_size] || atomic_load_explicit(&L->draining, TR_RELAXED)) {
            /* not invoked: back to the loop, which hands it out again in order */
            W->stopped[t / L->cfg.pool_size] = 1;
            pool_note(L, W, CQ_UNRUN, t, seq);
            continue;
        }
        if (W->budget)
            W->budget--;
        return 1;
    }
}

tr_status tr_loop_pool_done(tr_loop *L, uint32_t w, const tr_op *op, uint32_t requests) {
    if (w >= L->cfg.pool_size || op->task >= L->cfg.ntasks)
        return TR_EINVAL;
    worker *W = &L->workers[w];
    tr_status st = tr_sequencer_complete(L->tasks[op->task].seq, op->seq, seq_flags(requests));
    if (st != TR_OK)
        return st;
    /* a request (commit, shutdown) is acted on by the loop before this task's
     * next message is invoked: hand the rest back until the loop resumes it */
    if (requests & TR_REQ_MASK)
        W->stopped[op->task / L->cfg.pool_size] = 1;
    pool_note(L, W, CQ_DONE, op->task, op->seq);
    if (W->npend && tr_now_ns() - W->pend_t0 >= POOL_FLUSH_NS)
        pool_flush(L, W); /* slow process calls: the loop still hears promptly */
    return TR_OK;
}

tr_status tr_loop_pool_failed(tr_loop *L, uint32_t w, const tr_op *op) {
    if (w >= L->cfg.pool_size || op->task >= L->cfg.ntasks)
        return TR_EINVAL;
    worker *W = &L->workers[w];
    tr_status st = tr_sequencer_complete(L->tasks[op->task].seq, op->seq, TR_SEQ_FAILED);
    if (st != TR_OK)
        return st;
    W->stopped[op->task / L->cfg.pool_size] = 1;
    pool_note(L, W, CQ_DONE, op->task, op->seq);
    pool_flush(L, W);
    return TR_OK;
}

static void stop_workers(tr_loop *L) {
    if (!L->workers)
        return;
    atomic_store_explicit(&L->discard, 1, TR_RELEASE); /* read by workers after popping */
    for (uint32_t w = 0; w < L->cfg.pool_size; w++) {
        worker *W = &L->workers[w];
        if (!W->started)
            continue;
        tr_item sentinel = {0, 0};
        while (tr_queue_try_push_mpsc(W->q, sentinel) != TR_OK)
            tr_cpu_relax(); /* a slot is kept free */
    }
    for (uint32_t w = 0; w < L->cfg.pool_size; w++) {
        worker *W = &L->workers[w];
        if (W->started)
            pthread_join(W->thread, NULL);
        W->started = 0;
    }
}

static void wait_for_work(tr_loop *L) {
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if (!tr_queue_empty_sc(L->cq))
            return;
        tr_cpu_relax();
    }
    int64_t now = loop_now(L);
    int64_t timeout = TICK_NS;
    if (L->nheap) {
        int64_t d = L->heap[0].when - now;
        if (d < timeout)
            timeout = d;
    }
    if (L->nidle && L->phase == PH_RUNNING) {
        int64_t d = L->next_idle_poll - now;
        if (d < timeout)
            timeout = d;
    }
    if (L->phase == PH_DRAINING) {
        int64_t d = L->drain_deadline - now;
        if (d < timeout)
            timeout = d;
    }
    if (timeout <= 0)
        return;
    int tick_only = timeout == TICK_NS;
    uint64_t key = tr_notifier_prepare_wait(&L->notifier);
    /* seq_cst re-check (notifier protocol): a push, stop or error published
     * before our prepare_wait is seen here; one after it bumps the epoch */
    if (!tr_queue_empty_sc(L->cq) ||
        (L->phase == PH_RUNNING && atomic_load_explicit(&L->stop_requested, TR_SEQ_CST)) ||
        atomic_load_explicit(&L->error, TR_SEQ_CST) ||
        (L->cfg.clock_manual && loop_now(L) != now)) { /* moved before prepare_wait */
        tr_notifier_cancel_wait(&L->notifier);
        return;
    }
    if (L->cfg.clock_manual) { /* virtual deadlines pass only by tr_loop_clock_moved */
        timeout = TICK_NS;
        tick_only = 1;
    }
    /* seq_cst: tr_loop_idle reads it with the queue, after a push it must see as work */
    atomic_store_explicit(&L->parked, 1, TR_SEQ_CST);
    tr_status st = tr_notifier_commit_wait(&L->notifier, key, timeout);
    atomic_store_explicit(&L->parked, 0, TR_SEQ_CST);
    bump(&L->idle_wakeups);
    if (st == TR_ETIMEDOUT && tick_only)
        L->tick = 1;
}

tr_status tr_loop_run(tr_loop *L, const tr_loop_hooks *hooks) {
    if (!L || !hooks || !hooks->run_batch || L->ran)
        return TR_EINVAL;
    if (L->cfg.pool_size && !hooks->run_pool_batch)
        return TR_EINVAL;
    L->ran = 1;
    L->hooks = hooks;
    L->phase = PH_RUNNING;
    L->now = loop_now(L);
    for (uint32_t t = 0; t < L->cfg.ntasks; t++) {
        task *T = &L->tasks[t];
        for (uint32_t p = 0; p < T->nparts; p++)
            queue_refill(L, t, p);
        if (L->cfg.window_ns > 0 && (T->flags & TR_TASK_WINDOW))
            heap_push(L, L->now + L->cfg.window_ns, t, H_WINDOW, 0);
        if (L->cfg.commit_ns > 0)
            heap_push(L, L->now + L->cfg.commit_ns, t, H_COMMIT, 0);
        maybe_control(L, t); /* a task without partitions is at end of stream at once */
    }
    tr_status result = TR_OK;
    for (uint32_t w = 0; w < L->cfg.pool_size; w++) {
        if (pthread_create(&L->workers[w].thread, NULL, worker_main, &L->workers[w]) != 0) {
            result = TR_ESYS;
            finish(L, TR_STOP_ERROR);
            break;
        }
        L->workers[w].started = 1;
    }
    while (L->phase != PH_FINISHED) {
        /* a tick (an idle wake-up only for the binding's signal check) is not
         * an iteration unless it turns up work */
        int tick = L->tick;
        L->tick = 0;
        if (!tick)
            bump(&L->iterations);
        L->progress = 0;
        build(L);
        if (L->phase == PH_FINISHED)
            break;
        if (L->nbatch || tick) {
            uint64_t handed = L->handed;
            L->budget = BATCH_BUDGET;
            if (L->nbatch)
                bump(&L->batches);
            if (hooks->run_batch(hooks->ctx, L) != 0)
                finish(L, TR_STOP_ERROR);
            if (tick && L->handed == handed && !L->progress && L->phase != PH_FINISHED)
                wait_for_work(L);
            continue;
        }
        if (L->progress)
            continue;
        wait_for_work(L);
    }
    stop_workers(L);
    wm_flush(L);
    /* ops the workers handed back after the loop's last drain: their items
     * join the tails that tr_loop_drain_items gives back to the binding */
    drain_completions(L);
    if (L->internal != TR_OK && result == TR_OK)
        result = L->internal;
    return result;
}

int tr_loop_next_op(tr_loop *L, tr_op *out) {
    /* an error posted by an op of this batch stops it before the next op
     * (acquire: pairs with post_error's CAS); the rest is left for drain_items */
    if (TR_UNLIKELY(atomic_load_explicit(&L->error, TR_ACQUIRE) != 0) && L->phase != PH_FINISHED)
        finish(L, TR_STOP_ERROR);
    if (L->phase == PH_FINISHED)
        return 0;
    if (L->bpos == L->nbatch) {
        if (L->phase == PH_FINISHED || L->budget == 0)
            return 0;
        build(L);
        if (L->nbatch == 0)
            return 0;
    }
    tr_op *op = &L->batch[L->bpos++];
    *out = *op;
    L->handed++;
    L->chain = 0;
    if (op->kind == TR_OP_PROCESS) {
        L->tasks[op->task].queued--;
    } else if (op->kind == TR_OP_RUN) {
        out->count = fill_run(L, op->task, op->count);
        out->partition = L->run_parts[0];
        out->item = (uint64_t)(uintptr_t)L->run_items;
        L->budget = L->budget > op->count ? L->budget - op->count : 0;
    } else if (L->budget) {
        L->budget--;
    }
    return 1;
}

int tr_loop_next_of_task(tr_loop *L, uint32_t t, tr_op *out) {
    if (t >= L->cfg.ntasks || L->chain >= TR_RUN_MAX || L->budget == 0)
        return 0;
    /* acquire: pairs with post_error's CAS (as in next_op) */
    if (TR_UNLIKELY(atomic_load_explicit(&L->error, TR_ACQUIRE) != 0) || L->phase != PH_RUNNING)
        return 0;
    task *T = &L->tasks[t];
    if (T->flags & TR_TASK_POOL)
        return 0;
    if (T->in_dirty) {
        /* release what it completed (requests included) before deciding */
        release_task(L, t, 0);
    }
    /* its earlier messages still in the batch go first (rule 1) */
    if (T->queued || T->in_ctl || !runnable(L, T))
        return 0;
    dispatch_one(L, t, out);
    L->chain++;
    L->handed++;
    L->budget--;
    return 1;
}

/* Make room in P's ring for n more items (the caller checked the limit). */
static tr_status ring_room(part *P, uint64_t n) {
    uint64_t used = P->tail - P->head;
    if (used + n <= (uint64_t)P->mask + 1)
        return TR_OK;
    uint32_t size = pow2_at_least(used + n);
    uint64_t *items = malloc((size_t)size * sizeof *items);
    uint64_t *handles = malloc((size_t)size * sizeof *handles);
    if (!items || !handles) {
        free(items);
        free(handles);
        return TR_ENOMEM;
    }
    for (uint64_t pos = P->head; pos != P->tail; pos++) {
        items[pos & (size - 1)] = P->items[pos & P->mask];
        handles[pos & (size - 1)] = P->handles[pos & P->mask];
    }
    free(P->items);
    free(P->handles);
    P->items = items;
    P->handles = handles;
    P->mask = size - 1;
    return TR_OK;
}

tr_status tr_loop_push_input(tr_loop *L, uint32_t t, uint32_t p, uint64_t item, uint64_t handle) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return TR_EINVAL;
    task *T = &L->tasks[t];
    part *P = &T->parts[p];
    if (P->tail - P->head + P->lent >= P->limit)
        return TR_EAGAIN; /* (messages out on a worker still count: rule 6) */
    if (ring_room(P, 1) != TR_OK)
        return TR_ENOMEM;
    P->items[P->tail & P->mask] = item;
    P->handles[P->tail & P->mask] = handle;
    P->tail++;
    atomic_store_explicit(&P->read_count, P->tail, TR_RELAXED); /* metrics snapshot */
    T->buffered++;
    maybe_ready(L, t);
    return TR_OK;
}

tr_status tr_loop_push_inputs(tr_loop *L, uint32_t t, uint32_t p, const uint64_t *items,
                              const uint64_t *handles, size_t n) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return TR_EINVAL;
    task *T = &L->tasks[t];
    part *P = &T->parts[p];
    if (n > P->limit - (P->tail - P->head + P->lent))
        return TR_EAGAIN; /* (messages out on a worker still count: rule 6) */
    if (ring_room(P, n) != TR_OK)
        return TR_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        P->items[(P->tail + i) & P->mask] = items[i];
        P->handles[(P->tail + i) & P->mask] = handles[i];
    }
    P->tail += n;
    atomic_store_explicit(&P->read_count, P->tail, TR_RELAXED); /* metrics snapshot */
    T->buffered += n;
    if (n)
        maybe_ready(L, t);
    return TR_OK;
}

/* run_done and run_escape: pop the `consumed` items taken, release the first
 * `completed`; with `escape`, the last one taken is outstanding: it gets a
 * sequence number (*seq) like a PROCESS op. */
static tr_status finish_run(tr_loop *L, uint32_t t, uint32_t consumed, uint32_t completed,
                            uint32_t requests, int escape, uint64_t *seq) {
    if (t >= L->cfg.ntasks || !L->tasks[t].in_run || L->run_task != t)
        return TR_EINVAL;
    task *T = &L->tasks[t];
    if (completed > consumed || consumed - completed > 1 || consumed > L->run_count ||
        (escape && (consumed == 0 || completed != consumed - 1)))
        return TR_EINVAL;
    T->in_run = 0;
    if (escape) {
        /* the run was handed only with nothing outstanding: room for one */
        uint32_t p = L->run_parts[consumed - 1];
        part *P = &T->parts[p];
        uint64_t pos = P->head; /* of the escaping item, once the others are popped */
        if (T->nparts == 1) {
            pos = P->head + consumed - 1;
        } else {
            for (uint32_t i = 0; i + 1 < consumed; i++)
                if (L->run_parts[i] == p)
                    pos++;
        }
        uint64_t handle = P->handles[pos & P->mask];
        (void)tr_sequencer_acquire(T->seq, ((pos & POS_MAX) << PART_BITS) | p, handle, seq);
        T->acquired++;
        if (T->infl)
            arm_timeout(L, t, *seq, handle, p);
    }
    /* completed in order on this thread with nothing outstanding before them:
     * releasing them is advancing the watermarks past them */
    if (T->nparts == 1) {
        part *P = &T->parts[0];
        if (completed) {
            uint64_t pos = P->head + completed - 1;
            wm_note(L, t, 0, pos, P->handles[pos & P->mask]);
        }
        P->head += consumed;
        if (P->tail - P->head <= P->fill / 2)
            queue_refill(L, t, 0);
    } else {
        for (uint32_t i = 0; i < consumed; i++) {
            uint32_t p = L->run_parts[i];
            part *P = &T->parts[p];
            if (i < completed)
                wm_note(L, t, p, P->head, P->handles[P->head & P->mask]);
            P->head++;
            if (P->tail - P->head <= P->fill / 2)
                queue_refill(L, t, p);
        }
    }
    L->run_count = 0;
    T->buffered -= consumed;
    bump_n(&T->processed, consumed);
    bump_n(&T->completed, completed);
    bump_n(&L->chosen, consumed);
    if (consumed > completed && !escape)
        T->halted = 1; /* failed: nothing after it may complete (rule 18) */
    requests &= TR_REQ_MASK;
    if (requests && !T->halted) {
        /* rule 15: hold later releases until the commit has run */
        if (requests & (TR_REQ_COMMIT_CURRENT | TR_REQ_COMMIT_ALL))
            T->commit_hold = 1;
        apply_requests(L, t, requests);
    }
    maybe_ready(L, t);
    maybe_control(L, t);
    return TR_OK;
}

tr_status tr_loop_run_done(tr_loop *L, uint32_t t, uint32_t consumed, uint32_t completed,
                           uint32_t requests) {
    return finish_run(L, t, consumed, completed, requests, 0, NULL);
}

tr_status tr_loop_run_escape(tr_loop *L, uint32_t t, uint32_t consumed, uint64_t *seq) {
    return finish_run(L, t, consumed, consumed ? consumed - 1 : 0, 0, 1, seq);
}

void tr_loop_partition_state(tr_loop *L, uint32_t t, uint32_t p, int state) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return;
    task *T = &L->tasks[t];
    part *P = &T->parts[p];
    if (P->state == TR_PART_ENDED || P->state == state)
        return;
    if (P->state == TR_PART_IDLE)
        L->nidle--;
    P->state = (uint8_t)state;
    if (state == TR_PART_IDLE) {
        if (L->nidle++ == 0)
            L->next_idle_poll = loop_now(L) + L->cfg.max_idle_ns;
    } else if (state == TR_PART_ENDED) {
        T->nended++;
        maybe_control(L, t);
    } else {
        queue_refill(L, t, p);
    }
}

tr_status tr_loop_partition_fill(tr_loop *L, uint32_t t, uint32_t p, uint32_t fill) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return TR_EINVAL;
    part *P = &L->tasks[t].parts[p];
    P->fill = fill < 1 ? 1 : fill > P->limit ? P->limit : fill;
    /* the ring grows to the new fill on the next push (ring_room) */
    if (P->state == TR_PART_ACTIVE && P->tail - P->head + P->lent <= P->fill / 2)
        queue_refill(L, t, p);
    return TR_OK;
}

void tr_loop_control_done(tr_loop *L, uint32_t t, uint32_t requests) {
    if (t >= L->cfg.ntasks)
        return;
    task *T = &L->tasks[t];
    if (L->phase == PH_FINAL || L->phase == PH_FINISHED) {
        bump(&T->commits);
        return;
    }
    if (!T->in_control)
        return;
    T->in_control = 0;
    switch (T->control_kind) {
    case CTL_COMMIT:
        bump(&T->commits);
        T->commit_hold = 0;
        mark_dirty(L, t); /* release the held tail now (rule 15) */
        break;
    case CTL_WINDOW:
        bump(&T->windows);
        break;
    case CTL_TIMER:
        bump(&T->timers);
        break;
    case CTL_EOS:
        T->done = 1;
        /* relaxed: a metrics flag for other threads (tr_loop_task_stats), orders nothing */
        atomic_store_explicit(&T->done_pub, 1, TR_RELAXED);
        L->done_count++;
        if (!T->voted)
            L->settled_count++;
        break;
    default:
        break;
    }
    T->control_kind = CTL_NONE;
    if (requests)
        apply_requests(L, t, requests & TR_REQ_MASK);
    if (T->done)
        settle_check(L);
    maybe_ready(L, t);
    maybe_control(L, t);
}

/* Any thread: resolve seq in the task's sequencer, then hand the completion to
 * the loop through the completion queue (the push notifies a parked loop). */
static tr_status complete_remote(tr_loop *L, uint32_t t, uint64_t seq, uint32_t flags) {
    if (t >= L->cfg.ntasks)
        return TR_EINVAL;
    tr_status st = tr_sequencer_complete(L->tasks[t].seq, seq, flags);
    if (st != TR_OK)
        return st;
    tr_item it = {((uint64_t)CQ_DONE << CQ_KIND_SHIFT) | t, seq};
    /* capacity covers every outstanding seq, so this only spins if the bound
     * analysis in tr_loop_create were wrong */
    while (tr_queue_try_push_mpsc(L->cq, it) != TR_OK)
        tr_cpu_relax();
    return TR_OK;
}

tr_status tr_loop_complete(tr_loop *L, uint32_t t, uint64_t seq, uint32_t requests) {
    return complete_remote(L, t, seq, seq_flags(requests));
}

tr_status tr_loop_complete_local(tr_loop *L, uint32_t t, uint64_t seq, uint32_t requests) {
    if (t >= L->cfg.ntasks)
        return TR_EINVAL;
    task *T = &L->tasks[t];
    tr_status st = tr_sequencer_complete(T->seq, seq, seq_flags(requests));
    if (st != TR_OK)
        return st;
    T->completions++;
    if (T->infl)
        T->infl[seq & T->infl_mask].done = 1;
    mark_dirty(L, t);
    return TR_OK;
}

tr_status tr_loop_fail(tr_loop *L, uint32_t t, uint64_t seq) {
    return complete_remote(L, t, seq, TR_SEQ_FAILED);
}

tr_status tr_loop_post_error(tr_loop *L, uint64_t error) {
    uint64_t none = 0;
    if (error == 0)
        return TR_EINVAL;
    /* release: the error object's contents happen-before the loop's acquire load */
    if (!atomic_compare_exchange_strong_explicit(&L->error, &none, error, TR_ACQ_REL, TR_ACQUIRE))
        return TR_EALREADY;
    tr_notifier_notify(&L->notifier);
    return TR_OK;
}

uint64_t tr_loop_take_error(tr_loop *L) {
    return atomic_exchange_explicit(&L->error, 0, TR_ACQ_REL);
}

void tr_loop_wake_partition(tr_loop *L, uint32_t t, uint32_t p) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return;
    part *P = &L->tasks[t].parts[p];
    /* acq_rel: pairs with the loop's exchange in drain_completions */
    if (atomic_exchange_explicit(&P->woken, 1, TR_ACQ_REL))
        return;
    tr_item it = {((uint64_t)CQ_WAKE << CQ_KIND_SHIFT) | t, p};
    while (tr_queue_try_push_mpsc(L->cq, it) != TR_OK)
        tr_cpu_relax();
}

void tr_loop_set_user_timer(tr_loop *L, uint32_t t, int64_t when_ns) {
    if (t >= L->cfg.ntasks)
        return;
    task *T = &L->tasks[t];
    /* release: the loop's acquire load of timer_when after its exchange */
    atomic_store_explicit(&T->timer_when, when_ns, TR_RELEASE);
    if (atomic_exchange_explicit(&T->timer_pending, 1, TR_ACQ_REL))
        return;
    tr_item it = {((uint64_t)CQ_TIMER << CQ_KIND_SHIFT) | t, 0};
    while (tr_queue_try_push_mpsc(L->cq, it) != TR_OK)
        tr_cpu_relax();
}

void tr_loop_stop(tr_loop *L) {
    /* release: pairs with build()'s acquire load; seq_cst for the notifier's re-check */
    atomic_store_explicit(&L->stop_requested, 1, TR_SEQ_CST);
    atomic_store_explicit(&L->parked, 0, TR_SEQ_CST); /* busy until it parks again (tr_loop_idle) */
    tr_notifier_notify(&L->notifier);
}

void tr_loop_clock_moved(tr_loop *L) {
    /* seq_cst: a tr_loop_idle after this call sees the loop busy until it parks again */
    atomic_store_explicit(&L->parked, 0, TR_SEQ_CST);
    tr_notifier_notify(&L->notifier);
}

int tr_loop_idle(tr_loop *L) {
    /* seq_cst: pairs with the stores around wait_for_work's sleep; a claimed ticket counts */
    return atomic_load_explicit(&L->parked, TR_SEQ_CST) && tr_queue_size_approx(L->cq) == 0 &&
           !atomic_load_explicit(&L->error, TR_SEQ_CST);
}

tr_status tr_loop_watermark(tr_loop *L, uint32_t t, uint32_t p, tr_mark *out) {
    if (t >= L->cfg.ntasks)
        return TR_EINVAL;
    return tr_watermark_get(L->tasks[t].wm, p, out);
}

tr_status tr_loop_mark_committed(tr_loop *L, uint32_t t, uint32_t p, tr_mark mark) {
    if (t >= L->cfg.ntasks)
        return TR_EINVAL;
    return tr_watermark_mark_committed(L->tasks[t].wm, p, mark);
}

tr_status tr_loop_committed(const tr_loop *L, uint32_t t, uint32_t p, tr_mark *out) {
    if (t >= L->cfg.ntasks)
        return TR_EINVAL;
    return tr_watermark_committed(L->tasks[t].wm, p, out);
}

uint64_t tr_loop_read_count(const tr_loop *L, uint32_t t, uint32_t p) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return 0;
    return atomic_load_explicit(&L->tasks[t].parts[p].read_count, TR_RELAXED);
}

void tr_loop_task_stats(const tr_loop *L, uint32_t t, tr_task_stats *out) {
    memset(out, 0, sizeof *out);
    if (t >= L->cfg.ntasks)
        return;
    const task *T = &L->tasks[t];
    out->processed = atomic_load_explicit(&T->processed, TR_RELAXED);
    out->completed = atomic_load_explicit(&T->completed, TR_RELAXED);
    out->outstanding = out->processed >= out->completed ? out->processed - out->completed : 0;
    out->windows = atomic_load_explicit(&T->windows, TR_RELAXED);
    out->commits = atomic_load_explicit(&T->commits, TR_RELAXED);
    out->timers = atomic_load_explicit(&T->timers, TR_RELAXED);
    out->done = atomic_load_explicit(&T->done_pub, TR_RELAXED);
}

void tr_loop_get_stats(const tr_loop *L, tr_loop_stats *out) {
    out->envelopes_chosen = atomic_load_explicit(&L->chosen, TR_RELAXED);
    out->idle_wakeups = atomic_load_explicit(&L->idle_wakeups, TR_RELAXED);
    out->loop_iterations = atomic_load_explicit(&L->iterations, TR_RELAXED);
    out->batches = atomic_load_explicit(&L->batches, TR_RELAXED);
}

tr_stop_reason tr_loop_stop_reason(const tr_loop *L) {
    return (tr_stop_reason)atomic_load_explicit(&L->reason, TR_RELAXED);
}

void tr_loop_timeout_info(const tr_loop *L, uint32_t *t, uint32_t *p, uint64_t *seq,
                          uint64_t *handle) {
    *t = L->to_task;
    *p = L->to_part;
    *seq = L->to_seq;
    *handle = L->to_handle;
}

size_t tr_loop_drain_items(tr_loop *L, uint64_t *out, size_t max) {
    size_t n = 0;
    while (n < max && L->bpos < L->nbatch) {
        tr_op *op = &L->batch[L->bpos++];
        if (op->kind == TR_OP_PROCESS)
            out[n++] = op->item;
    }
    for (uint32_t t = 0; n < max && t < L->cfg.ntasks; t++) {
        task *T = &L->tasks[t];
        while (n < max && T->redo_count) {
            out[n++] = T->pitem[T->redo_from & T->pmask];
            T->redo_from++;
            T->redo_count--;
        }
    }
    while (n < max && L->drain_task < L->cfg.ntasks) {
        task *T = &L->tasks[L->drain_task];
        if (L->drain_part >= T->nparts) {
            L->drain_task++;
            L->drain_part = 0;
            continue;
        }
        part *P = &T->parts[L->drain_part];
        if (P->head == P->tail) {
            L->drain_part++;
            continue;
        }
        out[n++] = P->items[P->head & P->mask];
        P->head++;
        T->buffered--;
    }
    return n;
}
