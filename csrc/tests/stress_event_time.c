/* Stress: the event-time watermark (SEMANTICS rules 33, 37) as the loop drives it.
 *
 * The loop thread reads batches of NPART partitions in a random interleaving, with
 * timestamps out of order (random, bounded jitter), empty polls and, at the end, the
 * end of every partition, on a clock that moves forward by random steps. Each round
 * runs with idleness off (the task's watermark must equal max(previous, min over open
 * partitions of largest - lag), computed here independently) and with idleness on.
 * Reader threads meanwhile read tr_event_time_get and assert that what they see never
 * moves backwards (rule 33) and ends at +infinity once every partition ended (rule 37).
 *
 * A tracking round (windows, event-time timers: rule 35) hands every message read to a
 * worker thread that reports it with tr_event_time_seen, as a pool worker does, while the
 * loop thread reads, polls empty and recomputes: the watermark never moves backwards,
 * never passes what was handed over, counts an ended partition only once it is drained,
 * and equals the exact minimum once the worker has had everything.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "tailrace/clock.h"
#include "tailrace/event_time.h"
#include "tr_test.h"

#define NPART 4
#define NREADERS 2
#define LAG 50

static tr_event_time *et;
static atomic_int running;

static void *reader(void *arg) {
    (void)arg;
    int64_t last = TR_ET_NONE;
    uint64_t reads = 0;
    while (atomic_load_explicit(&running, memory_order_acquire) || reads == 0) {
        int64_t v = tr_event_time_get(et);
        CHECK(v >= last);
        last = v;
        reads++;
    }
    return NULL;
}

static void round_once(uint64_t steps, int idle, uint64_t *rng) {
    int64_t max_ts[NPART], now = 0, base = 1000000, prev = TR_ET_NONE;
    int ended[NPART] = {0};
    pthread_t th[NREADERS];
    CHECK_EQ(tr_event_time_create(NPART, LAG, idle ? 20 : 0, 0, &et), TR_OK);
    for (int p = 0; p < NPART; p++)
        max_ts[p] = TR_ET_NONE;
    atomic_store_explicit(&running, 1, memory_order_release);
    for (int i = 0; i < NREADERS; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, reader, NULL), 0);
    for (uint64_t s = 0; s < steps; s++) {
        uint32_t p = (uint32_t)(tr_test_rand(rng) % NPART);
        now += (int64_t)(tr_test_rand(rng) % 8);
        if (tr_test_rand(rng) % 4 == 0) {
            CHECK_EQ(tr_event_time_empty(et, p, now), TR_OK);
        } else {
            int64_t ts = base + (int64_t)(s / NPART) - (int64_t)(tr_test_rand(rng) % 200);
            if (ts > max_ts[p])
                max_ts[p] = ts;
            CHECK_EQ(tr_event_time_read(et, p, ts, now), TR_OK);
        }
        int64_t v = tr_event_time_get(et);
        CHECK(v >= prev);
        if (!idle) { /* exactly the rule: the minimum over open partitions, never backwards */
            int64_t min = TR_ET_END;
            for (int q = 0; q < NPART; q++) {
                int64_t m = max_ts[q] == TR_ET_NONE ? TR_ET_NONE : max_ts[q] - LAG;
                if (m < min)
                    min = m;
            }
            CHECK_EQ(v, min > prev ? min : prev);
        }
        prev = v;
    }
    for (uint32_t p = 0; p < NPART; p++) {
        now += 1;
        CHECK_EQ(tr_event_time_ended(et, p, now), TR_OK);
        ended[p] = 1;
        CHECK(tr_event_time_get(et) >= prev);
        prev = tr_event_time_get(et);
    }
    CHECK(ended[NPART - 1]);
    CHECK_EQ(tr_event_time_get(et), TR_ET_END);
    atomic_store_explicit(&running, 0, memory_order_release);
    for (int i = 0; i < NREADERS; i++)
        CHECK_EQ(pthread_join(th[i], NULL), 0);
    tr_event_time_destroy(et);
}

