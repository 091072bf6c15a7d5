/* loop_input.c: the per-partition input rings (rule 6): refills, growth up
 * to the input buffer, reader states and wake-ups; and taking a task's next
 * message out of them with its sequence number (round robin, rule 5; the
 * keyed look-ahead, rules 30, 31).
 *
 * Layer 3 (see loop_internal.h): calls loop_timers.c (a callback timeout is
 * armed when a message is taken), loop_state.c and loop.c (a wake-up's
 * completion-queue item). */
#include "loop_internal.h"

/* Make room in P's ring for n more items (the caller checked the limit). A
 * keyed ring keeps its slots from kbase on (see part.kbase). */
static tr_status ring_room(part *P, int keyed, uint64_t n) {
    uint64_t from = keyed ? P->kbase : P->head;
    uint64_t used = P->tail - from;
    if (used + n <= (uint64_t)P->mask + 1)
        return TR_OK;
    uint32_t size = pow2_at_least(used + n);
    uint64_t *items = malloc((size_t)size * sizeof *items);
    uint64_t *handles = malloc((size_t)size * sizeof *handles);
    uint64_t *khash = keyed ? malloc((size_t)size * sizeof *khash) : NULL;
    uint8_t *kst = keyed ? calloc(size, 1) : NULL;
    if (!items || !handles || (keyed && (!khash || !kst))) {
        free(items);
        free(handles);
        free(khash);
        free(kst);
        return TR_ENOMEM;
    }
    for (uint64_t pos = from; pos != P->tail; pos++) {
        items[pos & (size - 1)] = P->items[pos & P->mask];
        handles[pos & (size - 1)] = P->handles[pos & P->mask];
        if (keyed) {
            khash[pos & (size - 1)] = P->khash[pos & P->mask];
            kst[pos & (size - 1)] = P->kst[pos & P->mask];
        }
    }
    free(P->items);
    free(P->handles);
    P->items = items;
    P->handles = handles;
    if (keyed) {
        free(P->khash);
        free(P->kst);
        P->khash = khash;
        P->kst = kst;
    }
    P->mask = size - 1;
    return TR_OK;
}

tr_status tr_loop_push_input(tr_loop *L, uint32_t t, uint32_t p, uint64_t item, uint64_t handle) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return TR_EINVAL;
    task *T = &L->tasks[t];
    part *P = &T->parts[p];
    if (T->keyed)
        return TR_EINVAL; /* keyed tasks: tr_loop_push_inputs_keyed */
    if (P->tail - P->head + P->lent >= P->limit)
        return TR_EAGAIN; /* (messages out on a worker still count: rule 6) */
    if (ring_room(P, 0, 1) != TR_OK)
        return TR_ENOMEM;
    P->items[P->tail & P->mask] = item;
    P->handles[P->tail & P->mask] = handle;
    P->tail++;
    atomic_store_explicit(&P->read_count, P->tail, TR_RELAXED); /* metrics snapshot */
    T->buffered++;
    trl_maybe_ready(L, t);
    return TR_OK;
}

tr_status tr_loop_push_inputs(tr_loop *L, uint32_t t, uint32_t p, const uint64_t *items,
                              const uint64_t *handles, size_t n) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return TR_EINVAL;
    task *T = &L->tasks[t];
    part *P = &T->parts[p];
    if (T->keyed)
        return TR_EINVAL; /* keyed tasks: tr_loop_push_inputs_keyed */
    if (n > P->limit - (P->tail - P->head + P->lent))
        return TR_EAGAIN; /* (messages out on a worker still count: rule 6) */
    if (ring_room(P, 0, n) != TR_OK)
        return TR_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        P->items[(P->tail + i) & P->mask] = items[i];
        P->handles[(P->tail + i) & P->mask] = handles[i];
    }
    P->tail += n;
    atomic_store_explicit(&P->read_count, P->tail, TR_RELAXED); /* metrics snapshot */
    T->buffered += n;
    if (n)
        trl_maybe_ready(L, t);
    return TR_OK;
}

