/* queue.c: the bounded MPSC ring described in tailrace/queue.h.
 *
 * Implementation notes beyond the header essay:
 *
 *   Tickets. `tail` is the next ticket a producer may claim; `head` the next ticket
 *   the consumer pops. Cell t & mask is free for ticket t when its seq == t and
 *   full for ticket t when its seq == t + 1; popping t stores t + capacity, which
 *   frees the cell for the producer one lap later. Tickets are 64-bit and never
 *   wrap in practice, so seq comparisons are plain signed differences.
 *
 *   Batch push. If the cell of ticket t + k - 1 is free for that ticket, the
 *   consumer has popped ticket t + k - 1 - capacity, hence every earlier ticket,
 *   so all of t .. t + k - 1 are free. A producer therefore counts the free run
 *   from the current tail and claims it with one CAS of tail from t to t + k.
 *
 *   Wake-ups. The tail CAS is a seq_cst read-modify-write and counts as the
 *   "publication" of the notifier protocol: the consumer, after prepare_wait,
 *   treats a claimed-but-unpublished ticket (tail != head) as work and does not
 *   sleep. A producer's notify is then one seq_cst load of `sleeping` after its
 *   CAS; no fence is needed after the cell's release store.
 *
 *   Layout. The consumer's line (head) and the producers' line (tail) are apart,
 *   and the read-mostly fields sit on a third line. Cells are 32 bytes (seq, item,
 *   pad): two per cache line, never straddling one, so a pop touches one line.
 */
#include "tailrace/queue.h"

#include <sched.h>
#include <stdlib.h>

#include "tailrace/atomics.h"
#include "tailrace/clock.h"

#define TR_QUEUE_MAX_CAPACITY ((size_t)1 << 30)
/* pop_wait busy-polls this many times before parking on the notifier. */
#define TR_QUEUE_SPIN 256

typedef struct tr_cell {
    _Atomic uint64_t seq;
    tr_item item;
    uint64_t pad; /* keeps cells a power of two in size: none crosses a line */
} tr_cell;

_Static_assert(sizeof(tr_cell) == 32, "a cell must be 32 bytes");
_Static_assert((TR_CACHELINE % sizeof(tr_cell)) == 0, "cells must not straddle cache lines");
_Static_assert((TR_CACHELINE & (TR_CACHELINE - 1)) == 0, "cache line size is a power of two");

struct tr_queue {
    _Alignas(TR_CACHELINE) _Atomic uint64_t head; /* written by the consumer only */
    char pad_head[TR_CACHELINE - sizeof(uint64_t)];
    _Alignas(TR_CACHELINE) _Atomic uint64_t tail; /* producers CAS it */
    char pad_tail[TR_CACHELINE - sizeof(uint64_t)];
    _Alignas(TR_CACHELINE) uint64_t mask; /* read-only after create */
    tr_cell *cells;
    tr_notifier *notifier;
    tr_notifier own_notifier;
    int owns_notifier;
};

_Static_assert(offsetof(struct tr_queue, tail) - offsetof(struct tr_queue, head) >= TR_CACHELINE,
               "head and tail must be on separate cache lines");
_Static_assert(offsetof(struct tr_queue, mask) - offsetof(struct tr_queue, tail) >= TR_CACHELINE,
               "tail and the read-only fields must be on separate cache lines");

static size_t round_pow2(size_t n) {
    size_t p = 2;
    while (p < n)
        p <<= 1;
    return p;
}

tr_status tr_queue_create(size_t capacity, tr_notifier *notifier, tr_queue **out) {
    tr_queue *q;
    size_t cap, i;
    if (capacity == 0 || capacity > TR_QUEUE_MAX_CAPACITY)
        return TR_EINVAL;
    cap = round_pow2(capacity);
    q = aligned_alloc(TR_CACHELINE, sizeof(*q));
    if (q == NULL)
        return TR_ENOMEM;
    q->cells = aligned_alloc(TR_CACHELINE, cap * sizeof(tr_cell));
    if (q->cells == NULL) {
        free(q);
        return TR_ENOMEM;
    }
    for (i = 0; i < cap; i++) {
        atomic_init(&q->cells[i].seq, i);
        q->cells[i].item.a = q->cells[i].item.b = 0;
        q->cells[i].pad = 0;
    }
    atomic_init(&q->head, 0);
    atomic_init(&q->tail, 0);
    q->mask = cap - 1;
    q->owns_notifier = notifier == NULL;
    if (q->owns_notifier) {
        if (tr_notifier_init(&q->own_notifier) != TR_OK) {
            free(q->cells);
            free(q);
            return TR_ESYS;
        }
        notifier = &q->own_notifier;
    }
    q->notifier = notifier;
    *out = q;
    return TR_OK;
}

