/* sequencer.c: the per-task callback sequencer described in tailrace/sequencer.h.
 *
 * Implementation notes beyond the header essay:
 *
 *   Slot word. bits 0..1 state, bits 2..17 flags, bits 18..63 the low 46 bits of
 *   the sequence number. A slot is reused for seq + ring only after seq has been
 *   released, and the window (next_seq - released_upto) never exceeds
 *   max_concurrency <= ring, so at most one live seq maps to a slot. A stale or
 *   duplicate complete() expects PENDING(its own seq); it cannot match a slot that
 *   moved on to DONE, FAILED or a later seq, so its CAS fails and it is classified.
 *   46 bits of seq means aliasing only after 2^46 callbacks of one task.
 *
 *   Who writes what. The loop thread writes tags, next_seq, released_upto and
 *   PENDING words (acquire). Completing threads write only the one CAS from
 *   PENDING to DONE/FAILED. The loop reads slots with acquire so that whatever a
 *   completing thread did before complete() happens-before the release batch that
 *   reports it (the loop then runs the commit/shutdown that completion asked for).
 *
 *   Classification of a lost CAS: seq >= next_seq means never handed out
 *   (TR_EUNKNOWN); otherwise it was handed out and resolved (TR_EALREADY), whether
 *   the slot still shows the resolution or it was released since.
 *
 *   Cost: acquire and complete are O(1); release is O(released) and each seq is
 *   released once, so everything is O(1) amortised. Nothing allocates after create.
 */
#include "tailrace/sequencer.h"

#include <stdlib.h>

#include "tailrace/atomics.h"

enum { SLOT_FREE = 0, SLOT_PENDING = 1, SLOT_DONE = 2, SLOT_FAILED = 3 };

#define SLOT_STATE_BITS 2
#define SLOT_FLAG_SHIFT SLOT_STATE_BITS
#define SLOT_SEQ_SHIFT (SLOT_FLAG_SHIFT + 16)
#define SLOT_STATE_MASK ((uint64_t)3)

_Static_assert(TR_SEQ_FLAGS_MASK == 0xffffu, "flags are packed into 16 bits of the slot word");
_Static_assert((TR_SEQ_MAX_CONCURRENCY & (TR_SEQ_MAX_CONCURRENCY - 1)) == 0,
               "the largest ring must be a power of two");

struct tr_sequencer {
    /* Completing threads read next_seq and CAS slots; keep the loop's own
     * bookkeeping off their line. */
    _Alignas(TR_CACHELINE) _Atomic uint64_t next_seq; /* loop writes; any thread reads */
    _Atomic uint64_t released_upto;                   /* loop writes; any thread reads */
    uint64_t mask;
    uint32_t max_concurrency;
    _Atomic uint64_t *slots; /* ring; completing threads CAS these */
    uint64_t *tag_a;         /* loop thread only */
    uint64_t *tag_b;         /* loop thread only */
};

static inline uint64_t slot_word(uint64_t seq, uint32_t flags, uint64_t state) {
    return (seq << SLOT_SEQ_SHIFT) | ((uint64_t)flags << SLOT_FLAG_SHIFT) | state;
}

static inline int slot_seq_matches(uint64_t word, uint64_t seq) {
    return (word >> SLOT_SEQ_SHIFT) == ((seq << SLOT_SEQ_SHIFT) >> SLOT_SEQ_SHIFT);
}

tr_status tr_sequencer_create(uint32_t max_concurrency, tr_sequencer **out) {
    tr_sequencer *s;
    uint64_t ring = 1, i;
    if (max_concurrency == 0 || max_concurrency > TR_SEQ_MAX_CONCURRENCY)
        return TR_EINVAL;
    while (ring < max_concurrency)
        ring <<= 1;
    s = aligned_alloc(TR_CACHELINE, sizeof(*s));
    if (s == NULL)
        return TR_ENOMEM;
    s->slots = malloc(ring * sizeof(*s->slots));
    s->tag_a = malloc(ring * sizeof(*s->tag_a));
    s->tag_b = malloc(ring * sizeof(*s->tag_b));
    if (s->slots == NULL || s->tag_a == NULL || s->tag_b == NULL) {
        free(s->slots);
        free(s->tag_a);
        free(s->tag_b);
        free(s);
        return TR_ENOMEM;
    }
    for (i = 0; i < ring; i++) {
        atomic_init(&s->slots[i], slot_word(0, 0, SLOT_FREE));
        s->tag_a[i] = s->tag_b[i] = 0;
    }
    atomic_init(&s->next_seq, 0);
    atomic_init(&s->released_upto, 0);
    s->mask = ring - 1;
    s->max_concurrency = max_concurrency;
    *out = s;
    return TR_OK;
}

void tr_sequencer_destroy(tr_sequencer *s) {
    if (s == NULL)
        return;
    free(s->slots);
    free(s->tag_a);
    free(s->tag_b);
    free(s);
}

