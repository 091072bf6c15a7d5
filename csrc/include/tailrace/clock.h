/* tailrace/clock.h: the one clock (CLOCK_MONOTONIC, nanoseconds). */
#ifndef TAILRACE_CLOCK_H
#define TAILRACE_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic time in nanoseconds; never goes backwards, unrelated to wall time. */
int64_t tr_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif
