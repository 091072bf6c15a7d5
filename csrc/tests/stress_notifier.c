/* Stress: the notifier's wake-up protocol under late notifies (issue 13, defect 2).
 *
 * A consumer waits in tr_queue_pop_wait_sc with no timeout and acknowledges each
 * item. A producer pushes one item at a time and waits for its acknowledgement;
 * "stale" threads call tr_notifier_notify with no new work all the while (a late
 * notify of a push already consumed, which the protocol allows). With the old
 * protocol a stale notify could clear a newer announcement and bump the epoch
 * before the consumer read its key: the consumer then slept with `sleeping` 0 and
 * no later notify woke it. An acknowledgement that takes longer than STUCK_NS is
 * reported as a lost wake-up (the consumer never sleeps that long with an item
 * published) and fails the test.
 *
 * Checked: every item acknowledged in order (no loss, no duplicate), no lost
 * wake-up, and the consumer really slept (wake-ups counted).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "tailrace/clock.h"
#include "tailrace/notifier.h"
#include "tailrace/queue.h"
#include "tr_test.h"

#define NSTALE 2
#define STUCK_NS (2000LL * 1000 * 1000)

static tr_queue *q;
static _Atomic uint64_t acked;
static _Atomic int quit;

static void *consumer(void *arg) {
    (void)arg;
    uint64_t expect = 1;
    tr_item it;
    for (;;) {
        if (tr_queue_pop_wait_sc(q, &it, -1) != TR_OK)
            continue;
        if (it.a == 0)
            return NULL;
        CHECK_EQ(it.a, expect); /* one producer: its order, no loss, no duplicate */
        expect++;
        /* release: the producer's acquire load sees the ack after the pop */
        atomic_fetch_add_explicit(&acked, 1, memory_order_release);
    }
}

static void *stale(void *arg) {
    (void)arg;
    /* relaxed: a stop flag, orders nothing */
    while (!atomic_load_explicit(&quit, memory_order_relaxed))
        tr_notifier_notify(tr_queue_notifier(q));
    return NULL;
}

/* One round: n pushes with varying pauses; aborts on a lost wake-up. */
static void round_of(uint64_t n, uint64_t *pushed, uint64_t *rng) {
    for (uint64_t i = 0; i < n; i++) {
        tr_item it = {++*pushed, 0};
        while (tr_queue_try_push_mpsc(q, it) != TR_OK)
            sched_yield();
        int64_t t0 = tr_now_ns();
        /* acquire: pairs with the consumer's release increment */
        while (atomic_load_explicit(&acked, memory_order_acquire) < *pushed) {
            if (tr_now_ns() - t0 > STUCK_NS) {
                fprintf(stderr,
                        "LOST WAKE-UP after %llu pushes: item published, consumer asleep "
                        "for over %lld ms (sleeping=%u)\n",
                        (unsigned long long)*pushed, STUCK_NS / 1000000,
                        (unsigned)atomic_load(&tr_queue_notifier(q)->sleeping));
                abort();
            }
            sched_yield();
        }
        /* vary the phase so the consumer reaches prepare_wait at varying times */
        uint64_t r = tr_test_rand(rng) % 8;
        if (r == 0) {
            struct timespec ts = {0, (long)(tr_test_rand(rng) % 50000)};
            nanosleep(&ts, NULL);
        } else {
            for (uint64_t k = 0; k < r * 64; k++)
                tr_cpu_relax();
        }
    }
}

int main(int argc, char **argv) {
    double scale = tr_test_scale(argc, argv);
    double seconds = tr_test_stress_seconds();
    uint64_t per_round = tr_test_scaled(20000, scale);
    uint64_t pushed = 0, rng = 0x2545f4914f6cdd1dull;
    pthread_t c, s[NSTALE];
    CHECK_EQ(tr_queue_create(64, NULL, &q), TR_OK);
    CHECK_EQ(pthread_create(&c, NULL, consumer, NULL), 0);
    for (int i = 0; i < NSTALE; i++)
        CHECK_EQ(pthread_create(&s[i], NULL, stale, NULL), 0);
    int64_t end = tr_now_ns() + (int64_t)(seconds * 1e9);
    do
        round_of(per_round, &pushed, &rng);
    while (seconds > 0 && tr_now_ns() < end);
    atomic_store(&quit, 1);
    for (int i = 0; i < NSTALE; i++)
        pthread_join(s[i], NULL);
    tr_item stop = {0, 0};
    while (tr_queue_try_push_mpsc(q, stop) != TR_OK)
        sched_yield();
    pthread_join(c, NULL);
    CHECK_EQ(atomic_load(&acked), pushed);
    CHECK(atomic_load(&tr_queue_notifier(q)->wakeups) > 0); /* the consumer did sleep */
    printf("stress_notifier: %llu pushes, %llu wake-ups, no lost wake-up\n",
           (unsigned long long)pushed,
           (unsigned long long)atomic_load(&tr_queue_notifier(q)->wakeups));
    tr_queue_destroy(q);
    return 0;
}
