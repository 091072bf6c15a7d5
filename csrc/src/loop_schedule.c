/* loop_schedule.c: the one place that decides what runs next (rules 1-11,
 * 14, 19, 23): ready tasks, control ops, runs, pool hand-outs, graceful stop,
 * the run loop and its parking. Loop thread.
 *
 * Layer 5, the top (see loop_internal.h): may call every other loop file; none
 * calls it. Each build drains completions (loop_release.c), fires timers
 * (loop_timers.c), then reads the worklists loop_state.c keeps. */
#include "loop_internal.h"

static int cmp_task(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void op_set(tr_op *op, uint32_t kind, uint32_t t, uint32_t p, uint32_t flags, uint64_t seq,
                   uint64_t item, uint64_t handle) {
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

static void emit(tr_loop *L, uint32_t kind, uint32_t t, uint32_t p, uint32_t flags, uint64_t seq,
                 uint64_t item, uint64_t handle) {
    op_set(&L->batch[L->nbatch++], kind, t, p, flags, seq, item, handle);
}

/* A TR_TASK_INLINE task with nothing outstanding or held: hand it a run of up
 * to TR_RUN_MAX of its buffered messages (fill_run picks them when the op is
 * handed out). The items stay in the rings until tr_loop_run_done pops the
 * ones the binding took. */
static void dispatch_run(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    T->in_run = 1;
    emit(L, TR_OP_RUN, t, 0, 0, 0, 0, 0);
    uint32_t quota = run_quota(T);
    L->batch[L->nbatch - 1].count = T->buffered < quota ? (uint32_t)T->buffered : quota;
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

/* A loop-thread task's next message, taken now, as a PROCESS op in `dst`. */
static int dispatch_one(tr_loop *L, uint32_t t, tr_op *dst) {
    uint32_t p;
    uint64_t item, handle;
    uint64_t seq = trl_take_one(L, t, &p, &item, &handle);
    if (seq == TR_NO_SEQ)
        return 0;
    op_set(dst, TR_OP_PROCESS, t, p, 0, seq, item, handle);
    return 1;
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
        trl_release_task(L, t, 1);
    L->phase = PH_FINAL;
    L->final_cursor = 0;
}

/* Dispatch to a runnable task taken off the ready or carry ring. */
static void dispatch_ready(tr_loop *L, uint32_t t, uint32_t *pool_budget) {
    task *T = &L->tasks[t];
    /* a keyed task too once nothing is outstanding and nothing was taken
     * ahead: its ring from head is then plain offset order, every key free,
     * and a run completes each message before the next (rule 30) */
    if ((T->flags & TR_TASK_INLINE) && !T->commit_hold && tr_sequencer_outstanding(T->seq) == 0 &&
        T->kahead == 0) {
        dispatch_run(L, t); /* back in the ready ring after run_done */
        return;
    }
    if (T->flags & TR_TASK_POOL) {
        uint32_t budget = *pool_budget;
        uint32_t taken = trl_dispatch_pool(L, t, budget < POOL_TURN ? budget : POOL_TURN);
        *pool_budget = taken < budget ? budget - taken : 0;
    } else {
        /* taken when handed out (OPF_LAZY); runnable() counts it from now */
        emit(L, TR_OP_PROCESS, t, 0, OPF_LAZY, 0, 0, 0);
        T->queued++;
    }
    trl_maybe_ready(L, t);
}

/* A RUN op about to be handed out while a barrier or a stop is due already: it
 * would end before its first message. */
static void carry_run(tr_loop *L, uint32_t t) {
    L->tasks[t].in_run = 0;
    trl_carry(L, t);
    trl_maybe_control(L, t);
}

/* Fill the batch: the one place that decides what runs next. */
static void build_batch(tr_loop *L) {
    if (L->phase == PH_FINISHED)
        return;
    L->nbatch = L->bpos = 0;
    L->builds++;
    if (TR_UNLIKELY(L->eos_waiting)) { /* see trl_eos_gate */
        for (uint32_t t = 0; t < L->cfg.ntasks; t++) {
            task *T = &L->tasks[t];
            if (T->eos_not_before && L->builds >= T->eos_not_before) {
                T->eos_not_before = 0;
                L->eos_waiting--;
                trl_maybe_control(L, t);
            }
        }
        if (L->eos_waiting)
            L->progress = 1; /* build again, batch or not */
    }
    if (atomic_load_explicit(&L->error, TR_ACQUIRE)) { /* pairs with post_error's CAS */
        trl_finish(L, TR_STOP_ERROR);
        return;
    }
    /* acquire: pairs with cq_push's release CAS */
    uint32_t broken = atomic_load_explicit(&L->broken, TR_ACQUIRE);
    if (broken && L->internal == TR_OK)
        L->internal = (tr_status)broken;
    if (L->internal != TR_OK) {
        trl_finish(L, TR_STOP_ERROR);
        return;
    }
    L->now = trl_now(L);
    /* relaxed: see loop.timer_min_new; taken before the drain, so a timer set
     * after it is still in timer_min_new for the runs of this batch */
    int64_t new_timer = atomic_exchange_explicit(&L->timer_min_new, INT64_MAX, TR_RELAXED);
    trl_drain_completions(L);
    trl_process_dirty(L);
    trl_fire_timers(L);
    if (L->phase == PH_FINISHED)
        return;
    int64_t until = L->nheap ? L->heap[0].when : INT64_MAX;
    /* new_timer: set after the drain above read its CQ_TIMER item */
    set_run_until(L, new_timer < until ? new_timer : until);
    /* acquire: pairs with tr_loop_stop's release store */
    if (L->eos_shutdown) {
        L->eos_shutdown = 0;
        trl_begin_drain(L,
                        L->done_count == L->cfg.ntasks ? TR_STOP_END_OF_STREAM : TR_STOP_SHUTDOWN);
    }
    if (L->phase == PH_RUNNING && atomic_load_explicit(&L->stop_requested, TR_ACQUIRE))
        trl_begin_drain(L, TR_STOP_EXTERNAL);
    if (L->phase == PH_RUNNING && L->nidle && L->now >= L->next_idle_poll)
        trl_repoll_idle(L);
    if (L->phase == PH_DRAINING && L->nctl == 0 && (drained(L) || L->now >= L->drain_deadline))
        start_final(L);
    if (L->phase == PH_FINAL) {
        if (L->final_cursor == L->cfg.ntasks) {
            trl_finish(L, TR_STOP_NONE);
            return;
        }
        while (L->final_cursor < L->cfg.ntasks && L->nbatch < BATCH_MAX)
            emit(L, TR_OP_COMMIT, L->final_cursor++, 0, TR_OPF_FINAL, 0, 0, 0);
        return;
    }

    /* control work first (rules 8, 9, 11, 23), in task order as the reference
     * engine runs it: windows, timers and end-of-stream hooks that fall due
     * together run for task 0 before task 1 (a test comparing the engines' outputs
     * sees one order) */
    if (L->nctl > 1)
        qsort(L->ctl, L->nctl, sizeof *L->ctl, cmp_task);
    uint32_t taken = 0;
    while (taken < L->nctl && L->nbatch < BATCH_MAX) {
        uint32_t t = L->ctl[taken++];
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
        /* a timer op with a window due too runs the timers due before it only */
        emit(L, (uint32_t)k, t, 0, 0, 0, 0,
             (uint64_t)(k == CTL_TIMER && T->window_due ? T->window_due_at : INT64_MAX));
        /* a window or timers, then nothing more of this kind in this batch: task
         * by task, the rest of what is due for this task (its window after its
         * timers, a timer its window set for now) runs before the next task's,
         * and a stop they ask for is seen before another task's hooks (as the
         * reference engine runs them) */
        if (k == CTL_WINDOW || k == CTL_TIMER)
            break;
    }
    if (taken) { /* the rest (the batch was full) keeps its order */
        L->nctl -= taken;
        memmove(L->ctl, L->ctl + taken, L->nctl * sizeof *L->ctl);
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
        uint64_t count = part_used(P, L->tasks[t].keyed);
        if (P->state == TR_PART_ACTIVE && count < P->fill)
            emit(L, TR_OP_REFILL, t, p, 0, 0, 0, P->fill - count);
    }

    /* normal work, round robin (rules 4, 5): first the tasks whose last run was
     * cut before its first message, in the order they were cut (a task not
     * runnable yet only because its barrier is due or running keeps its place),
     * then the ready ring */
    uint32_t pool_budget = 16 * BATCH_MAX;
    for (uint32_t n = L->carry_count; n && L->nbatch < BATCH_MAX; n--) {
        uint32_t t = L->carry[L->carry_head];
        L->carry_head = (L->carry_head + 1) % L->cfg.ntasks;
        L->carry_count--;
        task *T = &L->tasks[t];
        if (!runnable(L, T)) {
            if (!T->done && !T->halted &&
                (T->in_control || T->in_ctl || commit_pending(T) || T->window_due ||
                 T->timer_due)) {
                L->carry[(L->carry_head + L->carry_count) % L->cfg.ntasks] = t;
                L->carry_count++;
            } else {
                T->in_ready = 0;
                trl_maybe_ready(L, t);
            }
            continue;
        }
        T->in_ready = 0;
        dispatch_ready(L, t, &pool_budget);
    }
    while (L->ready_count && L->nbatch < BATCH_MAX && pool_budget) {
        uint32_t t = L->ready[L->ready_head];
        L->ready_head = (L->ready_head + 1) % L->cfg.ntasks;
        L->ready_count--;
        task *T = &L->tasks[t];
        T->in_ready = 0;
        if (!runnable(L, T))
            continue;
        dispatch_ready(L, t, &pool_budget);
    }
}

/* Every op of a batch sees the watermarks of everything released before it
 * was built: a control op of a task is built only when nothing of that task
 * runs in between (rules 9, 15); other threads read at most a batch behind. */
static void build(tr_loop *L) {
    build_batch(L);
    trl_wm_flush(L);
}

static void wait_for_work(tr_loop *L) {
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if (!tr_queue_empty_sc(L->cq))
            return;
        tr_cpu_relax();
    }
    int64_t now = trl_now(L);
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
        /* a stop is news only while running: draining, the flag stays set (no busy spin) */
        (L->phase == PH_RUNNING && atomic_load_explicit(&L->stop_requested, TR_SEQ_CST)) ||
        atomic_load_explicit(&L->error, TR_SEQ_CST) ||
        atomic_load_explicit(&L->broken, TR_SEQ_CST) ||
        (L->cfg.clock_manual && trl_now(L) != now)) { /* moved before prepare_wait */
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
    trl_thread_loop = L; /* tr_loop_event_watermark: this thread may recompute */
    L->hooks_copy = *hooks;
    L->hooks = &L->hooks_copy;
    L->phase = PH_RUNNING;
    L->now = trl_now(L);
    for (uint32_t t = 0; t < L->cfg.ntasks; t++) {
        task *T = &L->tasks[t];
        for (uint32_t p = 0; p < T->nparts; p++)
            trl_queue_refill(L, t, p);
        if (L->cfg.window_ns > 0 && (T->flags & TR_TASK_WINDOW))
            trl_heap_push(L, L->now + L->cfg.window_ns, t, H_WINDOW, 0);
        if (L->cfg.commit_ns > 0)
            trl_heap_push(L, L->now + L->cfg.commit_ns, t, H_COMMIT, 0);
        trl_maybe_control(L, t); /* a task without partitions is at end of stream at once */
    }
    tr_status result = trl_start_workers(L);
    if (result != TR_OK)
        trl_finish(L, TR_STOP_ERROR);
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
                trl_finish(L, TR_STOP_ERROR);
            if (tick && L->handed == handed && !L->progress && L->phase != PH_FINISHED)
                wait_for_work(L);
            continue;
        }
        if (L->progress)
            continue;
        wait_for_work(L);
    }
    trl_stop_workers(L);
    trl_wm_flush(L);
    /* ops the workers handed back after the loop's last drain: their items
     * join the tails that tr_loop_drain_items gives back to the binding */
    trl_drain_completions(L);
    for (uint32_t t = 0; t < L->cfg.ntasks; t++)
        trl_et_sync(L, &L->tasks[t]); /* a run the stop cut short: its readers come after */
    trl_thread_loop = NULL;
    if (L->internal != TR_OK && result == TR_OK)
        result = L->internal;
    return result;
}

