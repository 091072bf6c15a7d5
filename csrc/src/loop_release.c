/* loop_release.c: completions reach the loop (the completion queue and its
 * bound, see tr_loop_create) and are released in sequence order into the
 * watermarks (rules 12, 13, 15, 17, 18); runs report with run_done.
 *
 * Layer 3 (see loop_internal.h): calls loop_timers.c (user timers read from
 * the queue, an escaped run message's timeout), loop_state.c (what a release
 * makes ready or due, its requests) and loop.c (a remote completion's push). */
#include "loop_internal.h"

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

void trl_wm_flush(tr_loop *L) {
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

/* TR_TASK_KEYED: seqs are released in invocation order, which is not offset
 * order (look-ahead); the watermark moves over the partition's contiguous
 * prefix of released positions from kbase (rules 12, 13, 30): a position
 * invoked early waits in the ring, marked done, until everything before it is
 * released too. Positions below head are all dispatched, so the walk stops at
 * the first one not yet released, at the latest at head. */
static void key_release(tr_loop *L, uint32_t t, uint32_t p, uint64_t pos) {
    part *P = &L->tasks[t].parts[p];
    P->kst[pos & P->mask] |= KS_DONE;
    uint64_t from = P->kbase;
    while (P->kbase != P->head && (P->kst[P->kbase & P->mask] & KS_DONE)) {
        P->kst[P->kbase & P->mask] = 0;
        P->kbase++;
    }
    if (P->kbase != from) {
        uint64_t last = P->kbase - 1;
        wm_note(L, t, p, last, P->handles[last & P->mask]);
        /* room again: read on, to the whole buffer (as tr_loop_push_inputs_keyed) */
        if (part_used(P, 1) < P->fill)
            trl_queue_refill(L, t, p);
    }
}

/* Loop thread: the loop saw seq's completion: its key is free again (rule 30). */
static void key_free(tr_loop *L, uint32_t t, uint64_t seq) {
    task *T = &L->tasks[t];
    key_unhold(T, T->skey[seq & T->smask]);
    T->kblocked = 0;
    kinflight_add(T, -1);
}

/* The loop has seen seq's completion (its CQ_DONE item, or complete_local):
 * it may be released (task.sseen), its key is free (rule 30), its callback
 * timeout no longer runs. */
static void completion_seen(tr_loop *L, uint32_t t, uint64_t seq) {
    task *T = &L->tasks[t];
    T->completions++;
    T->sseen[seq & T->smask] = 1;
    if (T->keyed)
        key_free(L, t, seq);
    if (T->infl)
        T->infl[seq & T->infl_mask].done = 1;
    trl_mark_dirty(L, t);
}

/* Release T's contiguous completed prefix into its watermarks (rule 12). Stops
 * right after a completion carrying a commit request and holds the rest until
 * that commit has run (rule 15), unless `all` (the final commit). */
void trl_release_task(tr_loop *L, uint32_t t, int all) {
    task *T = &L->tasks[t];
    tr_seq_release buf[64];
    for (;;) {
        if (T->commit_hold && !all)
            break;
        /* Release only seqs whose completions the loop has popped, in order: a
         * seq completed in the sequencer whose queue item is still in a worker's
         * buffer or in the queue stays outstanding, so a task never has more
         * queue items than its window (the bound in tr_loop_create), and that
         * item, once popped, still finds its seq's slots (see task.sseen; a
         * count of popped completions let a later seq's completion stand for
         * it: its callback-timeout slot was then marked done by the earlier
         * seq's item and the timeout never fired) */
        size_t allow = 0;
        while (allow < 64 && T->sseen[(T->seq_released + allow) & T->smask])
            allow++;
        if (allow == 0)
            break;
        size_t n = tr_sequencer_release(T->seq, buf, allow);
        T->seq_released += n;
        for (size_t i = 0; i < n; i++) {
            T->sseen[buf[i].seq & T->smask] = 0;
            uint32_t p = T->spart[buf[i].seq & T->smask];
            uint64_t pos = buf[i].tag_a;
            bump(&T->completed);
            if (T->keyed) {
                key_release(L, t, p, pos);
            } else {
                wm_note(L, t, p, pos, buf[i].tag_b);
            }
            if ((T->flags & TR_TASK_POOL) && !T->keyed) {
                part *P = &T->parts[p];
                P->lent--;
                if (P->tail - P->head + P->lent <= P->fill / 2)
                    trl_queue_refill(L, t, p);
            }
            uint32_t req = (buf[i].flags >> TR_SEQ_USER_SHIFT) & TR_REQ_MASK;
            if (req && (T->flags & TR_TASK_POOL))
                T->paused = 1; /* its worker stopped invoking this task */
            if (req && !all)
                trl_apply_requests(L, t, req);
        }
        if (n == 0)
            break;
        if ((buf[n - 1].flags & TR_SEQ_COMMIT) && !all)
            T->commit_hold = 1;
    }
    trl_maybe_ready(L, t);
    trl_maybe_control(L, t);
}

void trl_process_dirty(tr_loop *L) {
    while (L->ndirty) {
        uint32_t t = L->dirty[--L->ndirty];
        L->tasks[t].in_dirty = 0;
        trl_release_task(L, t, 0);
    }
}

void trl_drain_completions(tr_loop *L) {
    tr_item items[64];
    size_t n;
    uint64_t size = tr_queue_size_approx(L->cq);
    /* relaxed: single writer (this thread); a metric and a test's probe */
    if (size > atomic_load_explicit(&L->cq_high, TR_RELAXED))
        atomic_store_explicit(&L->cq_high, size, TR_RELAXED);
    while ((n = tr_queue_try_pop_batch_sc(L->cq, items, 64)) > 0) {
        L->progress = 1;
        for (size_t i = 0; i < n; i++) {
            uint32_t kind = tr_enc_kind(items[i].a);
            uint32_t t = tr_enc_task(items[i].a);
            if (TR_UNLIKELY(kind == 0 || t >= L->cfg.ntasks)) {
                L->internal = TR_EINVAL; /* cannot happen: see kt_word */
                continue;
            }
            task *T = &L->tasks[t];
            if (kind == CQ_DONE) {
                completion_seen(L, t, items[i].b);
            } else if (kind == CQ_UNRUN) {
                /* a pool op the worker did not run: its seq joins the tail */
                if (T->redo_count == 0)
                    T->redo_from = items[i].b;
                else if (items[i].b != T->redo_from + T->redo_count)
                    L->internal = TR_EINVAL; /* cannot happen: a worker keeps seq order */
                T->redo_count++;
                T->paused = 1;
                /* counted again when it is handed out again */
                unbump_n(&T->processed, 1);
                unbump_n(&L->chosen, 1);
                if (T->infl)
                    T->infl[items[i].b & T->infl_mask].done = 2;
                trl_mark_dirty(L, t);
            } else if (kind == CQ_WAKE) {
                uint32_t p = (uint32_t)items[i].b;
                part *P = &T->parts[p];
                /* acq_rel: pairs with wake_partition's exchange; a wake after this
                 * point queues a new item */
                atomic_exchange_explicit(&P->woken, 0, TR_ACQ_REL);
                if (P->state == TR_PART_IDLE) {
                    P->state = TR_PART_ACTIVE;
                    L->nidle--;
                    trl_queue_refill(L, t, p);
                }
            } else if (kind == CQ_ETIMER) {
                /* clear the flag before reading et_timer_at (trl_et_check): a newer
                 * set_event_timer either is seen there or queues another item */
                atomic_exchange_explicit(&T->et_pending, 0, TR_ACQ_REL);
                trl_et_check(L, t);
            } else if (kind == CQ_TIMER) {
                /* clear the flag before reading `when`: a newer set_user_timer
                 * either is seen by the load below or queues another item */
                atomic_exchange_explicit(&T->timer_pending, 0, TR_ACQ_REL);
                int64_t when = atomic_load_explicit(&T->timer_when, TR_ACQUIRE);
                T->timer_gen++;
                if (when != INT64_MAX && !T->done)
                    trl_heap_push(L, when, t, H_USER, T->timer_gen);
                /* not due (any more): trl_fire_timers holds it when it is. A
                 * timer due until now, cancelled or moved later (rule 23), holds
                 * back nothing any more: the task dispatches again (rule 8) */
                if (when > L->now) {
                    if (T->timer_due && !T->in_control && !et_due(T)) {
                        T->timer_due = 0;
                        trl_maybe_ready(L, t);
                    }
                    trl_pool_unhold(L, T);
                }
            }
        }
    }
    if (L->nheap > 8u * L->cfg.ntasks + 64u)
        trl_heap_compact(L);
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
    run_slice(L, INT64_MAX);
    uint32_t esc_part = UINT32_MAX;
    uint64_t esc_pos = 0;
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
        tr_status st = tr_sequencer_acquire(T->seq, pos, handle, seq);
        if (st != TR_OK)
            return st; /* cannot happen: a run is handed only with nothing outstanding */
        T->spart[*seq & T->smask] = p;
        T->acquired++;
        if (T->infl)
            trl_arm_timeout(L, t, *seq, handle, p);
        if (T->keyed) {
            /* outstanding now: its key is busy, its slot stays until released */
            uint64_t h = P->khash[pos & P->mask];
            P->kst[pos & P->mask] = KS_TAKEN;
            key_hold(T, h);
            T->skey[*seq & T->smask] = h;
            atomic_store_explicit(&T->sdisp[*seq & T->smask], L->now, TR_RELAXED); /* metric */
            kinflight_add(T, 1);
            esc_part = p;
            esc_pos = pos;
        }
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
        if (T->keyed) /* a run starts with kbase == head (nothing outstanding) */
            P->kbase = esc_part == 0 ? esc_pos : P->head;
        if (part_used(P, T->keyed) <= P->fill / 2)
            trl_queue_refill(L, t, 0);
    } else {
        for (uint32_t i = 0; i < consumed; i++) {
            uint32_t p = L->run_parts[i];
            part *P = &T->parts[p];
            if (i < completed)
                wm_note(L, t, p, P->head, P->handles[P->head & P->mask]);
            P->head++;
            if (T->keyed)
                P->kbase = p == esc_part ? esc_pos : P->head;
            if (part_used(P, T->keyed) <= P->fill / 2)
                trl_queue_refill(L, t, p);
        }
        /* fill_run moved the round robin past every message it put in the run: one
         * that ended early (a request, a failure, a barrier, an escape) rewinds it to
         * the partition after the last message consumed (rule 5; not to the next
         * message's partition: one empty when the run was filled may have input now) */
        if (consumed == 0 && L->run_count) {
            T->rr = L->run_parts[0];
        } else if (consumed < L->run_count) {
            uint32_t last = L->run_parts[consumed - 1];
            T->rr = last + 1 == T->nparts ? 0 : last + 1;
        }
    }
    /* event-time tracking: the calls that returned (the escaping one's too) are done,
     * counted here rather than by the binding after each call; an ended or empty
     * partition's drain may move the watermark (tr_loop_event_done) */
    uint32_t calls = escape ? consumed : completed;
    if (calls && tr_event_time_tracking(T->et)) {
        int matters = 0;
        if (T->nparts == 1) {
            tr_event_time_done_n(T->et, 0, calls);
            matters = tr_event_time_drain_matters(T->et, 0);
        } else {
            for (uint32_t i = 0; i < calls; i++) {
                tr_event_time_done_n(T->et, L->run_parts[i], 1);
                matters |= tr_event_time_drain_matters(T->et, L->run_parts[i]);
            }
        }
        if (matters)
            trl_et_check(L, t);
    }
    trl_et_sync(L, T); /* what tr_loop_event_seen_run left to the run's end */
    /* ended by tr_loop_run_yield (a barrier or a stop), not by a failure, a request
     * or its end: the task keeps its turn (trl_carry) */
    int cut =
        !escape && consumed == completed && consumed < L->run_count && !(requests & TR_REQ_MASK);
    T->run_left = cut ? run_quota(T) - consumed : 0; /* consumed < run_count <= quota */
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
        trl_apply_requests(L, t, requests);
    }
    if (cut && !T->halted && !T->in_ready)
        trl_carry(L, t);
    else
        trl_maybe_ready(L, t);
    trl_maybe_control(L, t);
    return TR_OK;
}

tr_status tr_loop_run_done(tr_loop *L, uint32_t t, uint32_t consumed, uint32_t completed,
                           uint32_t requests) {
    return finish_run(L, t, consumed, completed, requests, 0, NULL);
}

tr_status tr_loop_run_escape(tr_loop *L, uint32_t t, uint32_t consumed, uint64_t *seq) {
    return finish_run(L, t, consumed, consumed ? consumed - 1 : 0, 0, 1, seq);
}

/* Any thread: resolve seq in the task's sequencer, then hand the completion to
 * the loop through the completion queue (the push notifies a parked loop). */
static tr_status complete_remote(tr_loop *L, uint32_t t, uint64_t seq, uint32_t flags) {
    if (t >= L->cfg.ntasks)
        return TR_EINVAL;
    tr_status st = tr_sequencer_complete(L->tasks[t].seq, seq, flags);
    if (st != TR_OK)
        return st;
    trl_cq_push(L, (tr_item){kt_word(CQ_DONE, t), seq});
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
    completion_seen(L, t, seq);
    return TR_OK;
}

tr_status tr_loop_fail(tr_loop *L, uint32_t t, uint64_t seq) {
    return complete_remote(L, t, seq, TR_SEQ_FAILED);
}
