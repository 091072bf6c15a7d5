/* loop.c: the loop object and its any-thread surface: create/destroy (and the
 * references that keep an abandoned pool worker's loop alive), errors, stop,
 * user timers, the completion queue's push, watermarks, counters, drain_items.
 *
 * Layer 1 (see loop_internal.h): calls no other loop file. */
#include "loop_internal.h"

/* ------------------------------------------------------------- public API */

/* A task's sequencer window. A keyed loop-thread task (rules 30, 31) gets more
 * than max_concurrency: completions behind a slow message stay unreleased (the
 * sequencer releases in invocation order) but no longer count against max
 * concurrency (invoked, not completed: rule 2; see runnable), so other keys go
 * on until this window fills: 16 x max_concurrency, no more than its rings can
 * hold (a seq not released keeps its ring slot, see part.kbase). */
static uint32_t task_window(const tr_loop_config *cfg, const tr_loop_task *tk,
                            uint32_t pool_limit) {
    if (cfg->pool_size && (tk->flags & TR_TASK_POOL))
        return pool_limit;
    if (!(tk->flags & TR_TASK_KEYED))
        return cfg->max_concurrency;
    uint64_t w = (uint64_t)cfg->max_concurrency * 16u;
    uint64_t ring = (uint64_t)cfg->input_buffer * (tk->npartitions ? tk->npartitions : 1);
    if (w > ring)
        w = ring;
    if (w < cfg->max_concurrency)
        w = cfg->max_concurrency;
    return w > TR_SEQ_MAX_CONCURRENCY ? TR_SEQ_MAX_CONCURRENCY : (uint32_t)w;
}

