/* Stress: several producers, one consumer, checked for meaning.
 *
 * Item = (producer id, per-producer counter). The consumer checks that each
 * producer's counters arrive exactly 0, 1, 2, ...: per-producer order, no
 * duplicates, and (with the final count) no loss. Phases:
 *   1. single pushes, consumer mixes pop / pop_batch / pop_wait;
 *   2. batch pushes of random sizes, consumer pops in batches;
 *   3. bursty producers with pauses, consumer only pop_wait: the consumer really
 *      sleeps (checked by the notifier's wake-up count) and no wake-up is lost
 *      (a lost one would hang until the test timeout; pop_wait has no timeout).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "tailrace/clock.h"
#include "tailrace/queue.h"
#include "tr_test.h"

#define NPROD 4
#define MAXBATCH 32

typedef struct phase {
    tr_queue *q;
    int mode; /* 1 single, 2 batch, 3 bursty */
    uint64_t per_producer;
} phase;

typedef struct producer_arg {
    phase *ph;
    uint64_t id;
} producer_arg;

static void *producer(void *p) {
    producer_arg *arg = p;
    phase *ph = arg->ph;
    uint64_t rng = 0x9e3779b97f4a7c15ull * (arg->id + 1), i = 0;
    tr_item batch[MAXBATCH];
    while (i < ph->per_producer) {
        if (ph->mode == 2) {
            size_t n = 1 + tr_test_rand(&rng) % MAXBATCH, k, pushed;
            if (n > ph->per_producer - i)
                n = (size_t)(ph->per_producer - i);
            for (k = 0; k < n; k++) {
                batch[k].a = arg->id;
                batch[k].b = i + k;
            }
            pushed = tr_queue_try_push_batch_mpsc(ph->q, batch, n);
            i += pushed;
            if (pushed == 0)
                sched_yield();
        } else {
            tr_item it = {arg->id, i};
            if (tr_queue_try_push_mpsc(ph->q, it) == TR_OK) {
                i++;
                if (ph->mode == 3 && i % 64 == 0) {
                    struct timespec ts = {0, 200 * 1000};
                    nanosleep(&ts, NULL); /* let the consumer fall asleep */
                }
            } else {
                sched_yield();
            }
        }
    }
    return NULL;
}

static void run_phase(int mode, uint64_t per_producer, size_t capacity) {
    phase ph;
    producer_arg args[NPROD];
    pthread_t th[NPROD];
    uint64_t next[NPROD] = {0}, total = 0, want = per_producer * NPROD, rng = 42, wakeups;
    tr_item buf[MAXBATCH];
    int i;
    int64_t t0 = tr_now_ns();

    ph.mode = mode;
    ph.per_producer = per_producer;
    CHECK_EQ(tr_queue_create(capacity, NULL, &ph.q), TR_OK);
    for (i = 0; i < NPROD; i++) {
        args[i].ph = &ph;
        args[i].id = (uint64_t)i;
        CHECK_EQ(pthread_create(&th[i], NULL, producer, &args[i]), 0);
    }
    while (total < want) {
        size_t n = 0, k;
        int how = mode == 3 ? 2 : (int)(tr_test_rand(&rng) % 3);
        if (mode == 2)
            how = 1;
        if (how == 0) {
            n = tr_queue_try_pop_sc(ph.q, &buf[0]) == TR_OK;
        } else if (how == 1) {
            n = tr_queue_try_pop_batch_sc(ph.q, buf, 1 + tr_test_rand(&rng) % MAXBATCH);
        } else {
            CHECK_EQ(tr_queue_pop_wait_sc(ph.q, &buf[0], -1), TR_OK);
            n = 1;
        }
        for (k = 0; k < n; k++) {
            CHECK(buf[k].a < NPROD);
            CHECK_EQ(buf[k].b, next[buf[k].a]); /* order, no duplicate, no gap */
            next[buf[k].a]++;
        }
        total += n;
    }
    for (i = 0; i < NPROD; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(next[i], per_producer);
    }
    CHECK(tr_queue_empty_sc(ph.q));
    CHECK_EQ(tr_queue_size_approx(ph.q), 0);
    wakeups = atomic_load(&tr_queue_notifier(ph.q)->wakeups);
    if (mode == 3)
        CHECK(wakeups > 0); /* the consumer did sleep and was woken */
    printf("phase %d: %llu items in %.3f s, %llu wake-ups\n", mode, (unsigned long long)want,
           (double)(tr_now_ns() - t0) / 1e9, (unsigned long long)wakeups);
    tr_queue_destroy(ph.q);
}

int main(int argc, char **argv) {
    double scale = tr_test_scale(argc, argv);
    run_phase(1, tr_test_scaled(1000000, scale), 1024);
    run_phase(2, tr_test_scaled(1000000, scale), 256);
    run_phase(3, tr_test_scaled(20000, scale), 64);
    puts("stress_queue: ok");
    return 0;
}
