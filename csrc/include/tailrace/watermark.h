/* tailrace/watermark.h: per-partition low watermarks of one task (rules 12, 13, 18).
 *
 * The low watermark of a partition is the last message such that it and every
 * earlier message of that partition have completed. The loop advances it only
 * from released completions (tr_sequencer_release), which are contiguous, so it
 * never passes an incomplete message. Each message of a partition has a position
 * (0, 1, 2, ... in read order) and an opaque 64-bit offset handle that the binding
 * maps to the Python offset. Positions only go forward: advancing to a position
 * <= the current one is TR_EREGRESS and changes nothing.
 *
 * The tracker also remembers the committed position per partition (what a
 * checkpoint store last accepted), which likewise never goes backwards, and
 * whether the watermark is ahead of it (a commit has something to write).
 *
 * Threads: advance/mark_committed from the owning loop thread. get/committed
 * from any thread: a seqlock gives a consistent (position, handle) pair.
 */
#ifndef TAILRACE_WATERMARK_H
#define TAILRACE_WATERMARK_H

#include <stdint.h>

#include "tailrace/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_watermark tr_watermark;

typedef struct tr_mark {
    uint64_t position; /* position within the partition, 0-based */
    uint64_t handle;   /* opaque offset handle */
} tr_mark;

/* npartitions may be 0; TR_ENOMEM. */
tr_status tr_watermark_create(uint32_t npartitions, tr_watermark **out);
void tr_watermark_destroy(tr_watermark *w);
uint32_t tr_watermark_partitions(const tr_watermark *w);

/* Loop thread. TR_OK, TR_EREGRESS (position not past the current one),
 * TR_EINVAL (partition out of range). */
tr_status tr_watermark_advance(tr_watermark *w, uint32_t partition, uint64_t position,
                               uint64_t handle);

/* Any thread. TR_OK and the mark; TR_EAGAIN when nothing has completed yet;
 * TR_EINVAL (partition out of range). */
tr_status tr_watermark_get(const tr_watermark *w, uint32_t partition, tr_mark *out);

/* Loop thread. Records that mark was durably committed. TR_EREGRESS if it is
 * before the last committed mark, or past the low watermark (never commit past
 * an incomplete message); TR_EINVAL. */
tr_status tr_watermark_mark_committed(tr_watermark *w, uint32_t partition, tr_mark mark);

/* Any thread. TR_OK and the last committed mark; TR_EAGAIN if none. */
tr_status tr_watermark_committed(const tr_watermark *w, uint32_t partition, tr_mark *out);

/* Any thread: 1 when some partition's watermark is past its committed mark. */
int tr_watermark_dirty(const tr_watermark *w);

#ifdef __cplusplus
}
#endif
#endif
