/* Stress: one loop thread, several completing threads (SEMANTICS rules 2, 12, 15, 17, 18).
 *
 * The loop thread acquires sequence numbers and publishes how many it handed out.
 * Two independent claim cursors each hand every seq to some completing thread in
 * blocks, which complete their block in a shuffled order, so every seq is
 * completed twice, by racing threads, out of order. Checked:
 *   - exactly one of the two completions of each seq returns TR_OK, the other
 *     TR_EALREADY (rule 17);
 *   - releases are contiguous, in order, with the tags given at acquire and the
 *     flags given at complete (rule 12);
 *   - a commit-flagged completion is always the last of its release batch (rule 15);
 *   - outstanding never exceeds max concurrency (rule 2);
 *   - the one failed seq is never released and blocks everything after it (rule 18).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "tailrace/clock.h"
#include "tailrace/sequencer.h"
#include "tr_test.h"

#define NTHREADS 4
#define MAXBLOCK 16

typedef struct run {
    tr_sequencer *s;
    uint64_t total;   /* seqs handed out: 0 .. total-1 */
    uint64_t fail_at; /* this seq fails */
    uint64_t block;
    _Atomic uint64_t published; /* seqs acquired so far */
    _Atomic uint64_t cursor[2];
    _Atomic uint32_t *ok;      /* per seq: TR_OK count */
    _Atomic uint32_t *already; /* per seq: TR_EALREADY count */
} run;

static uint32_t flags_for(const run *r, uint64_t seq) {
    uint32_t f = (uint32_t)((seq * 31) & 0xff) << TR_SEQ_USER_SHIFT;
    if (seq % 13 == 5)
        f |= TR_SEQ_COMMIT;
    if (seq == r->fail_at)
        f |= TR_SEQ_FAILED;
    return f;
}

typedef struct worker_arg {
    run *r;
    int id;
} worker_arg;

static void *worker(void *p) {
    worker_arg *arg = p;
    run *r = arg->r;
    uint64_t rng = 0x2545f4914f6cdd1dull * (uint64_t)(arg->id + 1);
    _Atomic uint64_t *cursor = &r->cursor[arg->id % 2];
    for (;;) {
        uint64_t start = atomic_fetch_add(cursor, r->block), end, n, i, order[MAXBLOCK];
        if (start >= r->total)
            return NULL;
        end = start + r->block < r->total ? start + r->block : r->total;
        n = end - start;
        while (atomic_load_explicit(&r->published, memory_order_acquire) < end)
            sched_yield();
        for (i = 0; i < n; i++)
            order[i] = start + i;
        for (i = n; i > 1; i--) { /* Fisher-Yates */
            uint64_t j = tr_test_rand(&rng) % i, t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        for (i = 0; i < n; i++) {
            tr_status rc = tr_sequencer_complete(r->s, order[i], flags_for(r, order[i]));
            if (rc == TR_OK)
                atomic_fetch_add(&r->ok[order[i]], 1);
            else if (rc == TR_EALREADY)
                atomic_fetch_add(&r->already[order[i]], 1);
            else
                CHECK(0 && "complete returned neither TR_OK nor TR_EALREADY");
        }
    }
}

static void run_one(uint32_t max, uint64_t total) {
    run r;
    worker_arg args[NTHREADS];
    pthread_t th[NTHREADS];
    tr_seq_release out[64];
    uint64_t expect = 0, rng = 7, seq, failed, i;
    int t;
    int64_t t0 = tr_now_ns();

    CHECK_EQ(tr_sequencer_create(max, &r.s), TR_OK);
    r.total = total;
    r.fail_at = total - max; /* the last window: everything can still be handed out */
    r.block = max < MAXBLOCK ? max : MAXBLOCK;
    atomic_init(&r.published, 0);
    atomic_init(&r.cursor[0], 0);
    atomic_init(&r.cursor[1], 0);
    r.ok = calloc(total, sizeof(*r.ok));
    r.already = calloc(total, sizeof(*r.already));
    CHECK(r.ok && r.already);
    for (t = 0; t < NTHREADS; t++) {
        args[t].r = &r;
        args[t].id = t;
        CHECK_EQ(pthread_create(&th[t], NULL, worker, &args[t]), 0);
    }
    /* The loop thread. */
    for (;;) {
        size_t n, k;
        uint64_t next;
        while ((next = tr_sequencer_next_seq(r.s)) < total &&
               tr_sequencer_acquire(r.s, next * 3, ~next, &seq) == TR_OK) {
            CHECK_EQ(seq, next);
            atomic_store_explicit(&r.published, seq + 1, memory_order_release);
        }
        CHECK(tr_sequencer_outstanding(r.s) <= max);
        if (expect == r.fail_at)
            break;
        n = tr_sequencer_release(r.s, out, 1 + tr_test_rand(&rng) % 64);
        for (k = 0; k < n; k++) {
            CHECK_EQ(out[k].seq, expect);
            CHECK_EQ(out[k].tag_a, expect * 3);
            CHECK_EQ(out[k].tag_b, ~expect);
            CHECK_EQ(out[k].flags, flags_for(&r, expect));
            CHECK(!(out[k].flags & TR_SEQ_FAILED));
            if (out[k].flags & TR_SEQ_COMMIT)
                CHECK_EQ(k, n - 1);
            expect++;
        }
        if (n == 0)
            sched_yield();
    }
    /* Everything before fail_at is released; the failure blocks the rest for good. */
    while (tr_sequencer_head_failed(r.s, &failed) != TR_EFAILED)
        sched_yield();
    CHECK_EQ(failed, r.fail_at);
    for (t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    CHECK_EQ(tr_sequencer_release(r.s, out, 64), 0);
    CHECK_EQ(tr_sequencer_released_upto(r.s), r.fail_at);
    for (i = 0; i < total; i++) {
        CHECK_EQ(atomic_load(&r.ok[i]), 1);
        CHECK_EQ(atomic_load(&r.already[i]), 1);
    }
    CHECK_EQ(tr_sequencer_complete(r.s, r.fail_at, 0), TR_EALREADY);
    CHECK_EQ(tr_sequencer_complete(r.s, total, 0), TR_EUNKNOWN);
    printf("max %u: %llu seqs in %.3f s\n", max, (unsigned long long)total,
           (double)(tr_now_ns() - t0) / 1e9);
    free(r.ok);
    free(r.already);
    tr_sequencer_destroy(r.s);
}

int main(int argc, char **argv) {
    double scale = tr_test_scale(argc, argv);
    uint64_t total = tr_test_scaled(300000, scale);
    run_one(1, total / 4 + 16);
    run_one(7, total);
    run_one(64, total);
    run_one(1000, total * 2 + 8000);
    puts("stress_sequencer: ok");
    return 0;
}
