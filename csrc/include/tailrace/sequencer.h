/* tailrace/sequencer.h: the per-task callback sequencer (SEMANTICS rules 2, 12, 15, 17, 18).
 *
 * Each task numbers its callbacks 0, 1, 2, ... in invocation order (acquire).
 * Completions of any outstanding sequence number arrive from any thread, in any
 * order (complete). The loop releases the contiguous completed prefix, in order
 * (release). A completion carrying TR_SEQ_COMMIT ends a release batch right after
 * itself, so a commit can cover exactly the prefix up to it (rule 15); the next
 * release call continues past it. A failed completion (TR_SEQ_FAILED) is never
 * released and blocks everything after it (rule 18).
 *
 * Storage: a ring of completion slots, its size the next power of two >= max
 * concurrency. Slot s % ring holds an atomic word packing the (truncated)
 * sequence number, a state (FREE / PENDING / DONE / FAILED) and the 16 flag bits.
 * complete() is one CAS from PENDING(seq) to DONE(seq, flags): exactly one of
 * any number of racing completions of one seq wins (rule 17); the losers get
 * TR_EALREADY. A seq that was never handed out gets TR_EUNKNOWN. No allocation
 * after create; O(1) amortised per completion.
 *
 * Threads: create/destroy/acquire/release/outstanding/next_seq from the owning
 * loop thread only. complete() from any thread, concurrently with everything.
 */
#ifndef TAILRACE_SEQUENCER_H
#define TAILRACE_SEQUENCER_H

#include <stddef.h>
#include <stdint.h>

#include "tailrace/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Completion flags (16 bits). Bits 8..15 are opaque to the sequencer and
 * passed through to release (the loop uses them for scopes of requests). */
#define TR_SEQ_COMMIT 0x0001u /* a commit was requested by this message: release stops after it */
#define TR_SEQ_FAILED 0x0002u /* the message failed: never released, blocks release */
#define TR_SEQ_USER_SHIFT 8
#define TR_SEQ_FLAGS_MASK 0xffffu

#define TR_SEQ_MAX_CONCURRENCY (1u << 20)

typedef struct tr_seq_release {
    uint64_t seq;   /* sequence number, contiguous across calls */
    uint64_t tag_a; /* as given to acquire (the loop: partition index) */
    uint64_t tag_b; /* as given to acquire (the loop: offset handle) */
    uint32_t flags; /* as given to complete */
} tr_seq_release;

typedef struct tr_sequencer tr_sequencer;

/* max_concurrency in 1..TR_SEQ_MAX_CONCURRENCY else TR_EINVAL; TR_ENOMEM. */
tr_status tr_sequencer_create(uint32_t max_concurrency, tr_sequencer **out);
void tr_sequencer_destroy(tr_sequencer *s);

/* Loop thread. Hands out the next sequence number, recording two opaque tags
 * with it. TR_EAGAIN when max_concurrency callbacks are outstanding (acquired,
 * not yet released). */
tr_status tr_sequencer_acquire(tr_sequencer *s, uint64_t tag_a, uint64_t tag_b, uint64_t *seq_out);

/* Any thread. Resolves one outstanding seq. flags: TR_SEQ_COMMIT, TR_SEQ_FAILED
 * and user bits. TR_OK (this call won), TR_EALREADY (already completed, failed
 * or released), TR_EUNKNOWN (never handed out), TR_EINVAL (flags outside mask). */
tr_status tr_sequencer_complete(tr_sequencer *s, uint64_t seq, uint32_t flags);

/* Loop thread. Releases up to max completions of the contiguous completed
 * prefix, in sequence order, into out; returns how many. Stops early right
 * after a completion carrying TR_SEQ_COMMIT, and before a failed one. */
size_t tr_sequencer_release(tr_sequencer *s, tr_seq_release *out, size_t max);

/* Loop thread. TR_EFAILED and the failed seq when the head of the window failed. */
tr_status tr_sequencer_head_failed(const tr_sequencer *s, uint64_t *seq_out);

/* Loop thread: acquired and not yet released. */
uint32_t tr_sequencer_outstanding(const tr_sequencer *s);
/* Loop thread: the seq the next acquire will hand out. */
uint64_t tr_sequencer_next_seq(const tr_sequencer *s);
/* Any thread: the first seq not yet released (everything below is released). */
uint64_t tr_sequencer_released_upto(const tr_sequencer *s);
uint32_t tr_sequencer_max_concurrency(const tr_sequencer *s);

#ifdef __cplusplus
}
#endif
#endif
