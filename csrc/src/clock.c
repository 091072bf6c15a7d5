/* clock.c: the one clock. CLOCK_MONOTONIC so that timeouts survive wall-clock
 * steps; the notifier's condvar is bound to the same clock. */
#define _POSIX_C_SOURCE 200809L
#include "tailrace/clock.h"

#include <time.h>

int64_t tr_now_ns(void) {
    struct timespec ts;
    /* CLOCK_MONOTONIC cannot fail on Linux with a valid pointer. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