/* A lazy PROCESS op of T is skipped: a stop or an error came, or a timer of T
 * itself is due, set since the build (by the message before it, usually: its
 * timer_due is set only when the next build fires it). Barriers of other tasks,
 * and T's window and commit periods, are the next build's business, as for ops
 * taken when built: a period shorter than what runs between two builds must not
 * keep every message from running. */
static inline int lazy_held(tr_loop *L, const task *T) {
    /* relaxed: hints; build_batch and next_op act on the stop and the error */
    if (atomic_load_explicit(&L->stop_requested, TR_RELAXED) ||
        atomic_load_explicit(&L->error, TR_RELAXED) || L->phase != PH_RUNNING)
        return 1;
    /* relaxed: on this thread when the task's own code set it; from another
     * thread a hint that the next build reads through its CQ_TIMER item */
    int64_t when = atomic_load_explicit(&T->timer_when, TR_RELAXED);
    return when != INT64_MAX && when <= trl_now(L);
}

int tr_loop_next_op(tr_loop *L, tr_op *out) {
    /* an error posted by an op of this batch stops it before the next op
     * (acquire: pairs with post_error's CAS); the rest is left for drain_items */
    if (TR_UNLIKELY(atomic_load_explicit(&L->error, TR_ACQUIRE) != 0) && L->phase != PH_FINISHED)
        trl_finish(L, TR_STOP_ERROR);
    if (L->phase == PH_FINISHED)
        return 0;
    tr_op *op;
    for (;;) {
        if (L->bpos == L->nbatch) {
            if (L->phase == PH_FINISHED || L->budget == 0)
                return 0;
            bump(&L->iterations); /* a scheduling pass inside a batch is an iteration too */
            build(L);
            if (L->nbatch == 0)
                return 0;
        }
        op = &L->batch[L->bpos++];
        if (TR_UNLIKELY((op->kind == TR_OP_WINDOW || op->kind == TR_OP_TIMER) &&
                        L->phase != PH_RUNNING)) {
            /* a stop began after this op was built (a shutdown ALL from a hook
             * before it in this batch): no window or timer once stopping (rules
             * 14, 19), as control_kind decides for the next batches */
            task *T = &L->tasks[op->task];
            T->in_control = 0;
            T->control_kind = CTL_NONE;
            trl_pool_unhold(L, T);
            /* what it skipped over may be due still: a commit request (a commit
             * ALL with that shutdown; rule 14: the stop waits for it) */
            trl_maybe_control(L, op->task);
            L->progress = 1;
            continue;
        }
        if (op->kind == TR_OP_PROCESS) {
            /* OPF_LAZY: take its message now, unless lazy_held (a stop, an error,
             * a timer of the task due now: rules 8, 19, 23), the task is no longer
             * runnable, or there is none to take (every buffered key busy); then
             * it is skipped with nothing taken, and the task keeps its turn for
             * the next build */
            task *T = &L->tasks[op->task];
            T->queued--;
            if (!lazy_held(L, T) && runnable(L, T) && dispatch_one(L, op->task, out))
                break;
            if (!T->in_ready)
                trl_carry(L, op->task);
            L->progress = 1;
            continue;
        }
        if (op->kind != TR_OP_RUN || !tr_loop_run_yield(L))
            break;
        carry_run(L, op->task); /* it would end before its first message */
    }
    L->handed++;
    L->chain = 0;
    if (op->kind == TR_OP_PROCESS) {
        if (L->tasks[op->task].infl) /* invoked now (rule 16: its timeout counts from here) */
            tr_loop_invoked_at(L, op->task, out->seq, trl_now(L));
        return 1;
    }
    *out = *op;
    if (op->kind == TR_OP_RUN) {
        run_slice(L, trl_coarse_now(L) + RUN_SLICE_NS);
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
    if (T->flags & TR_TASK_POOL || tr_loop_run_yield(L))
        return 0;
    /* relaxed: its own thread set it (tr_loop_event_seen): its event-time timers first */
    if (atomic_load_explicit(&T->et_pending, TR_RELAXED))
        return 0;
    if (T->in_dirty) {
        /* release what it completed (requests included) before deciding */
        trl_release_task(L, t, 0);
    }
    /* its earlier messages still in the batch go first (rule 1) */
    if (T->queued || T->in_ctl || !runnable(L, T))
        return 0;
    if (!dispatch_one(L, t, out))
        return 0;
    if (T->infl) /* invoked now (rule 16: its timeout counts from here) */
        tr_loop_invoked_at(L, t, out->seq, trl_now(L));
    L->chain++;
    L->handed++;
    L->budget--;
    return 1;
}

int tr_loop_run_yield(tr_loop *L) {
    /* relaxed: hints; build_batch's acquire load acts on the stop itself, and
     * next_op's on an error (posted by the message just run: a callback resolved
     * a second time, rule 17; or by another thread): nothing more runs (rule 16) */
    if (TR_UNLIKELY(atomic_load_explicit(&L->stop_requested, TR_RELAXED) ||
                    atomic_load_explicit(&L->error, TR_RELAXED)))
        return 1;
    /* a stop began after the run was built (a shutdown ALL, the last vote, from
     * a message of another task in this batch): dispatch has stopped (rule 19) */
    if (TR_UNLIKELY(L->phase != PH_RUNNING))
        return 1;
    /* a timer set since the build (by the message just run, usually) */
    int64_t set = atomic_load_explicit(&L->timer_min_new, TR_RELAXED); /* see loop.timer_min_new */
    if (TR_UNLIKELY(set < L->run_until))
        set_run_until(L, set);
    /* one coarse read per message; the exact clock only in the last tick or two
     * before the earliest timer */
    int64_t coarse = trl_coarse_now(L);
    if (TR_LIKELY(coarse < L->run_check_from))
        return 0;
    if (coarse >= L->run_slice_end)
        return 1; /* a run's time slice is over: it keeps the rest of its turn */
    return trl_now(L) >= L->run_until;
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
    if (T->control_kind == CTL_EOS && (requests & TR_REQ_SHUTDOWN_ALL)) {
        /* as the reference engine, which decides a stop after the hooks that fell
         * due together: the end-of-stream hooks of this batch run first, and a run
         * whose every task is then done ends as end_of_stream (build_batch) */
        L->eos_shutdown = 1;
        L->progress = 1; /* build again at once */
        requests &= ~(uint32_t)TR_REQ_SHUTDOWN_ALL;
    }
    switch (T->control_kind) {
    case CTL_COMMIT:
        bump(&T->commits);
        T->commit_hold = 0;
        trl_mark_dirty(L, t); /* release the held tail now (rule 15) */
        break;
    case CTL_WINDOW:
        bump(&T->windows);
        /* it ended when the next window was due already (on a test driver's clock,
         * which stands still during a hook, only if it was due when this one began) */
        if (L->cfg.window_ns > 0 && trl_now(L) >= T->window_next)
            T->window_overran = 1;
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
    trl_pool_unhold(L, T);
    /* the last task's end of stream ends the run as such, even when its hook also
     * requested a shutdown (the first reason wins; as the reference engine) */
    if (T->done)
        trl_settle_check(L, 1);
    if (requests)
        trl_apply_requests(L, t, requests & TR_REQ_MASK);
    trl_maybe_ready(L, t);
    trl_maybe_control(L, t);
}
