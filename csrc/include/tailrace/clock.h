/* tailrace/clock.h: the one clock (CLOCK_MONOTONIC, nanoseconds). */
#ifndef TAILRACE_CLOCK_H
#define TAILRACE_CLOCK_H

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

#ifdef __cplusplus
}
#endif
#endif
