/* tailrace/clock.h: the one clock (CLOCK_MONOTONIC, nanoseconds). */
#ifndef TAILRACE_CLOCK_H
#define TAILRACE_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic time in nanoseconds; never goes backwards, unrelated to wall time. */
int64_t tr_now_ns(void);

/* The same clock read cheaply at tick resolution: never ahead of tr_now_ns and
 * at most tr_coarse_lag_ns() behind it. For checks made per message that only
 * need to know "certainly not yet" (tr_loop_run_yield); a virtual clock must
 * replace both functions together. */
int64_t tr_coarse_now_ns(void);
int64_t tr_coarse_lag_ns(void);

/* A virtual clock for tests (tr_loop_config.clock_fn = tr_manual_clock_read, clock_ctx = &c):
 * its owner moves it with tr_manual_clock_set, then calls tr_loop_clock_moved. Read from the
 * loop thread, set from any one thread at a time. */
typedef struct tr_manual_clock {
    _Atomic int64_t ns;
} tr_manual_clock;

int64_t tr_manual_clock_read(void *clock); /* clock: a tr_manual_clock */
void tr_manual_clock_set(tr_manual_clock *clock, int64_t ns);

#ifdef __cplusplus
}
#endif
#endif
