/* tailrace/event_time.h: the event-time watermark of one task (SEMANTICS rules 33, 37),
 * coalesced from its partitions as Hazelcast Jet coalesces watermarks.
 *
 * Timestamps are ms since the epoch (int64). TR_ET_NONE (INT64_MIN) stands for
 * -infinity (no watermark yet), TR_ET_END (INT64_MAX) for +infinity.
 *
 * A partition's watermark is the largest timestamp read from it minus the lag
 * (task.watermark.lag.ms), or TR_ET_NONE before its first timestamp. The task's
 * watermark is the minimum over its partitions, skipping:
 *   - a partition at end of stream (+infinity),
 *   - an idle partition: its last poll found nothing to read, and its empty streak
 *     began idle_ns or more ago (a partition that never had a message: counted
 *     from the task's start). Backpressure is never idleness: a partition whose
 *     buffer is full is not polled, so no empty poll starts a streak.
 * When every partition not at end is idle, the task's watermark is the largest of
 * theirs; when every partition has ended, +infinity. It never moves backwards: the
 * value published is the largest computed so far (or the floor a restart resumes
 * from), so a partition back from idle cannot lower it.
 *
 * Cost: reading a batch is O(1) for its partition plus one recomputation, O(number
 * of partitions), per batch (not per message): the binding passes the batch's
 * largest timestamp.
 *
 * Threads: everything from the owning loop thread, except tr_event_time_get (any
 * thread: a relaxed load of the published value; it orders nothing else) and
 * tr_event_time_seen (the thread invoking the task).
 */
#ifndef TAILRACE_EVENT_TIME_H
#define TAILRACE_EVENT_TIME_H

#include <stdint.h>

#include "tailrace/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_ET_NONE INT64_MIN
#define TR_ET_END INT64_MAX

typedef struct tr_event_time tr_event_time;

/* lag_ms >= 0; idle_ns <= 0: a partition is never skipped as idle; start_ns: the
 * task's start on the clock that later calls pass (now_ns). TR_EINVAL, TR_ENOMEM. */
tr_status tr_event_time_create(uint32_t npartitions, int64_t lag_ms, int64_t idle_ns,
                               int64_t start_ns, tr_event_time **out);
void tr_event_time_destroy(tr_event_time *et);

/* Loop thread: messages were read from `partition` at now_ns; max_ts is the largest of
 * their timestamps (TR_ET_NONE: none had one, e.g. bad messages only). Ends its idle
 * streak and recomputes the task's watermark. TR_EINVAL (partition out of range). */
tr_status tr_event_time_read(tr_event_time *et, uint32_t partition, int64_t max_ts, int64_t now_ns);
/* As tr_event_time_read, and `count` messages were read (tracking counts them). */
tr_status tr_event_time_read_n(tr_event_time *et, uint32_t partition, int64_t max_ts,
                               uint64_t count, int64_t now_ns);
/* Loop thread, before any message: from now on a partition's watermark follows the
 * messages handed to the task (tr_event_time_seen), not those read: a message read
 * ahead into the input buffer moves nothing until the task gets it, so windows and
 * event-time timers never close over messages still buffered (rule 35). A partition
 * at end of stream counts as +infinity, and an empty one as idle, only once every
 * message read from it was handed to the task and its call returned
 * (tr_event_time_done): the last message of an input is processed before the
 * watermark it leaves behind becomes +infinity. */
void tr_event_time_track(tr_event_time *et);
int tr_event_time_tracking(const tr_event_time *et);
/* Any thread (the one invoking the task): a message of `partition` with timestamp ts
 * (TR_ET_NONE: it has none) is handed to the task (before its call: the task's
 * watermark in the call counts it, as a message read counts). The loop thread's next
 * tr_event_time_update sees it. TR_EINVAL. */
tr_status tr_event_time_seen(tr_event_time *et, uint32_t partition, int64_t ts);
/* The same: 1 when it raised the partition's largest timestamp (the watermark may move),
 * 0 when not, -1 for a partition out of range. */
int tr_event_time_seen_moved(tr_event_time *et, uint32_t partition, int64_t ts);
/* The same from the only thread that hands the task messages (a task whose calls all run
 * on the loop thread): no compare-and-swap. `partition` must be in range. */
int tr_event_time_seen_one(tr_event_time *et, uint32_t partition, int64_t ts);
/* Any thread (the one invoking the task): the call with a message of `partition`
 * returned. TR_EINVAL. */
tr_status tr_event_time_done(tr_event_time *et, uint32_t partition);
/* The same for n calls (the loop thread, at the end of a run of them). */
tr_status tr_event_time_done_n(tr_event_time *et, uint32_t partition, uint64_t n);
/* Loop thread: whether `partition`'s being drained matters to the watermark now (it has
 * ended, or its last poll found nothing): after tr_event_time_done, the watermark can
 * only have moved then. */
int tr_event_time_drain_matters(const tr_event_time *et, uint32_t partition);
/* Loop thread: a poll of `partition` at now_ns found nothing to read (starts an idle
 * streak unless one is running); recomputes. TR_EINVAL. */
tr_status tr_event_time_empty(tr_event_time *et, uint32_t partition, int64_t now_ns);
/* Loop thread: `partition` reached its end of stream; recomputes. TR_EINVAL. */
tr_status tr_event_time_ended(tr_event_time *et, uint32_t partition, int64_t now_ns);
/* Loop thread: recompute at now_ns (idleness depends on the time); the task's watermark. */
int64_t tr_event_time_update(tr_event_time *et, int64_t now_ns);
/* Loop thread: the watermark is at least `floor` from now on (a restart resumes from its
 * committed value, rule 33). */
void tr_event_time_floor(tr_event_time *et, int64_t floor);
/* Any thread: the task's watermark as last computed. */
int64_t tr_event_time_get(const tr_event_time *et);
/* Loop thread: the partition's own watermark (TR_ET_END once ended); TR_ET_NONE for
 * an unknown partition. */
int64_t tr_event_time_partition(const tr_event_time *et, uint32_t partition);

#ifdef __cplusplus
}
#endif
#endif
