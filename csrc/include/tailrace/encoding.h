/* tailrace/encoding.h: every word that packs fields, in one place (STYLE habit 11).
 *
 * Each encoding names its field widths, a static assert that they fit in 64
 * bits, and a helper that refuses (returns 0) a value that does not fit rather
 * than truncating it: a silent truncation is a stall waiting for a big enough
 * input. Decoders are total.
 *
 *   completion-queue item word a:  kind (8 bits) << 56 | task (24 bits)
 *                                  (word b: a full 64-bit sequence number or partition)
 *   pool worker item word a:       kind (8 bits) << 56 | task (24 bits)
 *                                  (word b: a full 64-bit sequence number; the message
 *                                  item itself is kept by the loop per task and seq)
 *   lazy ring item (binding):      offset (42 bits) << 21 | partition (20 bits) << 1 | 1
 *   offset handle (binding):       int offset (62 bits) << 1, or pinned id (62 bits) << 1 | 1
 *
 * Sequence numbers and read positions are never packed: they stay 64-bit words.
 */
#ifndef TAILRACE_ENCODING_H
#define TAILRACE_ENCODING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kind << 56 | task: completion-queue and pool worker items ---- */
#define TR_ENC_KIND_SHIFT 56u
#define TR_ENC_TASK_BITS 24u
#define TR_ENC_TASK_MAX ((1u << TR_ENC_TASK_BITS) - 1u) /* the most tasks a loop may have */
_Static_assert(TR_ENC_TASK_BITS <= TR_ENC_KIND_SHIFT, "task and kind fields overlap");

/* 1 and *out = the word; 0 when task or kind does not fit. */
static inline int tr_enc_kind_task(uint32_t kind, uint32_t task, uint64_t *out) {
    if (task > TR_ENC_TASK_MAX || kind > 0xffu)
        return 0;
    *out = ((uint64_t)kind << TR_ENC_KIND_SHIFT) | task;
    return 1;
}
static inline uint32_t tr_enc_kind(uint64_t word) {
    return (uint32_t)(word >> TR_ENC_KIND_SHIFT);
}
static inline uint32_t tr_enc_task(uint64_t word) {
    return (uint32_t)(word & TR_ENC_TASK_MAX);
}

/* ---- lazy ring items of the binding (bounded memory streams) ---- */
#define TR_LAZY_PART_BITS 20u
#define TR_LAZY_OFFSET_SHIFT (TR_LAZY_PART_BITS + 1u)
#define TR_LAZY_OFFSET_BITS 42u
#define TR_LAZY_OFFSET_LIMIT (1ull << TR_LAZY_OFFSET_BITS) /* offsets below this fit */
_Static_assert(TR_LAZY_OFFSET_SHIFT + TR_LAZY_OFFSET_BITS <= 64, "lazy item does not fit");

/* 1 and *out = the item (odd: never a pointer); 0 when offset or partition does
 * not fit (the binding then builds an envelope instead). */
static inline int tr_lazy_item(uint64_t offset, uint32_t partition, uint64_t *out) {
    if (offset >= TR_LAZY_OFFSET_LIMIT || partition >= (1u << TR_LAZY_PART_BITS))
        return 0;
    *out = (offset << TR_LAZY_OFFSET_SHIFT) | ((uint64_t)partition << 1) | 1u;
    return 1;
}
static inline uint64_t tr_lazy_offset(uint64_t item) {
    return item >> TR_LAZY_OFFSET_SHIFT;
}
static inline uint32_t tr_lazy_partition(uint64_t item) {
    return (uint32_t)((item >> 1) & ((1u << TR_LAZY_PART_BITS) - 1u));
}

/* ---- offset handles of the binding ---- */
#define TR_HANDLE_LIMIT (1ull << 62) /* int offsets and pinned ids below this fit */
_Static_assert(TR_HANDLE_LIMIT <= (UINT64_MAX >> 1), "handle does not fit");

/* 1 and *out = the handle; 0 when the value does not fit. */
static inline int tr_handle_int(uint64_t offset, uint64_t *out) {
    if (offset >= TR_HANDLE_LIMIT)
        return 0;
    *out = offset << 1;
    return 1;
}
static inline int tr_handle_pinned(uint64_t id, uint64_t *out) {
    if (id >= TR_HANDLE_LIMIT)
        return 0;
    *out = (id << 1) | 1u;
    return 1;
}

#ifdef __cplusplus
}
#endif
#endif