tr_status tr_loop_create(const tr_loop_config *cfg, const tr_loop_task *tasks, tr_loop **out) {
    if (!cfg || !tasks || !out || cfg->ntasks == 0 || cfg->ntasks > TR_ENC_TASK_MAX ||
        cfg->max_concurrency == 0 || cfg->max_concurrency > TR_SEQ_MAX_CONCURRENCY ||
        cfg->input_buffer == 0 || cfg->input_buffer > (1u << 30) || cfg->pool_size > 4096)
        return TR_EINVAL;
    uint64_t total_parts = 0;
    for (uint32_t t = 0; t < cfg->ntasks; t++) {
        if (tasks[t].npartitions > MAX_PARTS)
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
        nlimit += task_window(cfg, &tasks[t], pool_limit);
    /* The completion queue never fills. Its items: CQ_WAKE, at most one per
     * partition (the `woken` flag); CQ_TIMER, at most one per task
     * (`timer_pending`), and CQ_ETIMER likewise (`et_pending`); CQ_DONE / CQ_UNRUN, at most one per
     * sequence number at a time (a seq completes once; one handed back unrun is handed out again
     * only after the loop popped its CQ_UNRUN). Every seq with an item in flight (buffered by a
     * worker or queued) is acquired and not yet popped, so there are at most acquired - popped of
     * them; release_task releases no more seqs than it popped, so acquired - popped <= acquired -
     * released <= the task's window. Summed: windows + partitions + tasks (+ slack). */
    uint64_t cq_cap = nlimit + total_parts + 2ull * cfg->ntasks + 16; /* + CQ_ETIMER: one a task */
    if (cq_cap > (1ull << 30))
        return TR_EINVAL;

    tr_loop *L = calloc(1, sizeof *L);
    if (!L)
        return TR_ENOMEM;
    L->cfg = *cfg;
    atomic_init(&L->refs, 1);
    L->cq_bound = cq_cap;
    L->coarse_lag = cfg->clock_fn ? 0 : tr_coarse_lag_ns(); /* a configured clock is exact */
    L->run_until = INT64_MAX;
    L->run_check_from = INT64_MAX;
    L->run_slice_end = INT64_MAX;
    atomic_init(&L->timer_min_new, INT64_MAX);
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
    L->carry = calloc(cfg->ntasks, sizeof *L->carry);
    L->ctl = calloc(cfg->ntasks, sizeof *L->ctl);
    L->dirty = calloc(cfg->ntasks, sizeof *L->dirty);
    L->refill_cap = total_parts ? total_parts : 1;
    L->refill = calloc(L->refill_cap, sizeof *L->refill);
    L->wm_dirty = calloc(L->refill_cap, sizeof *L->wm_dirty);
    L->heap_cap = 4u * cfg->ntasks + 16u;
    L->heap = malloc(L->heap_cap * sizeof *L->heap);
    if (!L->tasks || !L->ready || !L->carry || !L->ctl || !L->dirty || !L->refill || !L->wm_dirty ||
        !L->heap)
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
        T->limit = task_window(cfg, &tasks[t], pool_limit);
        atomic_init(&T->timer_when, INT64_MAX);
        atomic_init(&T->et_timer_at, INT64_MAX);
        atomic_init(&T->et_pending, 0);
        st = tr_sequencer_create(T->limit, &T->seq);
        if (st != TR_OK)
            goto fail;
        st = tr_watermark_create(T->nparts, &T->wm);
        if (st != TR_OK)
            goto fail;
        /* idleness counts from the task's start (rule 33): now, on the loop's clock */
        st = tr_event_time_create(T->nparts, cfg->event_lag_ms, cfg->event_idle_ns, trl_now(L),
                                  &T->et);
        if (st != TR_OK)
            goto fail;
        if (T->flags & TR_TASK_EVENT_TRACK)
            tr_event_time_track(T->et);
        st = TR_ENOMEM;
        uint32_t wsize = pow2_at_least(T->limit);
        T->spart = calloc(wsize, sizeof *T->spart);
        T->sseen = calloc(wsize, 1);
        if (!T->spart || !T->sseen)
            goto fail;
        T->smask = wsize - 1;
        if (T->flags & TR_TASK_POOL) {
            T->pitem = calloc(wsize, sizeof *T->pitem);
            if (!T->pitem)
                goto fail;
            T->pmask = wsize - 1;
        }
        if (T->flags & TR_TASK_KEYED) {
            /* runs only while nothing is outstanding and no slot past head is
             * taken (loop_schedule.c): then the ring from head is plain order */
            T->keyed = 1;
            /* the busy set: short probes (64 slots per message a task may have
             * invoked and not completed, up to 2^20) and at least twice as many
             * slots as seqs outstanding, so that it never fills (key_find) */
            uint64_t nb = (uint64_t)cfg->max_concurrency * 64u;
            if (nb < 1024u)
                nb = 1024u;
            if (nb > (1u << 20))
                nb = 1u << 20;
            if (nb < 2u * (uint64_t)wsize)
                nb = 2u * (uint64_t)wsize;
            uint32_t bsize = pow2_at_least(nb);
            if (bsize <= T->limit)
                goto fail; /* a window of 2^30 seqs: more than the rings can hold */
            T->bkey = calloc(bsize, sizeof *T->bkey);
            T->bcount = calloc(bsize, sizeof *T->bcount);
            T->bmask = bsize - 1;
            T->skey = calloc(wsize, sizeof *T->skey);
            T->sdisp = calloc(wsize, sizeof *T->sdisp);
            if (!T->bkey || !T->bcount || !T->skey || !T->sdisp)
                goto fail;
        }
        if (infl_size) {
            /* a keyed window is wider than max_concurrency: one slot per seq of it */
            uint32_t isize = T->keyed ? pow2_at_least(T->limit) : infl_size;
            T->infl = calloc(isize, sizeof *T->infl);
            if (!T->infl)
                goto fail;
            T->infl_mask = isize - 1;
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
            if (T->keyed) {
                P->khash = malloc((size_t)size * sizeof *P->khash);
                P->kst = calloc(size, 1);
                if (!P->khash || !P->kst)
                    goto fail;
            }
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

static void loop_free(tr_loop *L) {
    if (L->tasks) {
        for (uint32_t t = 0; t < L->cfg.ntasks; t++) {
            task *T = &L->tasks[t];
            if (T->seq)
                tr_sequencer_destroy(T->seq);
            if (T->wm)
                tr_watermark_destroy(T->wm);
            if (T->et)
                tr_event_time_destroy(T->et);
            free(T->infl);
            free(T->pitem);
            free(T->spart);
            free(T->sseen);
            free(T->bkey);
            free(T->bcount);
            free(T->skey);
            free((void *)T->sdisp);
            if (T->parts) {
                for (uint32_t p = 0; p < T->nparts; p++) {
                    free(T->parts[p].items);
                    free(T->parts[p].handles);
                    free(T->parts[p].khash);
                    free(T->parts[p].kst);
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
    free(L->carry);
    free(L->ctl);
    free(L->dirty);
    free(L->refill);
    free(L->wm_dirty);
    free(L->heap);
    free(L);
}

void trl_loop_unref(tr_loop *L) {
    /* acq_rel: every holder's accesses happen-before the last one's free */
    if (atomic_fetch_sub_explicit(&L->refs, 1, TR_ACQ_REL) == 1)
        loop_free(L);
}

void tr_loop_destroy(tr_loop *L) {
    if (!L)
        return;
    trl_loop_unref(L); /* the owner's reference; an abandoned worker may hold the last */
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

/* Any thread (the binding may hold its runtime lock): push one item onto the
 * completion queue. Never spins: by the bound in tr_loop_create the queue has
 * room; if it had none, that bound is broken, and the loop stops with
 * TR_EAGAIN rather than this thread waiting for a consumer that may be
 * waiting for the lock it holds. */
void trl_cq_push(tr_loop *L, tr_item it) {
    if (TR_LIKELY(tr_queue_try_push_mpsc(L->cq, it) == TR_OK))
        return;
    uint32_t none = 0;
    /* release: pairs with build_batch's acquire load; seq_cst would add nothing */
    atomic_compare_exchange_strong_explicit(&L->broken, &none, (uint32_t)TR_EAGAIN, TR_RELEASE,
                                            TR_RELAXED);
    tr_notifier_notify(&L->notifier);
}

void tr_loop_set_user_timer(tr_loop *L, uint32_t t, int64_t when_ns) {
    if (t >= L->cfg.ntasks)
        return;
    task *T = &L->tasks[t];
    /* release: the loop's acquire load of timer_when after its exchange */
    atomic_store_explicit(&T->timer_when, when_ns, TR_RELEASE);
    /* relaxed CAS-min: see loop.timer_min_new */
    int64_t seen = atomic_load_explicit(&L->timer_min_new, TR_RELAXED);
    while (when_ns < seen && !atomic_compare_exchange_weak_explicit(
                                 &L->timer_min_new, &seen, when_ns, TR_RELAXED, TR_RELAXED)) {
    }
    /* seq_cst: pairs with trl_pool_unhold (the loop clears hold, then re-reads
     * timer_pending): either it sees this item pending or this hold lands after
     * its clear */
    uint32_t was_pending = atomic_exchange_explicit(&T->timer_pending, 1, TR_SEQ_CST);
    if ((T->flags & TR_TASK_POOL) && when_ns <= trl_now(L)) {
        /* due already (a process call on the task's worker scheduled it): the
         * worker invokes none of this task's queued messages until the timer
         * ran (rule 23, like a due window: rule 8); see task.hold */
        atomic_store_explicit(&T->hold, 1, TR_SEQ_CST);
    }
    if (was_pending)
        return;
    trl_cq_push(L, (tr_item){kt_word(CQ_TIMER, t), 0});
}

/* Any thread: queue one CQ_ETIMER for the task (deduped: see et_pending). */
static void et_poke(tr_loop *L, uint32_t t) {
    /* acq_rel: pairs with the loop's exchange before it re-reads et_timer_at */
    if (!atomic_exchange_explicit(&L->tasks[t].et_pending, 1, TR_ACQ_REL))
        trl_cq_push(L, (tr_item){kt_word(CQ_ETIMER, t), 0});
}

void tr_loop_set_event_timer(tr_loop *L, uint32_t t, int64_t at_ms) {
    if (t >= L->cfg.ntasks)
        return;
    /* release: the loop's acquire load after its exchange of et_pending */
    atomic_store_explicit(&L->tasks[t].et_timer_at, at_ms, TR_RELEASE);
    et_poke(L, t);
}

/* After tr_event_time_seen / _done: recompute on the loop thread, or have the loop
 * thread do it (a pool worker); 1 when the task's event-time timer is due now. */
static int et_moved(tr_loop *L, uint32_t t) {
    task *T = &L->tasks[t];
    if (T->flags & TR_TASK_POOL) {
        et_poke(L, t); /* the loop thread computes the watermark (and checks the timer) */
        return 0;
    }
    /* the loop thread: the watermark as of this message (context.watermark(), metrics);
     * twice a message: the coarse clock (idleness is a matter of its timeout, in ms) */
    int64_t w = tr_event_time_update(T->et, trl_coarse_now(L));
    int64_t at = atomic_load_explicit(&T->et_timer_at, TR_RELAXED); /* a hint: see et_poke */
    if (TR_LIKELY(w < at) || at == INT64_MAX)
        return 0;
    et_poke(L, t); /* popped before the loop hands this task anything more */
    return 1;
}

int tr_loop_event_seen(tr_loop *L, uint32_t t, uint32_t p, int64_t ts) {
    /* its partition's largest timestamp stayed: nothing moved */
    if (t >= L->cfg.ntasks || tr_event_time_seen_moved(L->tasks[t].et, p, ts) != 1)
        return 0;
    return et_moved(L, t);
}

_Thread_local tr_loop *trl_thread_loop;

int tr_loop_event_seen_run(tr_loop *L, uint32_t t, uint32_t i, int64_t ts) {
    if (t >= L->cfg.ntasks || L->run_task != t || i >= L->run_count)
        return 0;
    task *T = &L->tasks[t];
    if (!tr_event_time_seen_one(T->et, L->run_parts[i], ts)) /* a run: this thread only */
        return 0;
    /* No event-time timer: nothing needs the watermark before the run ends, or before a
     * reader on this thread asks (tr_loop_event_watermark), so its recompute waits for
     * then (trl_et_sync). Between changes of a partition's state (a poll, an end) the
     * watermark only grows with what is handed over, the calls that return and the
     * clock, so one recompute then gives what one after each message would have reached.
     * Relaxed: a hint; a timer set meanwhile by another thread queues a CQ_ETIMER, whose
     * check recomputes (trl_et_check). */
    if (atomic_load_explicit(&T->et_timer_at, TR_RELAXED) == INT64_MAX) {
        T->et_stale = 1;
        return 0;
    }
    return et_moved(L, t);
}

int tr_loop_event_done(tr_loop *L, uint32_t t, uint32_t p) {
    if (t >= L->cfg.ntasks)
        return 0;
    task *T = &L->tasks[t];
    if (tr_event_time_done(T->et, p) != TR_OK)
        return 0;
    /* on the loop thread, only an ended or empty partition's drain can move anything */
    if (!(T->flags & TR_TASK_POOL) && !tr_event_time_drain_matters(T->et, p))
        return 0;
    return et_moved(L, t);
}

void tr_loop_stop(tr_loop *L) {
    /* release: pairs with build_batch's acquire load; seq_cst for the notifier's re-check */
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

int64_t tr_loop_event_watermark(tr_loop *L, uint32_t t) {
    if (t >= L->cfg.ntasks)
        return TR_ET_NONE;
    /* its own thread, in a sync run: the messages handed over so far count (rule 33);
     * any other thread reads the value as of the last recompute (the run's end at the
     * latest); et_stale is read only by the loop thread */
    if (trl_thread_loop == L)
        trl_et_sync(L, &L->tasks[t]);
    return tr_event_time_get(L->tasks[t].et);
}

void tr_loop_event_floor(tr_loop *L, uint32_t t, int64_t floor) {
    if (t < L->cfg.ntasks)
        tr_event_time_floor(L->tasks[t].et, floor);
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

int tr_loop_task_settled(tr_loop *L, uint32_t t) {
    if (t >= L->cfg.ntasks)
        return 0;
    task *T = &L->tasks[t];
    /* dispatched and not released (a failed message of a run included; the ops
     * handed back unrun are not counted as processed). A pool task takes its
     * messages in offset order (key_pick), so its handed-back ops are a plain
     * tail, keyed or not */
    uint64_t processed = atomic_load_explicit(&T->processed, TR_RELAXED);
    uint64_t completed = atomic_load_explicit(&T->completed, TR_RELAXED);
    if (processed != completed)
        return 0;
    if (T->keyed && T->kahead) {
        T->kcatchup = 1; /* see key_pick and take_keyed (loop_input.c) */
        return 0;
    }
    return 1;
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
    /* a pool task's processed: the ops its worker started (queued ones were not
     * invoked, so they are not outstanding either: rule 2) */
    out->processed =
        atomic_load_explicit((T->flags & TR_TASK_POOL) ? &T->invoked : &T->processed, TR_RELAXED);
    out->completed = atomic_load_explicit(&T->completed, TR_RELAXED);
    out->outstanding = out->processed >= out->completed ? out->processed - out->completed : 0;
    out->windows = atomic_load_explicit(&T->windows, TR_RELAXED);
    out->commits = atomic_load_explicit(&T->commits, TR_RELAXED);
    out->timers = atomic_load_explicit(&T->timers, TR_RELAXED);
    out->done = atomic_load_explicit(&T->done_pub, TR_RELAXED);
    out->oldest_ns = INT64_MAX;
    if (T->keyed) {
        out->keys_in_flight = atomic_load_explicit(&T->kinflight, TR_RELAXED);
        /* the first unreleased seq is the oldest message still holding the
         * watermark back (its slot is not reused before it is released) */
        uint64_t s = tr_sequencer_released_upto(T->seq);
        if (out->outstanding)
            out->oldest_ns = atomic_load_explicit(&T->sdisp[s & T->smask], TR_RELAXED);
    }
}

void tr_loop_get_stats(const tr_loop *L, tr_loop_stats *out) {
    out->envelopes_chosen = atomic_load_explicit(&L->chosen, TR_RELAXED);
    out->idle_wakeups = atomic_load_explicit(&L->idle_wakeups, TR_RELAXED);
    out->loop_iterations = atomic_load_explicit(&L->iterations, TR_RELAXED);
    out->batches = atomic_load_explicit(&L->batches, TR_RELAXED);
    out->cq_high_water = atomic_load_explicit(&L->cq_high, TR_RELAXED);
    out->cq_bound = L->cq_bound;
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
    /* the batch's PROCESS ops not handed out (OPF_LAZY) took nothing: their
     * messages are still in the rings, given back below */
    L->bpos = L->nbatch;
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
        if (T->keyed && (P->kst[P->head & P->mask] & KS_TAKEN)) {
            P->head++; /* dispatched by look-ahead: the binding owns it */
            continue;
        }
        out[n++] = P->items[P->head & P->mask];
        P->head++;
        T->buffered--;
    }
    return n;
}
