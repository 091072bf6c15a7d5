/* watermark.c: per-partition low watermarks (tailrace/watermark.h).
 *
 * Invariant: a partition's watermark position only increases, and its committed
 * position never exceeds the watermark nor decreases. Both are changed only by
 * the owning loop thread; readers on other threads (metrics, the binding) get a
 * consistent snapshot of a partition's (watermark, committed) pair through a
 * per-partition seqlock.
 *
 * Seqlock (Boehm, "Can seqlocks get along with programming language memory
 * models?"): the writer makes the sequence odd, fences, writes the fields as
 * relaxed atomics, then publishes an even sequence with release. A reader loads
 * the sequence (acquire), copies the fields (relaxed), fences (acquire) and
 * accepts the copy only if the sequence is unchanged and even. All fields are
 * atomics, so a torn read is a retried read, never a data race.
 *
 * Each partition has its own cache line: readers of one partition do not slow the
 * writer of another. `ndirty` counts partitions whose watermark is ahead of their
 * committed mark, maintained by the writer, so tr_watermark_dirty is O(1).
 */
#include "tailrace/watermark.h"

#include <stdlib.h>

#include "tailrace/atomics.h"

#define HAS_MARK 1u
#define HAS_COMMITTED 2u

typedef struct tr_wm_part {
    _Alignas(TR_CACHELINE) _Atomic uint64_t seq; /* seqlock: odd while writing */
    _Atomic uint32_t has;                        /* HAS_MARK | HAS_COMMITTED */
    _Atomic uint64_t position;
    _Atomic uint64_t handle;
    _Atomic uint64_t committed_position;
    _Atomic uint64_t committed_handle;
} tr_wm_part;

_Static_assert(sizeof(tr_wm_part) == TR_CACHELINE, "one partition per cache line");

typedef struct tr_wm_snapshot {
    uint32_t has;
    tr_mark mark;
    tr_mark committed;
} tr_wm_snapshot;

struct tr_watermark {
    _Alignas(TR_CACHELINE) _Atomic uint32_t ndirty; /* loop writes; any thread reads */
    uint32_t npartitions;
    tr_wm_part *parts;
};

tr_status tr_watermark_create(uint32_t npartitions, tr_watermark **out) {
    tr_watermark *w = aligned_alloc(TR_CACHELINE, sizeof(*w));
    uint32_t i;
    if (w == NULL)
        return TR_ENOMEM;
    w->parts = NULL;
    if (npartitions > 0) {
        w->parts = aligned_alloc(TR_CACHELINE, (size_t)npartitions * sizeof(tr_wm_part));
        if (w->parts == NULL) {
            free(w);
            return TR_ENOMEM;
        }
    }
    for (i = 0; i < npartitions; i++) {
        tr_wm_part *p = &w->parts[i];
        atomic_init(&p->seq, 0);
        atomic_init(&p->has, 0);
        atomic_init(&p->position, 0);
        atomic_init(&p->handle, 0);
        atomic_init(&p->committed_position, 0);
        atomic_init(&p->committed_handle, 0);
    }
    atomic_init(&w->ndirty, 0);
    w->npartitions = npartitions;
    *out = w;
    return TR_OK;
}

void tr_watermark_destroy(tr_watermark *w) {
    if (w == NULL)
        return;
    free(w->parts);
    free(w);
}

uint32_t tr_watermark_partitions(const tr_watermark *w) {
    return w->npartitions;
}

/* Any thread: a consistent copy of one partition. */
static void wm_read(const tr_wm_part *p, tr_wm_snapshot *snap) {
    tr_wm_part *mp = (tr_wm_part *)p; /* C11 atomic loads take non-const pointers */
    for (;;) {
        /* acquire: pairs with the writer's release store of the even sequence. */
        uint64_t s1 = atomic_load_explicit(&mp->seq, TR_ACQUIRE);
        if (s1 & 1) {
            tr_cpu_relax();
            continue;
        }
        /* relaxed field copies: validated by the sequence re-check below. */
        snap->has = atomic_load_explicit(&mp->has, TR_RELAXED);
        snap->mark.position = atomic_load_explicit(&mp->position, TR_RELAXED);
        snap->mark.handle = atomic_load_explicit(&mp->handle, TR_RELAXED);
        snap->committed.position = atomic_load_explicit(&mp->committed_position, TR_RELAXED);
        snap->committed.handle = atomic_load_explicit(&mp->committed_handle, TR_RELAXED);
        /* acquire fence: orders the field loads before the re-check; pairs with
         * the writer's release fence after it made the sequence odd. */
        atomic_thread_fence(TR_ACQUIRE);
        /* relaxed: ordered by the fence above. */
        if (atomic_load_explicit(&mp->seq, TR_RELAXED) == s1)
            return;
    }
}

