/* loop_timers.c: the timer heap (windows, commits, user timers, callback
 * timeouts; lazy deletion) and what fires when an entry is due. Loop thread.
 *
 * Layer 2 (see loop_internal.h): calls loop_state.c only. A timer that falls
 * due marks its task's barrier due there (trl_maybe_control), a callback
 * timeout finishes the loop (trl_finish); loop_schedule.c acts on both. */
#include "loop_internal.h"

/* ------------------------------------------------------------------ heap */

/* Heap order: by time, and at one time by task (entries due together fire task by
 * task, as the reference engine takes them; a tie of callback timeouts names the
 * first task's). */
static inline int hbefore(const hent *a, const hent *b) {
    return a->when < b->when || (a->when == b->when && a->task < b->task);
}

int trl_heap_push(tr_loop *L, int64_t when, uint32_t t, uint32_t kind, uint32_t gen) {
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
        if (!hbefore(&e, &L->heap[up]))
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
        if (c + 1 < n && hbefore(&L->heap[c + 1], &L->heap[c]))
            c++;
        if (!hbefore(&L->heap[c], &e))
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
void trl_heap_compact(tr_loop *L) {
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

static void check_timeout(tr_loop *L, uint32_t t, int64_t when) {
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
    /* an entry armed for a callback completed since (its deadline `when` is
     * earlier): the heap orders the real deadline first, so of the callbacks
     * past theirs the earliest deadline times out, at one deadline the first
     * task's (rule 16; as the reference engine) */
    if (deadline <= L->now && deadline <= when) {
        L->to_task = t;
        L->to_part = f->part;
        L->to_seq = s;
        L->to_handle = f->handle;
        trl_finish(L, TR_STOP_TIMEOUT);
        return;
    }
    trl_heap_push(L, deadline, t, H_CBTIMEOUT, 0);
}

static int64_t rearm(int64_t when, int64_t period, int64_t now) {
    int64_t next = when + period;
    return next <= now ? now + period : next;
}

/* A pool task: did its worker start any of its ops since its last barrier fell
 * due? (relaxed: a count the worker alone writes; a stale read only decides
 * whether this barrier waits for the ops queued or has them handed back) */
static int pool_served_since_barrier(task *T) {
    uint64_t invoked = atomic_load_explicit(&T->invoked, TR_RELAXED);
    int served = invoked != T->invoked_at_barrier;
    T->invoked_at_barrier = invoked;
    return served;
}

void trl_fire_timers(tr_loop *L) {
    while (L->nheap && L->heap[0].when <= L->now && L->phase != PH_FINISHED) {
        hent e = heap_pop(L);
        task *T = &L->tasks[e.task];
        if (e.kind == H_CBTIMEOUT) {
            check_timeout(L, e.task, e.when);
            continue;
        }
        if (L->phase != PH_RUNNING || (T->done && e.kind != H_COMMIT))
            continue; /* a done task keeps its commit period (control_kind) */
        /* a pool task's worker hands its queued ops back (a plain tail in seq
         * order: key_pick takes a pool task's messages in offset order), so the
         * barrier runs at once; but not when its worker started none of them
         * since its last barrier: ops handed back go behind the other tasks'
         * on the worker, and a task whose turn never came before its next
         * barrier would never run (rule 5); its queued ops then run first */
        if ((T->flags & TR_TASK_POOL) && (e.kind != H_COMMIT || !L->cfg.async_commit) &&
            (e.kind != H_USER || e.gen == T->timer_gen) && pool_served_since_barrier(T))
            atomic_store_explicit(&T->hold, 1, TR_RELAXED); /* see task.hold */
        if (e.kind == H_WINDOW && T->window_overran) {
            /* the window before ran past this one's time: this one comes a period
             * from now, and the task's messages run in between (without this a
             * window longer than its period ran back to back, and the task
             * processed a message in hundreds of windows) */
            T->window_overran = 0;
            T->window_next = L->now + L->cfg.window_ns;
            trl_heap_push(L, T->window_next, e.task, H_WINDOW, 0);
            continue;
        }
        if (e.kind == H_WINDOW) {
            if (!T->window_due)
                T->window_due_at = e.when;
            T->window_due = 1; /* coalesces: one pending window at a time */
            T->window_next = rearm(e.when, L->cfg.window_ns, L->now);
            trl_heap_push(L, T->window_next, e.task, H_WINDOW, 0);
        } else if (e.kind == H_COMMIT) {
            T->commit_due = 1;
            trl_heap_push(L, rearm(e.when, L->cfg.commit_ns, L->now), e.task, H_COMMIT, 0);
        } else if (e.kind == H_USER) {
            if (e.gen != T->timer_gen)
                continue;
            if (!T->timer_due || e.when < T->timer_due_at)
                T->timer_due_at = e.when;
            T->timer_due = 1;
        }
        trl_maybe_control(L, e.task);
    }
}

/* The task's watermark reaches its earliest event-time timer: its timer barrier falls
 * due (rule 38; windows close there, rule 35). After a CQ_ETIMER, an empty poll, an end
 * of stream: whatever may have moved the watermark. */
void trl_et_check(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    /* acquire: pairs with tr_loop_set_event_timer's release store */
    int64_t at = atomic_load_explicit(&T->et_timer_at, TR_ACQUIRE);
    T->et_stale = 0; /* recomputed below, whatever the branch */
    if (at == INT64_MAX) {
        if (tr_event_time_tracking(T->et)) /* what a pool worker handed over, for readers */
            tr_event_time_update(T->et, trl_now(L));
        return;
    }
    if (tr_event_time_update(T->et, trl_now(L)) < at || T->done || L->phase != PH_RUNNING)
        return;
    if (!T->timer_due || L->now < T->timer_due_at)
        T->timer_due_at = L->now;
    T->timer_due = 1; /* its timer barrier runs the event-time timers due (rule 38) */
    trl_maybe_control(L, t);
}

/* A callback's timeout counts from its invocation (rule 16), not from the
 * build that chose it: the ops before it in the batch may take their time. */
void tr_loop_invoked_at(tr_loop *L, uint32_t t, uint64_t seq, int64_t ns) {
    if (t >= L->cfg.ntasks || !L->tasks[t].infl)
        return;
    L->tasks[t].infl[seq & L->tasks[t].infl_mask].t0 = ns;
}

void trl_arm_timeout(tr_loop *L, uint32_t t, uint64_t seq, uint64_t handle, uint32_t p) {
    task *T = &L->tasks[t];
    inflight *f = &T->infl[seq & T->infl_mask];
    f->t0 = L->now;
    f->handle = handle;
    f->part = p;
    f->done = 0;
    if (!T->timeout_armed) {
        T->timeout_armed = 1;
        trl_heap_push(L, L->now + L->cfg.callback_timeout_ns, t, H_CBTIMEOUT, 0);
    }
}