void tr_queue_destroy(tr_queue *q) {
    if (q == NULL)
        return;
    if (q->owns_notifier)
        tr_notifier_destroy(&q->own_notifier);
    free(q->cells);
    free(q);
}

size_t tr_queue_capacity(const tr_queue *q) {
    return (size_t)q->mask + 1;
}

tr_notifier *tr_queue_notifier(tr_queue *q) {
    return q->notifier;
}

tr_status tr_queue_try_push_mpsc(tr_queue *q, tr_item item) {
    tr_cell *cell;
    /* relaxed: only a hint; the CAS below validates it. */
    uint64_t pos = atomic_load_explicit(&q->tail, TR_RELAXED);
    for (;;) {
        cell = &q->cells[pos & q->mask];
        /* acquire: pairs with the consumer's release store of pos when it popped the
         * previous lap's item, so our item write cannot race with its read. */
        uint64_t seq = atomic_load_explicit(&cell->seq, TR_ACQUIRE);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            /* seq_cst: the publication side of the notifier protocol, against the
             * consumer's seq_cst load of tail after prepare_wait. */
            if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + 1, TR_SEQ_CST,
                                                      TR_RELAXED))
                break;
        } else if (dif < 0) {
            return TR_EAGAIN; /* the cell still holds last lap's item: full */
        } else {
            /* relaxed: another producer took this ticket; re-read the claim point. */
            pos = atomic_load_explicit(&q->tail, TR_RELAXED);
        }
    }
    cell->item = item;
    /* release: pairs with the consumer's acquire load of seq before it reads the item. */
    atomic_store_explicit(&cell->seq, pos + 1, TR_RELEASE);
    tr_notifier_notify(q->notifier);
    return TR_OK;
}

size_t tr_queue_try_push_batch_mpsc(tr_queue *q, const tr_item *items, size_t n) {
    uint64_t pos, k, i;
    if (n == 0)
        return 0;
    /* relaxed: only a hint; the CAS below validates it. */
    pos = atomic_load_explicit(&q->tail, TR_RELAXED);
    for (;;) {
        uint64_t cap = q->mask + 1;
        uint64_t want = n < cap ? n : cap;
        /* Count the free run from pos; its last cell being free implies the rest are
         * (see the essay above), but counting from the front stops at the first busy one. */
        for (k = 0; k < want; k++) {
            /* acquire: pairs with the consumer's release store freeing this cell. */
            uint64_t seq = atomic_load_explicit(&q->cells[(pos + k) & q->mask].seq, TR_ACQUIRE);
            if (seq != pos + k)
                break;
        }
        if (k == 0) {
            uint64_t seq = atomic_load_explicit(&q->cells[pos & q->mask].seq, TR_ACQUIRE);
            if ((int64_t)(seq - pos) < 0)
                return 0; /* full */
            /* relaxed: the ticket moved on; re-read the claim point. */
            pos = atomic_load_explicit(&q->tail, TR_RELAXED);
            continue;
        }
        /* seq_cst: the publication side of the notifier protocol (see essay). */
        if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + k, TR_SEQ_CST, TR_RELAXED))
            break;
    }
    for (i = 0; i < k; i++) {
        tr_cell *cell = &q->cells[(pos + i) & q->mask];
        cell->item = items[i];
        /* release: pairs with the consumer's acquire load of seq before it reads the item. */
        atomic_store_explicit(&cell->seq, pos + i + 1, TR_RELEASE);
    }
    tr_notifier_notify(q->notifier);
    return (size_t)k;
}

