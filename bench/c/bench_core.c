/* bench_core: throughput of the MPSC queue and cost of sequencer completions.
 *
 * Prints exactly one "NAME VALUE" per line:
 *   queue_1p1c_mops        million items/s, one producer thread, one consumer thread
 *   queue_2p1c_mops        million items/s, two producer threads, one consumer thread
 *   sequencer_complete_ns  ns per completion + release at max concurrency 64,
 *                          completions shuffled within each window of 64
 * Each figure is the median of several runs. Producers use tr_queue_try_push_mpsc
 * (which notifies on every push); the consumer drains with tr_queue_try_pop_batch_sc
 * and parks in tr_queue_pop_wait_sc when empty, as the loop does.
 * Optional argv[1]: a size multiplier (default 1).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "tailrace/atomics.h"
#include "tailrace/clock.h"
#include "tailrace/queue.h"
#include "tailrace/sequencer.h"

#define RUNS 5
#define QUEUE_CAPACITY 4096
#define POP_BATCH 256

typedef struct qarg {
    tr_queue *q;
    uint64_t id, count;
} qarg;

static void *producer(void *p) {
    qarg *a = p;
    uint64_t i;
    for (i = 0; i < a->count; i++) {
        tr_item it = {a->id, i};
        /* Full: the consumer may be descheduled (three threads on two cores); give it
         * the CPU rather than spin out a time slice. */
        while (tr_queue_try_push_mpsc(a->q, it) != TR_OK)
            sched_yield();
    }
    return NULL;
}

static double queue_run(int nprod, uint64_t total) {
    tr_queue *q;
    pthread_t th[8];
    qarg args[8];
    tr_item buf[POP_BATCH];
    uint64_t got = 0, check = 0;
    int64_t t0;
    int i;
    if (tr_queue_create(QUEUE_CAPACITY, NULL, &q) != TR_OK)
        abort();
    t0 = tr_now_ns();
    for (i = 0; i < nprod; i++) {
        args[i].q = q;
        args[i].id = (uint64_t)i;
        args[i].count = total / (uint64_t)nprod;
        pthread_create(&th[i], NULL, producer, &args[i]);
    }
    total = args[0].count * (uint64_t)nprod;
    while (got < total) {
        size_t n = tr_queue_try_pop_batch_sc(q, buf, POP_BATCH), k;
        if (n == 0) {
            if (tr_queue_pop_wait_sc(q, &buf[0], -1) != TR_OK)
                abort();
            n = 1;
        }
        for (k = 0; k < n; k++)
            check += buf[k].b;
        got += n;
    }
    double secs = (double)(tr_now_ns() - t0) / 1e9;
    for (i = 0; i < nprod; i++)
        pthread_join(th[i], NULL);
    /* Every item arrived once: the counters sum to nprod * (0 + ... + count-1). */
    if (check != (uint64_t)nprod * (args[0].count * (args[0].count - 1) / 2))
        abort();
    tr_queue_destroy(q);
    return (double)total / secs / 1e6;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

#define SEQ_WINDOW 64
#define SEQ_PERMS 64

static double sequencer_run(uint64_t windows) {
    static uint8_t perm[SEQ_PERMS][SEQ_WINDOW];
    tr_sequencer *s;
    tr_seq_release out[SEQ_WINDOW];
    uint64_t rng = 12345, w, seq, released = 0;
    int64_t t0;
    int p, i;
    for (p = 0; p < SEQ_PERMS; p++) {
        for (i = 0; i < SEQ_WINDOW; i++)
            perm[p][i] = (uint8_t)i;
        for (i = SEQ_WINDOW; i > 1; i--) {
            int j = (int)(rng_next(&rng) % (uint64_t)i);
            uint8_t t = perm[p][i - 1];
            perm[p][i - 1] = perm[p][j];
            perm[p][j] = t;
        }
    }
    if (tr_sequencer_create(SEQ_WINDOW, &s) != TR_OK)
        abort();
    t0 = tr_now_ns();
    for (w = 0; w < windows; w++) {
        uint64_t base = w * SEQ_WINDOW;
        const uint8_t *pm = perm[w % SEQ_PERMS];
        for (i = 0; i < SEQ_WINDOW; i++)
            if (tr_sequencer_acquire(s, (uint64_t)i, base, &seq) != TR_OK)
                abort();
        for (i = 0; i < SEQ_WINDOW; i++)
            if (tr_sequencer_complete(s, base + pm[i], 0) != TR_OK)
                abort();
        released += tr_sequencer_release(s, out, SEQ_WINDOW);
    }
    double ns = (double)(tr_now_ns() - t0) / (double)(windows * SEQ_WINDOW);
    if (released != windows * SEQ_WINDOW)
        abort();
    tr_sequencer_destroy(s);
    return ns;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double (*fn)(int, uint64_t), int arg, uint64_t n) {
    double v[RUNS];
    int i;
    for (i = 0; i < RUNS; i++)
        v[i] = fn(arg, n);
    qsort(v, RUNS, sizeof(double), cmp_double);
    return v[RUNS / 2];
}

static double seq_adapter(int unused, uint64_t windows) {
    (void)unused;
    return sequencer_run(windows);
}

int main(int argc, char **argv) {
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    uint64_t items = (uint64_t)(20000000 * (scale > 0 ? scale : 1.0));
    printf("queue_1p1c_mops %.1f\n", median(queue_run, 1, items));
    printf("queue_2p1c_mops %.1f\n", median(queue_run, 2, items));
    printf("sequencer_complete_ns %.2f\n", median(seq_adapter, 0, items / SEQ_WINDOW));
    return 0;
}