/* Loop thread: the current values, without the seqlock (no other writer). */
static void wm_read_own(const tr_wm_part *p, tr_wm_snapshot *snap) {
    tr_wm_part *mp = (tr_wm_part *)p;
    /* relaxed: this thread is the only writer of every field. */
    snap->has = atomic_load_explicit(&mp->has, TR_RELAXED);
    snap->mark.position = atomic_load_explicit(&mp->position, TR_RELAXED);
    snap->mark.handle = atomic_load_explicit(&mp->handle, TR_RELAXED);
    snap->committed.position = atomic_load_explicit(&mp->committed_position, TR_RELAXED);
    snap->committed.handle = atomic_load_explicit(&mp->committed_handle, TR_RELAXED);
}

static int snap_dirty(const tr_wm_snapshot *s) {
    if (!(s->has & HAS_MARK))
        return 0;
    return !(s->has & HAS_COMMITTED) || s->mark.position > s->committed.position;
}

/* Loop thread: publish a new value of the whole partition. */
static void wm_write(tr_watermark *w, tr_wm_part *p, const tr_wm_snapshot *old,
                     const tr_wm_snapshot *snap) {
    /* relaxed: this thread is the only writer of seq. */
    uint64_t s = atomic_load_explicit(&p->seq, TR_RELAXED);
    /* relaxed + release fence: readers that see any new field value below also see
     * the odd sequence (pairs with their acquire fence) and retry. */
    atomic_store_explicit(&p->seq, s + 1, TR_RELAXED);
    atomic_thread_fence(TR_RELEASE);
    /* relaxed: published by the release store of the even sequence below. */
    atomic_store_explicit(&p->has, snap->has, TR_RELAXED);
    atomic_store_explicit(&p->position, snap->mark.position, TR_RELAXED);
    atomic_store_explicit(&p->handle, snap->mark.handle, TR_RELAXED);
    atomic_store_explicit(&p->committed_position, snap->committed.position, TR_RELAXED);
    atomic_store_explicit(&p->committed_handle, snap->committed.handle, TR_RELAXED);
    /* release: pairs with the reader's acquire load of the sequence. */
    atomic_store_explicit(&p->seq, s + 2, TR_RELEASE);
    if (snap_dirty(old) != snap_dirty(snap))
        /* relaxed: a counter read as a hint by tr_watermark_dirty; the marks
         * themselves are read through the seqlock. */
        atomic_fetch_add_explicit(&w->ndirty, snap_dirty(snap) ? 1u : (uint32_t)-1, TR_RELAXED);
}

tr_status tr_watermark_advance(tr_watermark *w, uint32_t partition, uint64_t position,
                               uint64_t handle) {
    tr_wm_snapshot old, snap;
    if (partition >= w->npartitions)
        return TR_EINVAL;
    wm_read_own(&w->parts[partition], &old);
    if ((old.has & HAS_MARK) && position <= old.mark.position)
        return TR_EREGRESS; /* rule 13: never backwards */
    snap = old;
    snap.has |= HAS_MARK;
    snap.mark.position = position;
    snap.mark.handle = handle;
    wm_write(w, &w->parts[partition], &old, &snap);
    return TR_OK;
}

tr_status tr_watermark_get(const tr_watermark *w, uint32_t partition, tr_mark *out) {
    tr_wm_snapshot snap;
    if (partition >= w->npartitions)
        return TR_EINVAL;
    wm_read(&w->parts[partition], &snap);
    if (!(snap.has & HAS_MARK))
        return TR_EAGAIN;
    *out = snap.mark;
    return TR_OK;
}

tr_status tr_watermark_mark_committed(tr_watermark *w, uint32_t partition, tr_mark mark) {
    tr_wm_snapshot old, snap;
    if (partition >= w->npartitions)
        return TR_EINVAL;
    wm_read_own(&w->parts[partition], &old);
    if (!(old.has & HAS_MARK) || mark.position > old.mark.position)
        return TR_EREGRESS; /* rule 13: never past an incomplete message */
    if ((old.has & HAS_COMMITTED) && mark.position < old.committed.position)
        return TR_EREGRESS; /* rule 13: the committed offset never goes backwards */
    snap = old;
    snap.has |= HAS_COMMITTED;
    snap.committed = mark;
    wm_write(w, &w->parts[partition], &old, &snap);
    return TR_OK;
}

tr_status tr_watermark_committed(const tr_watermark *w, uint32_t partition, tr_mark *out) {
    tr_wm_snapshot snap;
    if (partition >= w->npartitions)
        return TR_EINVAL;
    wm_read(&w->parts[partition], &snap);
    if (!(snap.has & HAS_COMMITTED))
        return TR_EAGAIN;
    *out = snap.committed;
    return TR_OK;
}

int tr_watermark_dirty(const tr_watermark *w) {
    /* relaxed: a snapshot; only the loop thread changes it. */
    return atomic_load_explicit(&((tr_watermark *)w)->ndirty, TR_RELAXED) != 0;
}
