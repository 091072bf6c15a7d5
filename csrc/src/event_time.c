/* event_time.c: the event-time watermark of one task (see tailrace/event_time.h). */
#include "tailrace/event_time.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "tailrace/atomics.h"

typedef struct et_part {
    int64_t max_ts; /* largest timestamp read, TR_ET_NONE before the first */
    /* tracking (tr_event_time_track): the largest timestamp handed to the task and how
     * many of its messages' calls returned, from the invoking thread (any), relaxed:
     * numbers only; read_n: messages read (loop thread) */
    _Atomic int64_t seen;
    _Atomic uint64_t done_n;
    uint64_t read_n;
    int64_t empty_since; /* when its current empty streak began (valid while empty) */
    uint8_t empty;       /* its last poll found nothing (or it was never read) */
    uint8_t ended;
} et_part;

struct tr_event_time {
    uint32_t n;
    int track;
    int64_t lag_ms, idle_ns;
    int64_t value; /* the largest watermark computed (loop thread) */
    /* `value` for any thread (tr_event_time_get): a single word, relaxed on both sides,
     * since a reader needs the number only, nothing written before it */
    _Atomic int64_t pub;
    et_part parts[];
};

tr_status tr_event_time_create(uint32_t npartitions, int64_t lag_ms, int64_t idle_ns,
                               int64_t start_ns, tr_event_time **out) {
    if (out == NULL || lag_ms < 0)
        return TR_EINVAL;
    tr_event_time *et = calloc(1, sizeof(*et) + (size_t)npartitions * sizeof(et_part));
    if (et == NULL)
        return TR_ENOMEM;
    et->n = npartitions;
    et->lag_ms = lag_ms;
    et->idle_ns = idle_ns;
    et->value = TR_ET_NONE;
    atomic_store_explicit(&et->pub, TR_ET_NONE, TR_RELAXED); /* before any reader has et */
    for (uint32_t p = 0; p < npartitions; p++) {
        /* never read: idle counted from the task's start (rule 33) */
        et_part *P = &et->parts[p];
        P->max_ts = TR_ET_NONE;
        P->empty_since = start_ns;
        P->empty = 1;
        atomic_store_explicit(&P->seen, TR_ET_NONE, TR_RELAXED); /* before any reader has et */
        atomic_store_explicit(&P->done_n, 0, TR_RELAXED);
    }
    *out = et;
    return TR_OK;
}

void tr_event_time_destroy(tr_event_time *et) {
    free(et);
}

/* tracking: every message read from P has been handed to the task and its call returned */
static int drained(const et_part *P) {
    return atomic_load_explicit(&P->done_n, TR_RELAXED) >= P->read_n; /* relaxed: a count */
}

static int part_ended(const tr_event_time *et, const et_part *P) {
    return P->ended && (!et->track || drained(P));
}

static int64_t part_mark(const tr_event_time *et, const et_part *P) {
    if (part_ended(et, P))
        return TR_ET_END;
    int64_t m = et->track ? atomic_load_explicit(&P->seen, TR_RELAXED) : P->max_ts;
    if (m == TR_ET_NONE)
        return TR_ET_NONE;
    /* saturating: a timestamp near INT64_MIN minus the lag stays above TR_ET_NONE */
    return m < TR_ET_NONE + 1 + et->lag_ms ? TR_ET_NONE + 1 : m - et->lag_ms;
}

int64_t tr_event_time_update(tr_event_time *et, int64_t now_ns) {
    int64_t min_active = TR_ET_END, max_idle = TR_ET_NONE;
    int any_open = 0, any_active = 0;
    for (uint32_t p = 0; p < et->n; p++) {
        const et_part *P = &et->parts[p];
        if (part_ended(et, P))
            continue;
        any_open = 1;
        int64_t m = part_mark(et, P);
        /* tracking: idle only once what was read has been handed to the task */
        if (et->idle_ns > 0 && P->empty && now_ns - P->empty_since >= et->idle_ns &&
            (!et->track || drained(P))) {
            if (m > max_idle)
                max_idle = m;
        } else {
            any_active = 1;
            if (m < min_active)
                min_active = m;
        }
    }
    int64_t v = !any_open ? TR_ET_END : any_active ? min_active : max_idle;
    if (v > et->value) {
        et->value = v;
        atomic_store_explicit(&et->pub, v, TR_RELAXED); /* pairs with tr_event_time_get */
    }
    return et->value;
}

