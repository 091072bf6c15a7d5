/* clock.c: the one clock. CLOCK_MONOTONIC so that timeouts survive wall-clock
 * steps; the notifier's condvar is bound to the same clock. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* CLOCK_MONOTONIC_COARSE */
#include "tailrace/clock.h"

#include <time.h>

#include "tailrace/atomics.h"

int64_t tr_now_ns(void) {
    struct timespec ts;
    /* CLOCK_MONOTONIC cannot fail on Linux with a valid pointer. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t tr_coarse_now_ns(void) {
#ifdef CLOCK_MONOTONIC_COARSE
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#else
    return tr_now_ns();
#endif
}

int64_t tr_coarse_lag_ns(void) {
#ifdef CLOCK_MONOTONIC_COARSE
    struct timespec res;
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0)
        return 1000000000; /* unknown: "certainly not yet" only a second ahead */
    /* a coarse read lags by at most one tick; twice that, plus room for rounding */
    return 2 * ((int64_t)res.tv_sec * 1000000000 + res.tv_nsec) + 100000;
#else
    return 0;
#endif
}

int64_t tr_manual_clock_read(void *clock) {
    /* acquire: pairs with tr_manual_clock_set's release, so the loop that sees the new time
     * also sees what the owner did before moving it */
    return atomic_load_explicit(&((tr_manual_clock *)clock)->ns, TR_ACQUIRE);
}

void tr_manual_clock_set(tr_manual_clock *clock, int64_t ns) {
    atomic_store_explicit(&clock->ns, ns, TR_RELEASE); /* pairs with tr_manual_clock_read */
}
