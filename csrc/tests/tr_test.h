/* tr_test.h: the tiny assertion kit of the C tests (no framework). */
#ifndef TR_TEST_H
#define TR_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                            \
        if (check_a_ != check_b_) {                                                                \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld != %lld)\n", __FILE__,         \
                    __LINE__, #a, #b, check_a_, check_b_);                                         \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Stress size multiplier: argv[1] if given (CTest passes a smaller one under
 * sanitizers), else $TR_STRESS_SCALE, else 1. */
static inline double tr_test_scale(int argc, char **argv) {
    const char *s = argc > 1 ? argv[1] : getenv("TR_STRESS_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}

static inline uint64_t tr_test_scaled(uint64_t n, double scale) {
    uint64_t v = (uint64_t)((double)n * scale);
    return v > 0 ? v : 1;
}

/* Stress mode (outside CI): $TR_STRESS_SECONDS > 0 makes a stress program
 * repeat its rounds until that many seconds have passed (e.g. 600 under TSan);
 * 0 when unset: one round, sized by the scale. */
static inline double tr_test_stress_seconds(void) {
    const char *s = getenv("TR_STRESS_SECONDS");
    double v = s ? atof(s) : 0.0;
    return v > 0 ? v : 0.0;
}

/* xorshift64*: deterministic per-thread randomness. */
static inline uint64_t tr_test_rand(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 2685821657736338717ull;
}

#endif