tr_status tr_queue_try_pop_sc(tr_queue *q, tr_item *out) {
    /* relaxed: only this thread writes head. */
    uint64_t pos = atomic_load_explicit(&q->head, TR_RELAXED);
    tr_cell *cell = &q->cells[pos & q->mask];
    /* acquire: pairs with the producer's release store after it wrote the item. */
    if (atomic_load_explicit(&cell->seq, TR_ACQUIRE) != pos + 1)
        return TR_EAGAIN;
    *out = cell->item;
    /* release: pairs with the producer's acquire load of seq next lap, ordering our
     * read of the item before its overwrite. */
    atomic_store_explicit(&cell->seq, pos + q->mask + 1, TR_RELEASE);
    /* relaxed: head is read by others only as a size snapshot. */
    atomic_store_explicit(&q->head, pos + 1, TR_RELAXED);
    return TR_OK;
}

size_t tr_queue_try_pop_batch_sc(tr_queue *q, tr_item *out, size_t max) {
    /* relaxed: only this thread writes head. */
    uint64_t pos = atomic_load_explicit(&q->head, TR_RELAXED);
    size_t n;
    for (n = 0; n < max; n++) {
        tr_cell *cell = &q->cells[(pos + n) & q->mask];
        /* acquire: pairs with the producer's release store after it wrote the item. */
        if (atomic_load_explicit(&cell->seq, TR_ACQUIRE) != pos + n + 1)
            break;
        out[n] = cell->item;
        /* release: pairs with the producer's acquire load of seq next lap. */
        atomic_store_explicit(&cell->seq, pos + n + q->mask + 1, TR_RELEASE);
    }
    if (n > 0)
        /* relaxed: head is read by others only as a size snapshot. */
        atomic_store_explicit(&q->head, pos + n, TR_RELAXED);
    return n;
}

int tr_queue_empty_sc(const tr_queue *q) {
    /* relaxed: only this thread writes head. */
    uint64_t pos = atomic_load_explicit(&q->head, TR_RELAXED);
    /* acquire: pairs with the producer's release store of a published item. */
    if (atomic_load_explicit(&q->cells[pos & q->mask].seq, TR_ACQUIRE) == pos + 1)
        return 0;
    /* seq_cst: the other side of a producer's seq_cst tail CAS. After
     * tr_notifier_prepare_wait this load and the producer's load of `sleeping`
     * cannot both miss; a claimed but unpublished ticket counts as not empty, so
     * the consumer does not sleep through it. */
    return atomic_load_explicit(&q->tail, TR_SEQ_CST) == pos;
}

tr_status tr_queue_pop_wait_sc(tr_queue *q, tr_item *out, int64_t timeout_ns) {
    int64_t deadline = timeout_ns >= 0 ? tr_now_ns() + timeout_ns : -1;
    for (;;) {
        int spin;
        for (spin = 0; spin < TR_QUEUE_SPIN; spin++) {
            if (tr_queue_try_pop_sc(q, out) == TR_OK)
                return TR_OK;
            tr_cpu_relax();
        }
        int64_t left = -1;
        if (deadline >= 0) {
            left = deadline - tr_now_ns();
            if (left <= 0)
                return tr_queue_try_pop_sc(q, out) == TR_OK ? TR_OK : TR_ETIMEDOUT;
        }
        uint64_t key = tr_notifier_prepare_wait(q->notifier);
        if (!tr_queue_empty_sc(q)) {
            tr_notifier_cancel_wait(q->notifier);
            /* A producer may sit between its CAS and its publish; let it run. */
            if (tr_queue_try_pop_sc(q, out) == TR_OK)
                return TR_OK;
            sched_yield();
            continue;
        }
        tr_notifier_commit_wait(q->notifier, key, left);
    }
}

size_t tr_queue_size_approx(const tr_queue *q) {
    /* relaxed: a snapshot; the two loads are not consistent with each other. */
    uint64_t head = atomic_load_explicit(&q->head, TR_RELAXED);
    uint64_t tail = atomic_load_explicit(&q->tail, TR_RELAXED);
    return tail > head ? (size_t)(tail - head) : 0;
}