tr_status tr_loop_push_inputs_keyed(tr_loop *L, uint32_t t, uint32_t p, const uint64_t *items,
                                    const uint64_t *handles, const uint64_t *hashes, size_t n) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts || !L->tasks[t].keyed)
        return TR_EINVAL;
    task *T = &L->tasks[t];
    part *P = &T->parts[p];
    /* dispatched messages not yet past the watermark still count (rule 31) */
    if (n > P->limit - part_used(P, 1))
        return TR_EAGAIN;
    if (ring_room(P, 1, n) != TR_OK)
        return TR_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = (uint32_t)((P->tail + i) & P->mask);
        P->items[s] = items[i];
        P->handles[s] = handles[i];
        P->khash[s] = hashes[i];
        P->kst[s] = 0;
    }
    P->tail += n;
    atomic_store_explicit(&P->read_count, P->tail, TR_RELAXED); /* metrics snapshot */
    T->buffered += n;
    if (n) {
        T->kblocked = 0; /* a new message may have a free key */
        trl_maybe_ready(L, t);
        /* read on while there is room: a task whose buffered keys are all busy
         * dispatches nothing, so no dispatch would queue the next refill, and a
         * later message with a free key would wait for a completion (rule 30).
         * Up to the whole buffer, not half of it: the look-ahead is the buffer
         * (rule 31), counted from the watermark, where messages completed behind
         * a slow one keep their slots; a partition left with no refill queued
         * above half of it read nothing more until that slow one completed (a
         * wake-up finds the partition active and queues nothing) */
        if (part_used(P, 1) < P->fill)
            trl_queue_refill(L, t, p);
    }
    return TR_OK;
}

void tr_loop_partition_state(tr_loop *L, uint32_t t, uint32_t p, int state) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return;
    task *T = &L->tasks[t];
    part *P = &T->parts[p];
    if (P->state == TR_PART_ENDED)
        return;
    /* every empty poll: idleness is a matter of how long ago its empty streak began */
    trl_et_sync(L, T); /* what the partitions reached before this change */
    tr_status st = TR_OK;
    if (state == TR_PART_IDLE)
        st = tr_event_time_empty(T->et, p, trl_now(L));
    else if (state == TR_PART_ENDED)
        st = tr_event_time_ended(T->et, p, trl_now(L));
    if (TR_UNLIKELY(st != TR_OK) && L->internal == TR_OK) /* p < nparts: cannot happen */
        L->internal = st;
    trl_et_check(L, t); /* idleness or an end may have moved the watermark */
    if (P->state == state)
        return;
    if (P->state == TR_PART_IDLE)
        L->nidle--;
    P->state = (uint8_t)state;
    if (state == TR_PART_IDLE) {
        if (L->nidle++ == 0)
            L->next_idle_poll = trl_now(L) + L->cfg.max_idle_ns;
    } else if (state == TR_PART_ENDED) {
        if (++T->nended == T->nparts)
            trl_eos_gate(L, t);
        trl_maybe_control(L, t);
    } else {
        trl_queue_refill(L, t, p);
    }
}

tr_status tr_loop_event_time_read(tr_loop *L, uint32_t t, uint32_t p, int64_t max_ts,
                                  uint64_t count) {
    if (t >= L->cfg.ntasks)
        return TR_EINVAL;
    trl_et_sync(L, &L->tasks[t]); /* what the partitions reached before this read */
    tr_status st = tr_event_time_read_n(L->tasks[t].et, p, max_ts, count, trl_now(L));
    trl_et_check(L, t);
    return st;
}

tr_status tr_loop_partition_fill(tr_loop *L, uint32_t t, uint32_t p, uint32_t fill) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return TR_EINVAL;
    part *P = &L->tasks[t].parts[p];
    P->fill = fill < 1 ? 1 : fill > P->limit ? P->limit : fill;
    /* the ring grows to the new fill on the next push (ring_room) */
    if (P->state == TR_PART_ACTIVE && part_used(P, L->tasks[t].keyed) <= P->fill / 2)
        trl_queue_refill(L, t, p);
    return TR_OK;
}

