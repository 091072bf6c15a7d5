/* tailrace/notifier.h: an event count, the consumer's blocking wait.
 *
 * One consumer thread (the loop) sleeps on a notifier; any number of producer
 * threads notify it. Producers pay for a wake-up (mutex + condvar signal) only
 * when the consumer has announced that it is about to sleep; otherwise a notify
 * is one seq_cst load of the `sleeping` word (no syscall per message).
 *
 * Protocol (Dekker-style, the classic event count):
 *
 *   consumer:                               producer:
 *     key = tr_notifier_prepare_wait(n);      publish work (e.g. queue push)
 *     if (work available) {                   tr_notifier_notify(n);
 *         tr_notifier_cancel_wait(n);
 *     } else {
 *         tr_notifier_commit_wait(n, key, timeout);
 *     }
 *
 * Invariant: prepare_wait reads the epoch key and then stores `sleeping` = 1;
 * that store and the consumer's re-check of the work are ordered (seq_cst)
 * against the producer's publication and its load / exchange of `sleeping`
 * (seq_cst), so at least one side sees the other: either the consumer sees the
 * work and does not sleep, or the producer takes the 1 and bumps the epoch,
 * which makes commit_wait return (the futex wait compares the epoch with the
 * key atomically in the kernel; the fallback compares it under its mutex). A notify that lands
 * between prepare_wait and commit_wait changes the epoch, so commit_wait returns at once; a late
 * notify (one that took an earlier announcement) can neither clear a newer announcement nor hide
 * its bump from the newer key (see notifier.c), so no wake-up is lost.
 *
 * Threads: prepare/cancel/commit from the single consumer only; notify from any thread.
 */
#ifndef TAILRACE_NOTIFIER_H
#define TAILRACE_NOTIFIER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "tailrace/atomics.h"
#include "tailrace/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* On Linux the epoch is a futex word: notify is atomics plus one FUTEX_WAKE
 * syscall, with no lock, so it is async-signal-safe (tr_loop_stop may be called
 * from a signal handler). Elsewhere a mutex + condvar stand in (not signal-safe). */
#if defined(__linux__)
#define TR_NOTIFIER_FUTEX 1
#else
#define TR_NOTIFIER_FUTEX 0
#endif

typedef struct tr_notifier {
    _Alignas(TR_CACHELINE) _Atomic uint32_t sleeping; /* consumer intends to sleep */
    /* bumped by every wake-up; 32 bits (a futex word): a consumer would need 2^32
     * notifies between its prepare_wait and commit_wait to mistake the epoch */
    _Atomic uint32_t epoch;
    _Atomic uint64_t wakeups; /* count of slow-path notifies (metrics) */
#if !TR_NOTIFIER_FUTEX
    pthread_mutex_t mutex;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
#endif
} tr_notifier;

tr_status tr_notifier_init(tr_notifier *n);
void tr_notifier_destroy(tr_notifier *n);

/* Consumer: announce intent to sleep; returns the epoch key for commit_wait. */
uint64_t tr_notifier_prepare_wait(tr_notifier *n);
/* Consumer: work turned up after prepare_wait; do not sleep. */
void tr_notifier_cancel_wait(tr_notifier *n);
/* Consumer: sleep until notified after prepare_wait, or until timeout_ns passes
 * (timeout_ns < 0: no timeout). TR_OK when woken, TR_ETIMEDOUT on timeout. */
tr_status tr_notifier_commit_wait(tr_notifier *n, uint64_t key, int64_t timeout_ns);
/* Any thread: wake the consumer if it sleeps or is about to. Async-signal-safe
 * where TR_NOTIFIER_FUTEX is 1 (Linux). */
void tr_notifier_notify(tr_notifier *n);

#ifdef __cplusplus
}
#endif
#endif
