/* Stress: sequencer + watermark driven together, as the loop drives them
 * (SEMANTICS rules 12, 13, 18).
 *
 * The loop thread reads messages of NPART partitions in a random interleaving,
 * acquires a seq for each (tags: partition, position), and advances the
 * partition's watermark from each released completion. Worker threads complete
 * shuffled blocks of seqs, marking each message done just before complete().
 * A checker thread meanwhile reads every partition's watermark and asserts that
 *   - the (position, handle) pair is consistent (the seqlock), and
 *   - every message of that partition at or before the position is done, i.e. the
 *     watermark is never ahead of an incomplete message (rule 13).
 * One message fails: the watermark of its partition must stop before it (rule 18).
 * The loop thread also commits marks and checks commits past the watermark or
 * backwards are refused (rule 13).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "tailrace/clock.h"
#include "tailrace/sequencer.h"
#include "tailrace/watermark.h"
#include "tr_test.h"

#define NPART 3
#define NWORKERS 3
#define BLOCK 16
#define MAXC 64

static tr_sequencer *seqr;
static tr_watermark *wm;
static uint64_t total, fail_at;
static uint32_t *msg_part;      /* by seq; written by the loop before acquire */
static uint64_t *seq_of[NPART]; /* by (partition, position) */
static _Atomic uint8_t *done;   /* by seq; set by the completer before complete() */
static _Atomic uint64_t published, cursor;
static atomic_int stop;

static uint64_t handle_of(uint32_t p, uint64_t pos) {
    return pos * 8 + p;
}

static void *worker(void *arg) {
    uint64_t rng = 0x9e3779b97f4a7c15ull * ((uint64_t)(uintptr_t)arg + 1);
    for (;;) {
        uint64_t start = atomic_fetch_add(&cursor, BLOCK), end, n, i, order[BLOCK];
        if (start >= total)
            return NULL;
        end = start + BLOCK < total ? start + BLOCK : total;
        n = end - start;
        while (atomic_load_explicit(&published, memory_order_acquire) < end)
            sched_yield();
        for (i = 0; i < n; i++)
            order[i] = start + i;
        for (i = n; i > 1; i--) {
            uint64_t j = tr_test_rand(&rng) % i, t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        for (i = 0; i < n; i++) {
            uint64_t s = order[i];
            if (s == fail_at) {
                CHECK_EQ(tr_sequencer_complete(seqr, s, TR_SEQ_FAILED), TR_OK);
            } else {
                atomic_store_explicit(&done[s], 1, memory_order_relaxed);
                CHECK_EQ(tr_sequencer_complete(seqr, s, (s % 29 == 0) ? TR_SEQ_COMMIT : 0), TR_OK);
            }
        }
    }
}

static void *checker(void *arg) {
    uint64_t verified[NPART] = {0}; /* positions below are known done */
    uint64_t reads = 0;
    (void)arg;
    while (!atomic_load(&stop)) {
        uint32_t p;
        for (p = 0; p < NPART; p++) {
            tr_mark m;
            if (tr_watermark_get(wm, p, &m) != TR_OK)
                continue;
            CHECK_EQ(m.handle, handle_of(p, m.position));
            for (; verified[p] <= m.position; verified[p]++)
                CHECK(atomic_load_explicit(&done[seq_of[p][verified[p]]], memory_order_relaxed));
            reads++;
        }
    }
    CHECK(reads > 0);
    return NULL;
}

int main(int argc, char **argv) {
    double scale = tr_test_scale(argc, argv);
    uint64_t next_pos[NPART] = {0}, rng = 99, expect = 0, seq, failed, i;
    pthread_t workers[NWORKERS], check;
    tr_seq_release out[MAXC];
    uint32_t p;
    tr_mark m;
    int64_t t0 = tr_now_ns();

    total = tr_test_scaled(300000, scale) + MAXC;
    fail_at = total - MAXC / 2;
    msg_part = calloc(total, sizeof(*msg_part));
    done = calloc(total, sizeof(*done));
    CHECK(msg_part && done);
    for (p = 0; p < NPART; p++)
        CHECK((seq_of[p] = calloc(total, sizeof(uint64_t))) != NULL);
    CHECK_EQ(tr_sequencer_create(MAXC, &seqr), TR_OK);
    CHECK_EQ(tr_watermark_create(NPART, &wm), TR_OK);
    for (i = 0; i < NWORKERS; i++)
        CHECK_EQ(pthread_create(&workers[i], NULL, worker, (void *)(uintptr_t)i), 0);
    CHECK_EQ(pthread_create(&check, NULL, checker, NULL), 0);

    for (;;) {
        size_t n, k;
        uint64_t next;
        while ((next = tr_sequencer_next_seq(seqr)) < total) {
            uint32_t part = (uint32_t)(tr_test_rand(&rng) % NPART);
            uint64_t pos = next_pos[part];
            msg_part[next] = part;
            seq_of[part][pos] = next;
            if (tr_sequencer_acquire(seqr, part, pos, &seq) != TR_OK)
                break;
            next_pos[part]++;
            atomic_store_explicit(&published, seq + 1, memory_order_release);
        }
        if (expect == fail_at)
            break;
        n = tr_sequencer_release(seqr, out, MAXC);
        for (k = 0; k < n; k++, expect++) {
            uint32_t part = (uint32_t)out[k].tag_a;
            CHECK_EQ(out[k].seq, expect);
            CHECK_EQ(tr_watermark_advance(wm, part, out[k].tag_b, handle_of(part, out[k].tag_b)),
                     TR_OK);
            if (out[k].flags & TR_SEQ_COMMIT) {
                CHECK_EQ(k, n - 1);
                CHECK_EQ(tr_watermark_get(wm, part, &m), TR_OK);
                CHECK_EQ(tr_watermark_mark_committed(wm, part, m), TR_OK);
                m.position++;
                CHECK_EQ(tr_watermark_mark_committed(wm, part, m), TR_EREGRESS);
            }
        }
        if (n == 0)
            sched_yield();
    }
    while (tr_sequencer_head_failed(seqr, &failed) != TR_EFAILED)
        sched_yield();
    CHECK_EQ(failed, fail_at);
    for (i = 0; i < NWORKERS; i++)
        pthread_join(workers[i], NULL);
    CHECK_EQ(tr_sequencer_release(seqr, out, MAXC), 0);
    atomic_store(&stop, 1);
    pthread_join(check, NULL);

    /* rule 18: the failed message's partition stops right before it. */
    p = msg_part[fail_at];
    for (i = 0; seq_of[p][i] != fail_at; i++)
        ;
    if (i == 0) {
        CHECK_EQ(tr_watermark_get(wm, p, &m), TR_EAGAIN);
    } else {
        CHECK_EQ(tr_watermark_get(wm, p, &m), TR_OK);
        CHECK_EQ(m.position, i - 1);
    }
    printf("stress_watermark: %llu messages in %.3f s\n", (unsigned long long)total,
           (double)(tr_now_ns() - t0) / 1e9);
    tr_sequencer_destroy(seqr);
    tr_watermark_destroy(wm);
    free(msg_part);
    free((void *)done);
    for (p = 0; p < NPART; p++)
        free(seq_of[p]);
    puts("stress_watermark: ok");
    return 0;
}
