/* notifier.c: the event count described in tailrace/notifier.h.
 *
 * Implementation notes beyond the header essay:
 *   - Every access to `sleeping` is seq_cst, so all of them sit in one total
 *     order consistent with its modification order; the arguments below are
 *     about that order.
 *   - prepare_wait reads the epoch key BEFORE it stores sleeping = 1. A notify
 *     takes the 1 with an exchange (so exactly one notifier pays the mutex for
 *     each announcement) and bumps the epoch only after that exchange. If the
 *     consumer's key already includes that bump, the exchange came before the
 *     consumer's store of 1 (the bump happens-before the key load, which is
 *     sequenced before the store), so the store's 1 survives and the next
 *     producer sees it. If the key does not include the bump, commit_wait sees
 *     the epoch differ and returns. Either way no announcement is swallowed.
 *     (The old order, store then load, let a late notify clear the new 1 and
 *     bump the epoch before the key was read: the consumer slept with
 *     sleeping == 0 and no later notify woke it: the lost wake-up of issue 13.)
 *   - commit_wait's check-then-wait is atomic with respect to a notify: the
 *     futex wait sleeps only if the epoch still equals the key when the kernel
 *     looks (a bump before that returns EAGAIN at once; a bump after it is
 *     followed by the FUTEX_WAKE); the fallback bumps and compares under its
 *     mutex.
 *   - Spurious wake-ups are allowed by the contract: the consumer re-checks work.
 */
#define _GNU_SOURCE /* syscall */
#include "tailrace/notifier.h"

#include <errno.h>
#include <stdint.h>
#include <time.h>

#include "tailrace/clock.h"

#if TR_NOTIFIER_FUTEX
/* notify from a signal handler: every atomic it touches must be lock-free */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

tr_status tr_notifier_init(tr_notifier *n) {
    atomic_init(&n->sleeping, 0);
    atomic_init(&n->epoch, 0);
    atomic_init(&n->wakeups, 0);
#if !TR_NOTIFIER_FUTEX
    pthread_condattr_t attr;
    if (pthread_mutex_init(&n->mutex, NULL) != 0)
        return TR_ESYS;
    if (pthread_condattr_init(&attr) != 0)
        goto fail_mutex;
    /* Timeouts are computed from tr_now_ns, so the condvar must use the same clock. */
    if (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&n->cond, &attr) != 0) {
        pthread_condattr_destroy(&attr);
        goto fail_mutex;
    }
    pthread_condattr_destroy(&attr);
    return TR_OK;
fail_mutex:
    pthread_mutex_destroy(&n->mutex);
    return TR_ESYS;
#else
    return TR_OK;
#endif
}

void tr_notifier_destroy(tr_notifier *n) {
#if !TR_NOTIFIER_FUTEX
    pthread_cond_destroy(&n->cond);
    pthread_mutex_destroy(&n->mutex);
#else
    (void)n; /* nothing to release */
#endif
}

uint64_t tr_notifier_prepare_wait(tr_notifier *n) {
    /* acquire: pairs with notify's release bump; if we read a bumped epoch, that
     * producer's publication happens-before our re-check of work. Read before
     * the store below (see the notes at the top). */
    uint64_t key = atomic_load_explicit(&n->epoch, TR_ACQUIRE);
    /* seq_cst: ordered before the caller's seq_cst re-check of work and against
     * the producer's seq_cst publication + exchange of `sleeping` (header protocol). */
    atomic_store_explicit(&n->sleeping, 1, TR_SEQ_CST);
    return key;
}

void tr_notifier_cancel_wait(tr_notifier *n) {
    /* seq_cst: keeps every access to `sleeping` in the one total order the
     * protocol argues about; the consumer is awake and re-checks before it
     * announces again. */
    atomic_store_explicit(&n->sleeping, 0, TR_SEQ_CST);
}

