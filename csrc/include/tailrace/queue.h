/* tailrace/queue.h: bounded lock-free multi-producer / single-consumer queue.
 *
 * It carries input envelopes from consumer threads and completions from any
 * thread into the loop. Items are two 64-bit words (tr_item), copied in and out.
 *
 * Design (Vyukov's bounded queue, specialised to one consumer): a power-of-two
 * ring of cells, each with a sequence word. Cell i is free for the producer that
 * claims ticket t (t % capacity == i) when cell.seq == t, and holds an item for
 * the consumer at ticket t when cell.seq == t + 1. Producers claim tickets with a
 * CAS on `tail`; the consumer owns `head` alone, so popping needs no CAS.
 *
 * Invariants:
 *   - An item is visible to the consumer only after its cell's seq store
 *     (release) that the consumer's seq load (acquire) pairs with.
 *   - A cell is reused by a producer only after the consumer's seq store of
 *     t + capacity (release) that the producer's seq load (acquire) pairs with.
 *   - Per-producer order is preserved: one producer's tickets are increasing.
 *   - Nothing is dropped: a full queue returns TR_EAGAIN and stores nothing.
 *
 * Threads: *_mpsc from any number of threads concurrently; *_sc from the one
 * consumer thread only. tr_queue_size_approx from any thread (a snapshot).
 *
 * Blocking: every queue is attached to a tr_notifier (its own, or one shared by
 * several queues so the loop sleeps on all of them at once). Pushes notify it;
 * a notify costs one seq_cst load unless the consumer is asleep.
 */
#ifndef TAILRACE_QUEUE_H
#define TAILRACE_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "tailrace/notifier.h"
#include "tailrace/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_item {
    uint64_t a;
    uint64_t b;
} tr_item;

typedef struct tr_queue tr_queue;

/* capacity is rounded up to a power of two (>= 2). notifier may be NULL: the
 * queue then owns one. A shared notifier must outlive the queue.
 * TR_EINVAL if capacity is 0 or above 2^30; TR_ENOMEM. */
tr_status tr_queue_create(size_t capacity, tr_notifier *notifier, tr_queue **out);
void tr_queue_destroy(tr_queue *q);
size_t tr_queue_capacity(const tr_queue *q);
tr_notifier *tr_queue_notifier(tr_queue *q);

/* Any thread. TR_OK, or TR_EAGAIN when full. Notifies on success. */
tr_status tr_queue_try_push_mpsc(tr_queue *q, tr_item item);
/* Any thread. Pushes a prefix of items[0..n) (as many as fit, in order, as one
 * contiguous run of tickets); returns how many. One notify for the batch. */
size_t tr_queue_try_push_batch_mpsc(tr_queue *q, const tr_item *items, size_t n);

/* Consumer only. TR_OK, or TR_EAGAIN when empty. */
tr_status tr_queue_try_pop_sc(tr_queue *q, tr_item *out);
/* Consumer only. Pops up to max items in order; returns how many. */
size_t tr_queue_try_pop_batch_sc(tr_queue *q, tr_item *out, size_t max);
/* Consumer only. Spins briefly, then sleeps on the notifier until an item
 * arrives or timeout_ns passes (< 0: forever). TR_OK, TR_ETIMEDOUT. */
tr_status tr_queue_pop_wait_sc(tr_queue *q, tr_item *out, int64_t timeout_ns);
/* Consumer only: true when no item is ready at the head and no producer has
 * claimed a ticket that it has not yet published. A claimed-but-unpublished item
 * counts as not empty (a pop may still return TR_EAGAIN for a moment), so a
 * consumer that checks this after tr_notifier_prepare_wait never sleeps through
 * a push whose notify saw it awake. */
int tr_queue_empty_sc(const tr_queue *q);

/* Any thread: number of claimed tickets not yet popped (a racy snapshot). */
size_t tr_queue_size_approx(const tr_queue *q);

#ifdef __cplusplus
}
#endif
#endif
