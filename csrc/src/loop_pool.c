/* loop_pool.c: the worker pool (rules 2, 3, 21) and its queue bounds.
 *
 * Each TR_TASK_POOL task belongs to one worker (task % pool_size). The loop
 * hands a worker runs of a task's messages ahead of time, up to the task's
 * window of sequence numbers, through the worker's own MPSC queue (the loop is
 * its only producer). The worker runs them with the runtime lock held once per
 * run_pool_batch and reports completions back through the loop's completion
 * queue, buffered (up to POOL_PEND) into one bulk push; a worker pushes what it
 * buffered before it starts a call of another task, and with callback timeouts
 * on before any call (the loop times each callback by the completions it has
 * popped).
 *
 * Queue bounds, and who may block where:
 *   - worker queue: at most one W_RUN item per outstanding seq of its tasks,
 *     one W_RESUME per task and the stop sentinel (tr_loop_create sizes it so),
 *     so push_worker always finds room; it never waits (the loop thread may
 *     hold the runtime lock the worker needs to drain it).
 *   - completion queue: at most one item per acquired-and-not-popped seq, per
 *     partition (wake) and per task (timer); release_task releases no more of a
 *     task's seqs than the loop popped, so acquired - popped <= the window.
 *   - A worker never waits on the completion queue while it may hold the
 *     runtime lock: pool_flush pushes what fits and keeps the rest;
 *     tr_loop_pool_next hands out no op while the buffer is full (the batch
 *     ends); worker_main waits for room only after run_pool_batch returned the
 *     lock. The loop thread, the queue's only consumer, never waits for a worker.
 *   - A worker parks on its own queue's notifier only with nothing to do.
 *   - At a stop, a worker still inside process after the drain (task.shutdown.ms)
 *     is abandoned (stop_workers): refs keep the loop alive until it exits.
 *
 * Layer 4 (see loop_internal.h): calls loop_input.c (take a message for a
 * worker), loop_timers.c (arm a handed-back op's timeout again) and loop.c (a
 * worker's reference on the loop). Completions go back through the completion
 * queue, which loop_release.c drains.
 */
#include "loop_internal.h"

/* Loop thread (which may hold the runtime lock, inside run_batch): push a
 * task's items to its worker. Never spins: the worker, the queue's only
 * consumer, may be waiting for that lock. The queue has room for every op its
 * tasks can have out (the bound in tr_loop_create), so everything fits; if it
 * did not, the items left over are handed back (the task's redo tail, whose
 * pins tr_loop_drain_items returns) and the loop stops with TR_EAGAIN, a
 * broken invariant stopping loudly. Returns 1 when everything was pushed. */
static int push_worker(tr_loop *L, task *T, tr_queue *q, const tr_item *items, size_t n) {
    size_t k = tr_queue_try_push_batch_mpsc(q, items, n);
    if (TR_LIKELY(k == n))
        return 1;
    /* items are one optional W_RESUME, then W_RUN seqs in order up to the last
     * acquired one: the first one not pushed starts the tail handed back */
    if (tr_enc_kind(items[k].a) == W_RESUME) {
        T->paused = 1;
        k++;
    }
    if (k < n) {
        T->redo_from = items[k].b;
        T->redo_count = (uint32_t)(T->acquired - items[k].b);
        unbump_n(&T->processed, n - k); /* counted when they went into items */
        unbump_n(&L->chosen, n - k);
    }
    if (L->internal == TR_OK)
        L->internal = TR_EAGAIN;
    return 0;
}

/* Hand a pool task's work to its worker in one burst: the ops it gave back
 * (first, in seq order), then buffered messages up to the task's window.
 * Returns how many new messages were taken from the rings. */