tr_status tr_notifier_commit_wait(tr_notifier *n, uint64_t key, int64_t timeout_ns) {
    tr_status rc = TR_OK;
    int64_t deadline = -1;
    if (timeout_ns >= 0) {
        int64_t now = tr_now_ns();
        /* beyond the clock's range: no timeout, and no overflow */
        deadline = timeout_ns > INT64_MAX - now ? -1 : now + timeout_ns;
    }
#if TR_NOTIFIER_FUTEX
    /* acquire: pairs with notify's release bump (the woken consumer then sees
     * the producer's work) */
    while (atomic_load_explicit(&n->epoch, TR_ACQUIRE) == (uint32_t)key) {
        struct timespec rel, *relp = NULL;
        if (deadline >= 0) {
            int64_t left = deadline - tr_now_ns();
            if (left <= 0) {
                rc = TR_ETIMEDOUT;
                break;
            }
            rel.tv_sec = (time_t)(left / 1000000000);
            rel.tv_nsec = (long)(left % 1000000000);
            relp = &rel;
        }
        /* sleeps only while the epoch still equals the key (checked by the
         * kernel); EINTR / EAGAIN / a timeout: the loop re-checks */
        syscall(SYS_futex, (uint32_t *)&n->epoch, FUTEX_WAIT_PRIVATE, (uint32_t)key, relp, NULL, 0);
    }
#else
    struct timespec abs;
    if (deadline >= 0) {
        abs.tv_sec = (time_t)(deadline / 1000000000);
        abs.tv_nsec = (long)(deadline % 1000000000);
    }
    pthread_mutex_lock(&n->mutex);
    /* relaxed under the mutex: notify bumps the epoch while holding it. */
    while (atomic_load_explicit(&n->epoch, TR_RELAXED) == (uint32_t)key) {
        if (deadline < 0) {
            pthread_cond_wait(&n->cond, &n->mutex);
        } else if (pthread_cond_timedwait(&n->cond, &n->mutex, &abs) == ETIMEDOUT) {
            if (atomic_load_explicit(&n->epoch, TR_RELAXED) == (uint32_t)key)
                rc = TR_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&n->mutex);
#endif
    /* seq_cst: as in cancel_wait; the consumer is awake and re-checks work. */
    atomic_store_explicit(&n->sleeping, 0, TR_SEQ_CST);
    return rc;
}

void tr_notifier_notify(tr_notifier *n) {
    /* seq_cst: the other side of prepare_wait's seq_cst store; the caller's
     * publication precedes this load in the seq_cst order (queue: the tail CAS). */
    if (TR_LIKELY(atomic_load_explicit(&n->sleeping, TR_SEQ_CST) == 0))
        return;
    /* seq_cst exchange: take the announcement; a producer that gets 0 was beaten
     * by one that got the 1 and bumps the epoch below (so a burst of producers
     * pays the wake-up once per sleep, not once per message). */
    if (atomic_exchange_explicit(&n->sleeping, 0, TR_SEQ_CST) == 0)
        return;
#if TR_NOTIFIER_FUTEX
    int saved_errno = errno; /* a signal handler must leave errno as it found it */
    /* release: pairs with prepare_wait's and commit_wait's acquire loads. */
    atomic_fetch_add_explicit(&n->epoch, 1, TR_RELEASE);
    /* relaxed: a metrics counter, ordered by nothing. */
    atomic_fetch_add_explicit(&n->wakeups, 1, TR_RELAXED);
    syscall(SYS_futex, (uint32_t *)&n->epoch, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    errno = saved_errno;
#else
    pthread_mutex_lock(&n->mutex);
    /* release: pairs with prepare_wait's acquire load of the epoch. */
    atomic_fetch_add_explicit(&n->epoch, 1, TR_RELEASE);
    /* relaxed: a metrics counter, ordered by nothing. */
    atomic_fetch_add_explicit(&n->wakeups, 1, TR_RELAXED);
    pthread_cond_signal(&n->cond);
    pthread_mutex_unlock(&n->mutex);
#endif
}
