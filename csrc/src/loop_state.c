/* loop_state.c: the scheduling state every other file of the loop updates:
 * the worklists the scheduler reads (ready, carry, ctl, dirty, refill; see
 * loop_internal.h), the loop's phase (drain, finish), coordinator requests
 * (rules 9, 11, 14, 19) and a pool task's hold (rules 8, 9, 23). Loop thread.
 *
 * Layer 1 (see loop_internal.h): calls no other loop file. The files above
 * note here what a completion, an input or a timer made ready or due, and the
 * next build acts on it (loop_schedule.c). */
#include "loop_internal.h"

void trl_maybe_ready(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    if (T->in_ready || !runnable(L, T))
        return;
    T->in_ready = 1;
    L->ready[(L->ready_head + L->ready_count) % L->cfg.ntasks] = t;
    L->ready_count++;
}

/* T keeps its turn: the next batch serves it before the ready ring (rule 5). For a
 * RUN op cut by a barrier or a stop (tr_loop_run_yield), before its first message
 * (carry_run) or after some (finish_run, which leaves the rest of the turn in
 * run_left, so that a turn is TR_RUN_MAX messages however often it is cut): with
 * runs cut at every commit, the task served last before the barrier would
 * otherwise be served first after it, every time, and get the longer share. */
void trl_carry(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    T->in_ready = 1; /* not in the ready ring while carried */
    L->carry[(L->carry_head + L->carry_count) % L->cfg.ntasks] = t;
    L->carry_count++;
}

void trl_maybe_control(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    if (T->in_ctl || control_kind(L, T) == CTL_NONE)
        return;
    T->in_ctl = 1;
    L->ctl[L->nctl++] = t;
}

void trl_mark_dirty(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    if (T->in_dirty)
        return;
    T->in_dirty = 1;
    L->dirty[L->ndirty++] = t;
}

void trl_queue_refill(tr_loop *L, uint32_t t, uint32_t p) {
    part *P = &L->tasks[t].parts[p];
    if (P->refill_queued || P->state != TR_PART_ACTIVE)
        return;
    P->refill_queued = 1;
    L->refill[(L->refill_head + L->refill_count) % L->refill_cap] = ((uint64_t)t << 32) | p;
    L->refill_count++;
}

/* Every idle partition is polled again (their wake-ups may be lost or late). */
void trl_repoll_idle(tr_loop *L) {
    for (uint32_t t = 0; t < L->cfg.ntasks; t++) {
        task *T = &L->tasks[t];
        for (uint32_t p = 0; p < T->nparts; p++) {
            if (T->parts[p].state == TR_PART_IDLE) {
                T->parts[p].state = TR_PART_ACTIVE;
                trl_queue_refill(L, t, p);
            }
        }
    }
    L->nidle = 0;
}

/* T's last partition just ended. Partitions that went idle before may have
 * ended meanwhile too, their wake-ups still on their way (a source that ends
 * every partition at once wakes them one by one): they are polled again at
 * once, and T's end of stream waits for the build after that poll, so the ends
 * of stream that fall due together run together, whatever the order the
 * wake-ups arrived in (rule 11; a shutdown ALL asked by one of them then ends
 * the run after all of them, as in the reference engine). */
void trl_eos_gate(tr_loop *L, uint32_t t) {
    if (!L->nidle || L->phase != PH_RUNNING)
        return;
    trl_repoll_idle(L);
    task *T = &L->tasks[t];
    if (!T->eos_not_before)
        L->eos_waiting++;
    /* this batch's refill results are in by the end of the next one: the
     * build after it decides */
    T->eos_not_before = L->builds + 2;
}

static inline int failed_reason(uint32_t r) {
    return r == TR_STOP_ERROR || r == TR_STOP_TIMEOUT;
}

void trl_finish(tr_loop *L, tr_stop_reason reason) {
    /* the first reason wins, except that a failure ends a graceful drain as a
     * failure (a callback timing out while a stop waits for it: rule 16).
     * relaxed: read by stats and by the owner after run returns (join orders it) */
    uint32_t seen = atomic_load_explicit(&L->reason, TR_RELAXED);
    while (seen == TR_STOP_NONE || (failed_reason((uint32_t)reason) && !failed_reason(seen))) {
        if (atomic_compare_exchange_weak_explicit(&L->reason, &seen, (uint32_t)reason, TR_RELAXED,
                                                  TR_RELAXED))
            break;
    }
    L->phase = PH_FINISHED;
}

void trl_begin_drain(tr_loop *L, tr_stop_reason reason) {
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
        trl_maybe_control(L, t);
}

/* Every task done: the run ended at end of stream (rule 11). Every task voted or
 * done: it stops as a shutdown (rule 14), decided at once, or (`after_batch`: a
 * task's end of stream completed the vote) by build_batch after the other
 * end-of-stream hooks of this batch, which may leave every task done (as the
 * reference engine, which decides after the hooks that fell due together). */
void trl_settle_check(tr_loop *L, int after_batch) {
    if (L->done_count == L->cfg.ntasks) {
        trl_begin_drain(L, TR_STOP_END_OF_STREAM);
    } else if (L->settled_count == L->cfg.ntasks) {
        if (after_batch) {
            L->eos_shutdown = 1;
            L->progress = 1; /* build again at once */
        } else {
            trl_begin_drain(L, TR_STOP_SHUTDOWN);
        }
    }
}

void trl_apply_requests(tr_loop *L, uint32_t t, uint32_t req) {
    task *T = &L->tasks[t];
    if (req & TR_REQ_COMMIT_ALL) {
        for (uint32_t u = 0; u < L->cfg.ntasks; u++) {
            L->tasks[u].commit_req = 1;
            trl_maybe_control(L, u);
        }
    } else if (req & TR_REQ_COMMIT_CURRENT) {
        T->commit_req = 1;
        trl_maybe_control(L, t);
    }
    if ((req & TR_REQ_SHUTDOWN_CURRENT) && !T->voted) {
        T->voted = 1;
        if (!T->done)
            L->settled_count++;
        trl_settle_check(L, 0);
    }
    if (req & TR_REQ_SHUTDOWN_ALL)
        trl_begin_drain(L, TR_STOP_SHUTDOWN);
}

/* Loop thread: re-open a pool task to its worker once nothing of rules 8, 9, 23
 * is due or running for it (see task.hold). seq_cst clear, then re-read
 * timer_pending: a due timer set on the worker meanwhile
 * (tr_loop_set_user_timer sets pending, then hold) keeps the task held until
 * the loop has read it. */
void trl_pool_unhold(tr_loop *L, task *T) {
    if (!(T->flags & TR_TASK_POOL) || T->window_due || T->timer_due || T->in_control ||
        (!L->cfg.async_commit && T->commit_due))
        return;
    atomic_store_explicit(&T->hold, 0, TR_SEQ_CST);
    if (atomic_load_explicit(&T->timer_pending, TR_SEQ_CST))
        atomic_store_explicit(&T->hold, 1, TR_SEQ_CST);
}
