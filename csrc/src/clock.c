/* clock.c: the one clock. CLOCK_MONOTONIC so that timeouts survive wall-clock
 * steps; the notifier's condvar is bound to the same clock. */
#define _POSIX_C_SOURCE 200809L
#include "tailrace/clock.h"

#include <time.h>

#include "tailrace/atomics.h"

int64_t tr_now_ns(void) {
    struct timespec ts;
    /* CLOCK_MONOTONIC cannot fail on Linux with a valid pointer. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t tr_manual_clock_read(void *clock) {
    /* acquire: pairs with tr_manual_clock_set's release, so the loop that sees the new time
     * also sees what the owner did before moving it */
    return atomic_load_explicit(&((tr_manual_clock *)clock)->ns, TR_ACQUIRE);
}

void tr_manual_clock_set(tr_manual_clock *clock, int64_t ns) {
    atomic_store_explicit(&clock->ns, ns, TR_RELEASE); /* pairs with tr_manual_clock_read */
}
