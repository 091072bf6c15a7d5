/* test_loop_cq: the completion queue's bound holds (issue 13, defect 1).
 *
 * A binding with a runtime lock (a mutex standing for the GIL): the loop
 * thread holds it through run_batch, a pool worker through run_pool_batch,
 * exactly as the Cython binding does. Sync tasks on the pool, many partitions,
 * max concurrency 1000: the setting in which the loop used to release pool
 * completions before it had popped their queue items, so a task's queued items
 * reached about twice its window, the queue filled, and a worker spun on it
 * holding the lock the loop thread (its only consumer) waited for: a hang.
 *
 * Checked: the run ends (no hang; CTest's timeout fails it otherwise), every
 * message is processed exactly once and in order per partition, and the most
 * items the loop ever saw queued stays within the bound tr_loop_create computes
 * (cq_high_water <= cq_bound), while the loop is made to lag behind the workers.
 * Rounds: 20 times the scale (argv[1]; CTest runs it with the stress programs).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tailrace/loop.h"
#include "tr_test.h"

#define NTASKS 4u
#define NPARTS 16u
#define NMSGS 4000u /* per partition */
#define MAXC 1000u

static pthread_mutex_t gil = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_read[NTASKS][NPARTS];
static uint64_t next_proc[NTASKS][NPARTS]; /* written by the task's worker only */
static _Atomic uint64_t processed;
static uint64_t batches;

static uint64_t item_of(uint32_t t, uint32_t p, uint64_t i) {
    return ((uint64_t)t << 48) | ((uint64_t)p << 32) | (i + 1);
}

static int run_batch(void *ctx, tr_loop *loop) {
    (void)ctx;
    tr_op op;
    pthread_mutex_lock(&gil);
    /* lag behind the workers now and then (a loop thread waiting for the GIL) */
    if (++batches % 4 == 0)
        usleep(2000);
    while (tr_loop_next_op(loop, &op)) {
        switch (op.kind) {
        case TR_OP_REFILL: {
            uint64_t *r = &next_read[op.task][op.partition];
            uint64_t n = NMSGS - *r < op.handle ? NMSGS - *r : op.handle;
            for (uint64_t i = 0; i < n; i++, (*r)++)
                CHECK_EQ(tr_loop_push_input(loop, op.task, op.partition,
                                            item_of(op.task, op.partition, *r), *r),
                         TR_OK);
            if (n == 0)
                tr_loop_partition_state(loop, op.task, op.partition, TR_PART_ENDED);
            break;
        }
        case TR_OP_COMMIT:
        case TR_OP_WINDOW:
        case TR_OP_TIMER:
        case TR_OP_END_OF_STREAM:
            tr_loop_control_done(loop, op.task, 0);
            break;
        default:
            CHECK(0); /* pool tasks: no PROCESS or RUN op on the loop thread */
        }
    }
    pthread_mutex_unlock(&gil);
    return 0;
}

static void run_pool_batch(void *ctx, tr_loop *loop, uint32_t worker) {
    (void)ctx;
    tr_op op;
    pthread_mutex_lock(&gil);
    while (tr_loop_pool_next(loop, worker, &op)) {
        if (op.flags & TR_OPF_DISCARD)
            continue;
        uint32_t t = (uint32_t)(op.item >> 48), p = (uint32_t)((op.item >> 32) & 0xffff);
        uint64_t i = (op.item & 0xffffffffu) - 1;
        CHECK_EQ(t, op.task);
        CHECK_EQ(i, next_proc[t][p]); /* in order, each once */
        next_proc[t][p]++;
        atomic_fetch_add(&processed, 1);
        CHECK_EQ(tr_loop_pool_done(loop, worker, &op, 0), TR_OK);
    }
    pthread_mutex_unlock(&gil);
}

static void one_round(uint64_t *high, uint64_t *bound) {
    memset(next_read, 0, sizeof next_read);
    memset(next_proc, 0, sizeof next_proc);
    atomic_store(&processed, 0);
    tr_loop_config c = {0};
    c.ntasks = NTASKS;
    c.max_concurrency = MAXC;
    c.input_buffer = 4096;
    c.pool_size = 1; /* one worker holding every task's completions back */
    c.max_idle_ns = 1000000;
    c.shutdown_ns = 1000000000;
    tr_loop_task tasks[NTASKS];
    for (uint32_t t = 0; t < NTASKS; t++)
        tasks[t] = (tr_loop_task){NPARTS, TR_TASK_POOL};
    tr_loop *loop;
    CHECK_EQ(tr_loop_create(&c, tasks, &loop), TR_OK);
    tr_loop_hooks hooks = {NULL, run_batch, run_pool_batch, NULL, NULL};
    CHECK_EQ(tr_loop_run(loop, &hooks), TR_OK);
    CHECK_EQ(tr_loop_stop_reason(loop), TR_STOP_END_OF_STREAM);
    CHECK_EQ(atomic_load(&processed), (uint64_t)NTASKS * NPARTS * NMSGS);
    for (uint32_t t = 0; t < NTASKS; t++)
        for (uint32_t p = 0; p < NPARTS; p++)
            CHECK_EQ(next_proc[t][p], NMSGS);
    tr_loop_stats s;
    tr_loop_get_stats(loop, &s);
    CHECK(s.cq_high_water > 0);
    CHECK(s.cq_high_water <= s.cq_bound);
    if (s.cq_high_water > *high)
        *high = s.cq_high_water;
    *bound = s.cq_bound;
    uint64_t left[8];
    CHECK_EQ(tr_loop_drain_items(loop, left, 8), 0);
    tr_loop_destroy(loop);
}

int main(int argc, char **argv) {
    uint64_t rounds = tr_test_scaled(20, tr_test_scale(argc, argv)), high = 0, bound = 0;
    for (uint64_t r = 0; r < rounds; r++)
        one_round(&high, &bound);
    printf("test_loop_cq: %llu rounds, completion queue high water %llu of a bound of %llu\n",
           (unsigned long long)rounds, (unsigned long long)high, (unsigned long long)bound);
    return 0;
}