#define QCAP (1u << 16)
static int64_t q_ts[QCAP];
static uint32_t q_part[QCAP];
static atomic_uint_fast64_t q_tail, q_head;
static atomic_int producing;
static atomic_int_fast64_t handed_max; /* the largest timestamp handed over so far */

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        uint64_t h = atomic_load_explicit(&q_head, memory_order_relaxed);
        if (h == atomic_load_explicit(&q_tail, memory_order_acquire)) {
            if (!atomic_load_explicit(&producing, memory_order_acquire) &&
                h == atomic_load_explicit(&q_tail, memory_order_acquire))
                return NULL;
            sched_yield();
            continue;
        }
        int64_t ts = q_ts[h % QCAP];
        int64_t m = atomic_load_explicit(&handed_max, memory_order_relaxed);
        if (ts > m) /* one writer: a plain max */
            atomic_store_explicit(&handed_max, ts, memory_order_seq_cst);
        CHECK_EQ(tr_event_time_seen(et, q_part[h % QCAP], ts), TR_OK);
        atomic_store_explicit(&q_head, h + 1, memory_order_release);
    }
}

static void round_tracked(uint64_t steps, uint64_t *rng) {
    int64_t max_ts[NPART], now = 0, base = 1000000, prev = TR_ET_NONE;
    pthread_t th;
    CHECK_EQ(tr_event_time_create(NPART, LAG, 0, 0, &et), TR_OK);
    tr_event_time_track(et);
    for (int p = 0; p < NPART; p++)
        max_ts[p] = TR_ET_NONE;
    atomic_store(&q_tail, 0);
    atomic_store(&q_head, 0);
    atomic_store(&handed_max, TR_ET_NONE);
    atomic_store_explicit(&producing, 1, memory_order_release);
    CHECK_EQ(pthread_create(&th, NULL, worker, NULL), 0);
    for (uint64_t s = 0; s < steps; s++) {
        uint32_t p = (uint32_t)(tr_test_rand(rng) % NPART);
        now += (int64_t)(tr_test_rand(rng) % 8);
        uint64_t tail = atomic_load_explicit(&q_tail, memory_order_relaxed);
        if (tr_test_rand(rng) % 4 == 0 ||
            tail - atomic_load_explicit(&q_head, memory_order_acquire) >= QCAP) {
            CHECK_EQ(tr_event_time_empty(et, p, now), TR_OK);
        } else {
            int64_t ts = base + (int64_t)(s / NPART) - (int64_t)(tr_test_rand(rng) % 200);
            if (ts > max_ts[p])
                max_ts[p] = ts;
            q_ts[tail % QCAP] = ts;
            q_part[tail % QCAP] = p;
            CHECK_EQ(tr_event_time_read_n(et, p, ts, 1, now), TR_OK);
            atomic_store_explicit(&q_tail, tail + 1, memory_order_release);
        }
        int64_t v = tr_event_time_update(et, now);
        CHECK(v >= prev);
        /* never past what was handed over (read after the update: it only grows) */
        int64_t handed = atomic_load_explicit(&handed_max, memory_order_seq_cst);
        CHECK(v == TR_ET_NONE || v <= handed - LAG);
        prev = v;
    }
    atomic_store_explicit(&producing, 0, memory_order_release);
    CHECK_EQ(pthread_join(th, NULL), 0);
    /* everything handed over: exactly the minimum over partitions */
    int64_t min = TR_ET_END;
    for (int q = 0; q < NPART; q++) {
        int64_t m = max_ts[q] == TR_ET_NONE ? TR_ET_NONE : max_ts[q] - LAG;
        if (m < min)
            min = m;
    }
    CHECK_EQ(tr_event_time_update(et, now), min > prev ? min : prev);
    for (uint32_t p = 0; p < NPART; p++)
        CHECK_EQ(tr_event_time_ended(et, p, ++now), TR_OK);
    CHECK_EQ(tr_event_time_get(et), TR_ET_END);
    tr_event_time_destroy(et);
}

int main(int argc, char **argv) {
    double scale = tr_test_scale(argc, argv), seconds = tr_test_stress_seconds();
    uint64_t steps = tr_test_scaled(400000, scale), rng = 0x2545F4914F6CDD1Dull, rounds = 0;
    int64_t t0 = tr_now_ns();
    do {
        round_once(steps, 0, &rng);
        round_once(steps, 1, &rng);
        round_tracked(steps / 4, &rng);
        rounds++;
    } while (seconds > 0 && (double)(tr_now_ns() - t0) / 1e9 < seconds);
    printf("stress_event_time: %llu rounds of %llu steps in %.3f s\n", (unsigned long long)rounds,
           (unsigned long long)steps, (double)(tr_now_ns() - t0) / 1e9);
    return 0;
}