uint32_t trl_dispatch_pool(tr_loop *L, uint32_t t, uint32_t budget) {
    task *T = &L->tasks[t];
    tr_queue *q = L->workers[T->worker].q;
    tr_item its[64];
    size_t n = 0;
    uint32_t taken = 0;
    if (T->paused) {
        /* every op the worker had for T is back (runnable): a fresh run */
        its[n++] = (tr_item){kt_word(W_RESUME, t), 0};
        T->paused = 0;
    }
    uint32_t redo = T->redo_count;
    T->redo_count = 0;
    for (uint32_t i = 0; i < redo; i++) {
        uint64_t seq = T->redo_from + i;
        its[n++] = (tr_item){kt_word(W_RUN, t), seq}; /* its item is still in pitem */
        bump(&T->processed);
        bump(&L->chosen);
        if (T->infl) {
            inflight *f = &T->infl[seq & T->infl_mask];
            trl_arm_timeout(L, t, seq, f->handle, f->part);
        }
        if (n == 64) {
            if (!push_worker(L, T, q, its, n))
                return taken;
            n = 0;
        }
    }
    while (taken < budget && T->buffered && tr_sequencer_outstanding(T->seq) < T->limit &&
           !commit_holds(L, T)) {
        uint32_t p;
        uint64_t item, handle;
        uint64_t seq = trl_take_one(L, t, &p, &item, &handle);
        if (seq == TR_NO_SEQ)
            break; /* keyed: every buffered key is busy */
        T->pitem[seq & T->pmask] = item;
        its[n++] = (tr_item){kt_word(W_RUN, t), seq};
        taken++;
        if (n == 64) {
            if (!push_worker(L, T, q, its, n))
                return taken;
            n = 0;
        }
    }
    if (n)
        push_worker(L, T, q, its, n);
    L->progress = 1;
    return taken;
}

/* Worker: push the buffered completions to the loop in one go (one notify).
 * Never spins: this runs with the runtime lock held (inside run_pool_batch),
 * and the loop thread, the queue's only consumer, may be waiting for that lock.
 * What does not fit stays buffered (the bound in tr_loop_create says nothing
 * ever stays); tr_loop_pool_next hands out no op while the buffer is full, and
 * worker_main waits for room only after run_pool_batch gave the lock back.
 * Returns the completions still buffered. */
static size_t pool_flush(tr_loop *L, worker *W) {
    size_t k = tr_queue_try_push_batch_mpsc(L->cq, W->pend, W->npend);
    if (k && k < W->npend)
        memmove(W->pend, W->pend + k, (W->npend - k) * sizeof *W->pend);
    W->npend -= k;
    return W->npend;
}

/* Worker, runtime lock NOT held: push every buffered completion. The loop
 * thread drains the queue without waiting for this worker, so waiting here
 * ends (and with the bound, never starts). */
static void pool_flush_all(tr_loop *L, worker *W) {
    while (pool_flush(L, W))
        sched_yield();
}

/* The caller made sure there is room (tr_loop_pool_next returns an op only then). */
static inline void pool_note(tr_loop *L, worker *W, uint32_t kind, uint32_t t, uint64_t seq) {
    if (W->npend == 0)
        W->pend_t0 = tr_now_ns();
    W->pend[W->npend++] = (tr_item){kt_word(kind, t), seq};
    W->pend_task = t;
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
        pool_flush_all(L, W);
    }
    if (H->worker_stopping)
        H->worker_stopping(H->ctx, W->index);
    /* release: stop_workers' acquire load sees everything this worker did */
    atomic_store_explicit(&W->exited, 1, TR_RELEASE);
    trl_loop_unref(L);
    return NULL;
}

/* Loop thread, at run: start the workers (each holds a reference on the loop
 * until it exits). TR_ESYS when a thread could not start (those started run on
 * until stop_workers). */