tr_status tr_sequencer_acquire(tr_sequencer *s, uint64_t tag_a, uint64_t tag_b, uint64_t *seq_out) {
    /* relaxed: both words are written by this (the loop) thread only. */
    uint64_t next = atomic_load_explicit(&s->next_seq, TR_RELAXED);
    uint64_t done = atomic_load_explicit(&s->released_upto, TR_RELAXED);
    uint64_t i = next & s->mask;
    if (next - done >= s->max_concurrency)
        return TR_EAGAIN;
    s->tag_a[i] = tag_a;
    s->tag_b[i] = tag_b;
    /* release: a completer that learned `next` through any synchronising channel
     * sees PENDING(next); pairs with complete's acq_rel CAS. */
    atomic_store_explicit(&s->slots[i], slot_word(next, 0, SLOT_PENDING), TR_RELEASE);
    /* release: pairs with complete's acquire load when it classifies a lost CAS;
     * a seq read as handed out has its PENDING word already stored. */
    atomic_store_explicit(&s->next_seq, next + 1, TR_RELEASE);
    *seq_out = next;
    return TR_OK;
}

tr_status tr_sequencer_complete(tr_sequencer *s, uint64_t seq, uint32_t flags) {
    uint64_t expected, desired, state;
    if (flags & ~(uint32_t)TR_SEQ_FLAGS_MASK)
        return TR_EINVAL;
    if (TR_UNLIKELY(seq >> (64 - SLOT_SEQ_SHIFT)) &&
        /* acquire: pairs with acquire()'s release store of next_seq. */
        seq >= atomic_load_explicit(&s->next_seq, TR_ACQUIRE))
        return TR_EUNKNOWN; /* would alias a live slot's truncated seq */
    state = (flags & TR_SEQ_FAILED) ? SLOT_FAILED : SLOT_DONE;
    expected = slot_word(seq, 0, SLOT_PENDING);
    desired = slot_word(seq, flags, state);
    /* acq_rel on success: release pairs with the loop's acquire load in release(),
     * publishing the completer's prior writes; acquire pairs with acquire()'s
     * release store of PENDING. acquire on failure: the classification below reads
     * next_seq after seeing the slot. */
    if (atomic_compare_exchange_strong_explicit(&s->slots[seq & s->mask], &expected, desired,
                                                TR_ACQ_REL, TR_ACQUIRE))
        return TR_OK;
    /* acquire: pairs with acquire()'s release store; a seq below it was handed out. */
    if (seq >= atomic_load_explicit(&s->next_seq, TR_ACQUIRE))
        return TR_EUNKNOWN;
    return TR_EALREADY;
}

size_t tr_sequencer_release(tr_sequencer *s, tr_seq_release *out, size_t max) {
    /* relaxed: both words are written by this (the loop) thread only. */
    uint64_t head = atomic_load_explicit(&s->released_upto, TR_RELAXED);
    uint64_t next = atomic_load_explicit(&s->next_seq, TR_RELAXED);
    size_t n = 0;
    while (n < max && head < next) {
        uint64_t i = head & s->mask;
        /* acquire: pairs with the completer's CAS (release), so its writes before
         * complete() happen-before what the loop does with this release. */
        uint64_t word = atomic_load_explicit(&s->slots[i], TR_ACQUIRE);
        uint32_t flags = (uint32_t)(word >> SLOT_FLAG_SHIFT) & TR_SEQ_FLAGS_MASK;
        if ((word & SLOT_STATE_MASK) != SLOT_DONE || !slot_seq_matches(word, head))
            break; /* pending (a gap) or failed (rule 18): nothing past it moves */
        out[n].seq = head;
        out[n].tag_a = s->tag_a[i];
        out[n].tag_b = s->tag_b[i];
        out[n].flags = flags;
        n++;
        head++;
        if (flags & TR_SEQ_COMMIT)
            break; /* rule 15: the commit covers exactly the prefix up to here */
    }
    if (n > 0)
        /* release: pairs with acquire loads in tr_sequencer_released_upto (other
         * threads observing progress see the slots already consumed). */
        atomic_store_explicit(&s->released_upto, head, TR_RELEASE);
    return n;
}

tr_status tr_sequencer_head_failed(const tr_sequencer *s, uint64_t *seq_out) {
    /* relaxed: both words are written by this (the loop) thread only. */
    uint64_t head = atomic_load_explicit(&s->released_upto, TR_RELAXED);
    uint64_t next = atomic_load_explicit(&s->next_seq, TR_RELAXED);
    uint64_t word;
    if (head >= next)
        return TR_OK;
    /* acquire: pairs with the failing completer's CAS (release). */
    word = atomic_load_explicit(&s->slots[head & s->mask], TR_ACQUIRE);
    if ((word & SLOT_STATE_MASK) == SLOT_FAILED && slot_seq_matches(word, head)) {
        if (seq_out != NULL)
            *seq_out = head;
        return TR_EFAILED;
    }
    return TR_OK;
}

uint32_t tr_sequencer_outstanding(const tr_sequencer *s) {
    /* relaxed: both words are written by this (the loop) thread only. */
    return (uint32_t)(atomic_load_explicit(&s->next_seq, TR_RELAXED) -
                      atomic_load_explicit(&s->released_upto, TR_RELAXED));
}

uint64_t tr_sequencer_next_seq(const tr_sequencer *s) {
    /* relaxed: written by this (the loop) thread only. */
    return atomic_load_explicit(&s->next_seq, TR_RELAXED);
}

uint64_t tr_sequencer_released_upto(const tr_sequencer *s) {
    /* acquire: pairs with release()'s release store. */
    return atomic_load_explicit(&s->released_upto, TR_ACQUIRE);
}

uint32_t tr_sequencer_max_concurrency(const tr_sequencer *s) {
    return s->max_concurrency;
}
