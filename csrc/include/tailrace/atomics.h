/* tailrace/atomics.h: the one place memory orders and CPU hints are named.
 *
 * Every use of these in csrc/ carries a one-line comment naming the other side
 * of the happens-before edge it creates (habit 3 of STYLE.md).
 */
#ifndef TAILRACE_ATOMICS_H
#define TAILRACE_ATOMICS_H

#include <stdatomic.h>
#include <stddef.h>

#define TR_RELAXED memory_order_relaxed
#define TR_ACQUIRE memory_order_acquire
#define TR_RELEASE memory_order_release
#define TR_ACQ_REL memory_order_acq_rel
#define TR_SEQ_CST memory_order_seq_cst

/* Destructive-interference size; hot producer and consumer fields live on separate lines. */
#define TR_CACHELINE 64

#if defined(__x86_64__) || defined(__i386__)
#define tr_cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define tr_cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define tr_cpu_relax() ((void)0)
#endif

#define TR_LIKELY(x) __builtin_expect(!!(x), 1)
#define TR_UNLIKELY(x) __builtin_expect(!!(x), 0)

#endif