tr_status trl_start_workers(tr_loop *L) {
    for (uint32_t w = 0; w < L->cfg.pool_size; w++) {
        /* relaxed: the thread's creation orders it before the worker's unref */
        atomic_fetch_add_explicit(&L->refs, 1, TR_RELAXED);
        if (pthread_create(&L->workers[w].thread, NULL, worker_main, &L->workers[w]) != 0) {
            atomic_fetch_sub_explicit(&L->refs, 1, TR_RELAXED);
            return TR_ESYS;
        }
        L->workers[w].started = 1;
    }
    return TR_OK;
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
        /* room for this op's completion (or its hand-back) first: if even a
         * flush leaves the buffer full, end the batch (worker_main waits for
         * room without the runtime lock) */
        if (W->npend == POOL_PEND && pool_flush(L, W) == POOL_PEND)
            return 0;
        tr_item it = W->items[W->pos++];
        uint32_t kind = tr_enc_kind(it.a), t = tr_enc_task(it.a);
        if (kind == W_STOP) { /* the stop sentinel: pushed last */
            W->stop = 1;
            W->pos = W->n;
            return 0;
        }
        if (kind == W_RESUME) {
            W->stopped[t / L->cfg.pool_size] = 0;
            continue;
        }
        uint64_t seq = it.b;
        memset(out, 0, sizeof *out);
        out->kind = TR_OP_PROCESS;
        out->task = t;
        out->seq = seq;
        /* written by the loop before the push our pop pairs with (see W_RUN) */
        out->item = L->tasks[t].pitem[seq & L->tasks[t].pmask];
        /* acquire: pairs with the release store before the sentinel / post_error's CAS */
        if (atomic_load_explicit(&L->discard, TR_ACQUIRE) ||
            atomic_load_explicit(&L->error, TR_ACQUIRE)) {
            out->flags = TR_OPF_DISCARD; /* the loop has stopped: only drop the item */
            return 1;
        }
        /* relaxed: see trl_begin_drain (a late read only runs an op already handed out) */
        /* relaxed (hold): see task.hold */
        if (W->stopped[t / L->cfg.pool_size] || atomic_load_explicit(&L->draining, TR_RELAXED) ||
            atomic_load_explicit(&L->tasks[t].hold, TR_RELAXED)) {
            /* not invoked: back to the loop, which hands it out again in order */
            W->stopped[t / L->cfg.pool_size] = 1;
            pool_note(L, W, CQ_UNRUN, t, seq);
            continue;
        }
        /* The loop hears of buffered completions before this worker starts a
         * call of another task (whose call may be long: the first task's next
         * barrier or end of stream must not wait for it, rule 4), and, with
         * callback timeouts, before any call: a completion buffered behind a
         * long call would look unfinished at its deadline (rule 16: a callback
         * that completed in time failed, and the error named it). */
        if (W->npend && (W->pend_task != t || L->cfg.callback_timeout_ns > 0))
            pool_flush(L, W);
        if (W->budget)
            W->budget--;
        bump(&L->tasks[t].invoked); /* single writer here: the task's one worker */
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

void trl_stop_workers(tr_loop *L) {
    if (!L->workers)
        return;
    atomic_store_explicit(&L->discard, 1, TR_RELEASE); /* read by workers after popping */
    for (uint32_t w = 0; w < L->cfg.pool_size; w++) {
        worker *W = &L->workers[w];
        if (!W->started)
            continue;
        tr_item sentinel = {kt_word(W_STOP, 0), 0};
        while (tr_queue_try_push_mpsc(W->q, sentinel) != TR_OK)
            tr_cpu_relax(); /* a slot is kept free */
    }
    /* Rule 19: the drain already waited task.shutdown.ms for outstanding calls,
     * so idle workers get a short grace to exit and a worker still inside a
     * process call is abandoned (detached): it holds a reference on the loop
     * (refs) and the binding pins its own context for it, so its late
     * completion lands in memory that is still there, and nothing of it is
     * committed (the final commit covered only the released prefix). */
    int64_t deadline = tr_now_ns() + WORKER_EXIT_GRACE_NS;
    for (uint32_t w = 0; w < L->cfg.pool_size; w++) {
        worker *W = &L->workers[w];
        if (!W->started)
            continue;
        /* acquire: pairs with worker_main's release store */
        while (!atomic_load_explicit(&W->exited, TR_ACQUIRE) && tr_now_ns() < deadline)
            sched_yield();
        if (atomic_load_explicit(&W->exited, TR_ACQUIRE))
            pthread_join(W->thread, NULL);
        else
            pthread_detach(W->thread); /* abandoned: frees itself on exit */
        W->started = 0;
    }
}
