/* Coverage of the compiled core for the fuzz targets (tests/fuzz/README.md).
 *
 * scripts/fuzz.sh builds tailrace._core with gcc's -fsanitize-coverage=trace-pc,trace-cmp:
 * every basic block calls __sanitizer_cov_trace_pc and every comparison a
 * __sanitizer_cov_trace_cmp*. libFuzzer (inside atheris) takes coverage as 8-bit counters, not
 * trace-pc calls, and its module is loaded privately (RTLD_LOCAL). This library, loaded
 * globally before the core, gives the core those symbols: each block's address (hashed with
 * the previous block's, as AFL counts edges) bumps one of TR_COV_N counters, and the
 * comparisons go on to libFuzzer's own functions (a tail call: libFuzzer sees the compare's
 * own return address). tr_sancov_init hands libFuzzer the counters once atheris is set up. */
#include <stddef.h>
#include <stdint.h>

#define TR_COV_N 65536 /* a power of two */

static uint8_t tr_cov_counters[TR_COV_N];
static uintptr_t tr_cov_pcs[2 * TR_COV_N]; /* libFuzzer's table: a made-up pc and flags */
static uintptr_t tr_cov_prev;

typedef void (*tr_cmp1)(uint8_t, uint8_t);
typedef void (*tr_cmp2)(uint16_t, uint16_t);
typedef void (*tr_cmp4)(uint32_t, uint32_t);
typedef void (*tr_cmp8)(uint64_t, uint64_t);
typedef void (*tr_switch)(uint64_t, uint64_t *);

static tr_cmp1 tr_fz_cmp1, tr_fz_const_cmp1;
static tr_cmp2 tr_fz_cmp2, tr_fz_const_cmp2;
static tr_cmp4 tr_fz_cmp4, tr_fz_const_cmp4;
static tr_cmp8 tr_fz_cmp8, tr_fz_const_cmp8;
static tr_switch tr_fz_switch;

void __sanitizer_cov_trace_pc(void) {
    uintptr_t pc = (uintptr_t)__builtin_return_address(0);
    uintptr_t cur = (pc ^ (pc >> 16)) * 0x9E3779B1u;
    tr_cov_counters[(cur ^ tr_cov_prev) & (TR_COV_N - 1)]++;
    tr_cov_prev = (cur & (TR_COV_N - 1)) >> 1;
}

#define TR_FORWARD(name, type, fn)                                                                 \
    void name(type a, type b) {                                                                    \
        if (fn != NULL)                                                                            \
            fn(a, b);                                                                              \
    }
TR_FORWARD(__sanitizer_cov_trace_cmp1, uint8_t, tr_fz_cmp1)
TR_FORWARD(__sanitizer_cov_trace_cmp2, uint16_t, tr_fz_cmp2)
TR_FORWARD(__sanitizer_cov_trace_cmp4, uint32_t, tr_fz_cmp4)
TR_FORWARD(__sanitizer_cov_trace_cmp8, uint64_t, tr_fz_cmp8)
TR_FORWARD(__sanitizer_cov_trace_const_cmp1, uint8_t, tr_fz_const_cmp1)
TR_FORWARD(__sanitizer_cov_trace_const_cmp2, uint16_t, tr_fz_const_cmp2)
TR_FORWARD(__sanitizer_cov_trace_const_cmp4, uint32_t, tr_fz_const_cmp4)
TR_FORWARD(__sanitizer_cov_trace_const_cmp8, uint64_t, tr_fz_const_cmp8)

void __sanitizer_cov_trace_switch(uint64_t v, uint64_t *cases) {
    if (tr_fz_switch != NULL)
        tr_fz_switch(v, cases);
}

/* floating-point compares (gcc emits them; libFuzzer has no use for them) */
void __sanitizer_cov_trace_cmpf(float a, float b) {
    (void)a;
    (void)b;
}
void __sanitizer_cov_trace_cmpd(double a, double b) {
    (void)a;
    (void)b;
}

/* fns: libFuzzer's __sanitizer_cov_8bit_counters_init, __sanitizer_cov_pcs_init, then
 * trace_cmp1, 2, 4, 8, trace_const_cmp1, 2, 4, 8 and trace_switch; returns TR_COV_N */
int tr_sancov_init(void *const *fns) {
    void (*counters_init)(uint8_t *, uint8_t *) = (void (*)(uint8_t *, uint8_t *))fns[0];
    void (*pcs_init)(const uintptr_t *, const uintptr_t *) =
        (void (*)(const uintptr_t *, const uintptr_t *))fns[1];
    for (size_t i = 0; i < TR_COV_N; i++) {
        tr_cov_pcs[2 * i] = (uintptr_t)tr_cov_counters + i; /* distinct, never called */
        tr_cov_pcs[2 * i + 1] = 0;
    }
    tr_fz_cmp1 = (tr_cmp1)fns[2];
    tr_fz_cmp2 = (tr_cmp2)fns[3];
    tr_fz_cmp4 = (tr_cmp4)fns[4];
    tr_fz_cmp8 = (tr_cmp8)fns[5];
    tr_fz_const_cmp1 = (tr_cmp1)fns[6];
    tr_fz_const_cmp2 = (tr_cmp2)fns[7];
    tr_fz_const_cmp4 = (tr_cmp4)fns[8];
    tr_fz_const_cmp8 = (tr_cmp8)fns[9];
    tr_fz_switch = (tr_switch)fns[10];
    for (size_t i = 0; i < TR_COV_N; i++)
        tr_cov_counters[i] = 0;
    counters_init(tr_cov_counters, tr_cov_counters + TR_COV_N);
    pcs_init(tr_cov_pcs, tr_cov_pcs + 2 * TR_COV_N);
    return TR_COV_N;
}