tr_status tr_event_time_read(tr_event_time *et, uint32_t partition, int64_t max_ts,
                             int64_t now_ns) {
    return tr_event_time_read_n(et, partition, max_ts, 0, now_ns);
}

tr_status tr_event_time_read_n(tr_event_time *et, uint32_t partition, int64_t max_ts,
                               uint64_t count, int64_t now_ns) {
    if (partition >= et->n)
        return TR_EINVAL;
    et_part *P = &et->parts[partition];
    if (max_ts > P->max_ts)
        P->max_ts = max_ts;
    P->read_n += count;
    P->empty = 0;
    tr_event_time_update(et, now_ns);
    return TR_OK;
}

tr_status tr_event_time_empty(tr_event_time *et, uint32_t partition, int64_t now_ns) {
    if (partition >= et->n)
        return TR_EINVAL;
    et_part *P = &et->parts[partition];
    if (!P->empty) {
        P->empty = 1;
        P->empty_since = now_ns;
    }
    tr_event_time_update(et, now_ns);
    return TR_OK;
}

tr_status tr_event_time_ended(tr_event_time *et, uint32_t partition, int64_t now_ns) {
    if (partition >= et->n)
        return TR_EINVAL;
    et->parts[partition].ended = 1;
    tr_event_time_update(et, now_ns);
    return TR_OK;
}

void tr_event_time_floor(tr_event_time *et, int64_t floor) {
    if (floor > et->value) {
        et->value = floor;
        atomic_store_explicit(&et->pub, floor, TR_RELAXED); /* pairs with tr_event_time_get */
    }
}

int64_t tr_event_time_get(const tr_event_time *et) {
    /* relaxed: pairs with the stores in update/floor; a number only, nothing else read */
    return atomic_load_explicit(&et->pub, TR_RELAXED);
}

int64_t tr_event_time_partition(const tr_event_time *et, uint32_t partition) {
    if (partition >= et->n)
        return TR_ET_NONE;
    return part_mark(et, &et->parts[partition]);
}

void tr_event_time_track(tr_event_time *et) {
    et->track = 1;
}

int tr_event_time_tracking(const tr_event_time *et) {
    return et->track;
}

int tr_event_time_seen_moved(tr_event_time *et, uint32_t partition, int64_t ts) {
    if (partition >= et->n)
        return -1;
    et_part *P = &et->parts[partition];
    /* relaxed: numbers only. One task's messages are handed out one at a time (rule 21),
     * so the CAS loop rarely runs twice */
    int64_t seen = atomic_load_explicit(&P->seen, TR_RELAXED);
    while (ts > seen) {
        if (atomic_compare_exchange_weak_explicit(&P->seen, &seen, ts, TR_RELAXED, TR_RELAXED))
            return 1;
    }
    return 0;
}

int tr_event_time_seen_one(tr_event_time *et, uint32_t partition, int64_t ts) {
    et_part *P = &et->parts[partition];
    /* relaxed: numbers only; this thread is the only writer */
    if (ts <= atomic_load_explicit(&P->seen, TR_RELAXED))
        return 0;
    atomic_store_explicit(&P->seen, ts, TR_RELAXED);
    return 1;
}

tr_status tr_event_time_seen(tr_event_time *et, uint32_t partition, int64_t ts) {
    return tr_event_time_seen_moved(et, partition, ts) < 0 ? TR_EINVAL : TR_OK;
}

tr_status tr_event_time_done(tr_event_time *et, uint32_t partition) {
    return tr_event_time_done_n(et, partition, 1);
}

tr_status tr_event_time_done_n(tr_event_time *et, uint32_t partition, uint64_t n) {
    if (partition >= et->n)
        return TR_EINVAL;
    et_part *P = &et->parts[partition];
    atomic_fetch_add_explicit(&P->done_n, n, TR_RELAXED); /* a count */
    return TR_OK;
}

int tr_event_time_drain_matters(const tr_event_time *et, uint32_t partition) {
    const et_part *P = &et->parts[partition];
    return P->ended || P->empty;
}