void tr_loop_wake_partition(tr_loop *L, uint32_t t, uint32_t p) {
    if (t >= L->cfg.ntasks || p >= L->tasks[t].nparts)
        return;
    part *P = &L->tasks[t].parts[p];
    /* acq_rel: pairs with the loop's exchange in drain_completions */
    if (atomic_exchange_explicit(&P->woken, 1, TR_ACQ_REL))
        return;
    trl_cq_push(L, (tr_item){kt_word(CQ_WAKE, t), p});
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

/* TR_TASK_KEYED: the first buffered message whose key is free, looking ahead
 * at most each partition's ring (rule 31), partitions round robin (rule 5).
 * Scanning in offset order and marking a key busy as soon as one of its
 * messages is dispatched keeps one key's messages in offset order: an earlier
 * message of a key is skipped only while that key is busy, and
 * then every later one of that key is skipped too (rule 30). 0: none. */
static int key_pick(task *T, uint32_t *p_out, uint64_t *pos_out) {
    uint32_t p = T->rr;
    /* a pool task's one worker runs what it is handed one at a time, in that
     * order: handed over in offset order, one key's messages complete in order
     * with one outstanding at a time, and nothing is ever taken ahead (a stop
     * that hands queued ops back leaves a plain tail, so its state commits) */
    int pool = (T->flags & TR_TASK_POOL) != 0;
    for (uint32_t i = 0; i < T->nparts; i++, p = (p + 1 == T->nparts) ? 0 : p + 1) {
        const part *P = &T->parts[p];
        for (uint64_t pos = P->head; pos != P->tail; pos++) {
            uint32_t s = (uint32_t)(pos & P->mask);
            if (P->kst[s] & KS_TAKEN)
                continue;
            if (!pool && key_busy(T, P->khash[s])) {
                if (T->kcatchup)
                    break; /* only the head (never a taken slot) while catching up */
                continue;
            }
            *p_out = p;
            *pos_out = pos;
            T->rr = (p + 1 == T->nparts) ? 0 : p + 1;
            return 1;
        }
    }
    return 0;
}

/* The keyed take: mark the message taken and its key busy; the ring keeps
 * the slot until the watermark passes it (release_task). */
static uint64_t take_keyed(tr_loop *L, uint32_t t, uint32_t *part_out, uint64_t *item_out,
                           uint64_t *handle_out) {
    task *T = &L->tasks[t];
    uint32_t p;
    uint64_t pos;
    if (!key_pick(T, &p, &pos)) {
        T->kblocked = 1; /* every buffered key is busy: wait for a completion */
        /* and read on while a buffer has room: the look-ahead is the whole buffer
         * (rule 31), not the half that refills wait for, also when messages
         * arrive one at a time */
        for (uint32_t q = 0; q < T->nparts; q++) {
            part *Q = &T->parts[q];
            if (Q->state == TR_PART_ACTIVE && part_used(Q, 1) < Q->fill)
                trl_queue_refill(L, t, q);
        }
        return TR_NO_SEQ;
    }
    part *P = &T->parts[p];
    uint32_t s = (uint32_t)(pos & P->mask);
    uint64_t item = P->items[s];
    uint64_t handle = P->handles[s];
    uint64_t h = P->khash[s];
    P->kst[s] = KS_TAKEN;
    if (pos != P->head)
        T->kahead++;
    key_hold(T, h);
    kinflight_add(T, 1);
    if (pos == P->head) {
        P->head++;
        while (P->head != P->tail && (P->kst[P->head & P->mask] & KS_TAKEN)) {
            P->head++;
            T->kahead--; /* taken ahead before; head has caught up with it */
        }
        if (T->kcatchup && T->kahead == 0) {
            /* nothing taken ahead any more: the commit that found some can write once
             * what is outstanding is released (tr_loop_task_settled); no more is
             * dispatched to T meanwhile (runnable, trl_dispatch_pool) */
            T->kcatchup = 0;
            T->commit_due = 1;
        }
    }
    T->buffered--;
    uint64_t seq = 0;
    /* the caller checked outstanding < limit (see trl_take_one) */
    tr_status st = tr_sequencer_acquire(T->seq, pos, handle, &seq);
    if (TR_UNLIKELY(st != TR_OK) && L->internal == TR_OK)
        L->internal = st;
    T->spart[seq & T->smask] = p;
    T->skey[seq & T->smask] = h;
    atomic_store_explicit(&T->sdisp[seq & T->smask], L->now, TR_RELAXED); /* metric */
    T->acquired++;
    bump(&T->processed);
    bump(&L->chosen);
    if (T->infl)
        trl_arm_timeout(L, t, seq, handle, p);
    *part_out = p;
    *item_out = item;
    *handle_out = handle;
    return seq;
}

/* Pop T's next message (round robin over its partitions) and acquire its seq.
 * TR_NO_SEQ only for a keyed task whose buffered keys are all busy. */
uint64_t trl_take_one(tr_loop *L, uint32_t t, uint32_t *part_out, uint64_t *item_out,
                      uint64_t *handle_out) {
    task *T = &L->tasks[t];
    if (T->keyed)
        return take_keyed(L, t, part_out, item_out, handle_out);
    uint32_t p = next_part(T);
    part *P = &T->parts[p];
    uint64_t pos = P->head;
    uint64_t item = P->items[pos & P->mask];
    uint64_t handle = P->handles[pos & P->mask];
    P->head++;
    T->buffered--;
    uint64_t seq = 0;
    /* cannot fail: the caller checked outstanding < limit */
    /* the caller checked outstanding < limit, so this cannot fail; if it did, the
     * loop stops with the status rather than run a message with no seq */
    tr_status st = tr_sequencer_acquire(T->seq, pos, handle, &seq);
    if (TR_UNLIKELY(st != TR_OK) && L->internal == TR_OK)
        L->internal = st;
    T->spart[seq & T->smask] = p;
    T->acquired++;
    bump(&T->processed);
    bump(&L->chosen);
    if (T->infl)
        trl_arm_timeout(L, t, seq, handle, p);
    if (T->flags & TR_TASK_POOL)
        P->lent++;
    if (P->tail - P->head + P->lent <= P->fill / 2)
        trl_queue_refill(L, t, p);
    *part_out = p;
    *item_out = item;
    *handle_out = handle;
    return seq;
}
