/* test_loop_signal: tr_loop_stop from a real signal handler (issue 13, defect 7).
 *
 * The handler for SIGUSR1 calls tr_loop_stop. The signal is sent to the loop
 * thread itself, at varying moments, while the loop parks on its notifier and
 * wakes on a short idle period: a stop that took a lock (as the notifier's
 * mutex once was) deadlocks when the signal lands while the loop thread holds
 * that lock. Each round must end with TR_STOP_EXTERNAL, and promptly.
 *
 * First, the notifier itself: a thread sends SIGUSR2 to a consumer that keeps
 * waiting and waking (short timeouts), and the handler notifies. With a mutex
 * in notify, a signal landing while the consumer holds it (around its condvar
 * wait) deadlocks the consumer; the test then hangs and CTest fails it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tailrace/clock.h"
#include "tailrace/loop.h"
#include "tailrace/notifier.h"
#include "tr_test.h"

static tr_loop *volatile g_loop;
static _Atomic uint64_t batches;

static void on_usr1(int sig) {
    (void)sig;
    tr_loop *L = g_loop;
    if (L)
        tr_loop_stop(L);
}

static int run_batch(void *ctx, tr_loop *loop) {
    (void)ctx;
    tr_op op;
    atomic_fetch_add(&batches, 1);
    while (tr_loop_next_op(loop, &op)) {
        if (op.kind == TR_OP_REFILL)
            tr_loop_partition_state(loop, op.task, op.partition, TR_PART_IDLE);
        else if (op.kind != TR_OP_PROCESS && op.kind != TR_OP_RUN)
            tr_loop_control_done(loop, op.task, 0);
    }
    return 0;
}

static tr_notifier g_n;
static _Atomic int spam_quit;

static void on_usr2(int sig) {
    (void)sig;
    tr_notifier_notify(&g_n);
}

static void *spammer_main(void *arg) {
    pthread_t target = *(pthread_t *)arg;
    /* relaxed: a stop flag */
    while (!atomic_load_explicit(&spam_quit, memory_order_relaxed)) {
        pthread_kill(target, SIGUSR2);
        for (int i = 0; i < 200; i++)
            tr_cpu_relax();
    }
    return NULL;
}

static void notifier_under_signals(double seconds) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGUSR2, &sa, NULL), 0);
    CHECK_EQ(tr_notifier_init(&g_n), TR_OK);
    pthread_t self = pthread_self(), th;
    CHECK_EQ(pthread_create(&th, NULL, spammer_main, &self), 0);
    int64_t end = tr_now_ns() + (int64_t)(seconds * 1e9);
    uint64_t waits = 0;
    while (tr_now_ns() < end) {
        uint64_t key = tr_notifier_prepare_wait(&g_n);
        tr_notifier_commit_wait(&g_n, key, 20000);
        waits++;
    }
    atomic_store(&spam_quit, 1);
    pthread_join(th, NULL);
    signal(SIGUSR2, SIG_IGN);
    tr_notifier_destroy(&g_n);
    printf("test_loop_signal: %llu notifier waits under signals, %llu wake-ups from the handler\n",
           (unsigned long long)waits, (unsigned long long)atomic_load(&g_n.wakeups));
}

typedef struct killer {
    pthread_t target;
    long delay_us;
} killer;

static void *killer_main(void *arg) {
    killer *k = arg;
    usleep((useconds_t)k->delay_us);
    pthread_kill(k->target, SIGUSR1);
    return NULL;
}

int main(int argc, char **argv) {
#if !TR_NOTIFIER_FUTEX
    printf(
        "test_loop_signal: skipped (tr_loop_stop is signal-safe only with the futex notifier)\n");
    return 0;
#endif
    double scale = tr_test_scale(argc, argv);
    uint64_t rounds = tr_test_scaled(300, scale), rng = 12345;
    notifier_under_signals(2.0 * scale);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    for (uint64_t r = 0; r < rounds; r++) {
        tr_loop_config c = {0};
        c.ntasks = 2;
        c.max_concurrency = 1;
        c.input_buffer = 16;
        c.max_idle_ns = 1000000; /* wake often: the loop takes and leaves its wait constantly */
        c.shutdown_ns = 100000000;
        tr_loop_task tasks[2] = {{1, TR_TASK_INLINE}, {1, TR_TASK_INLINE}};
        tr_loop *loop;
        CHECK_EQ(tr_loop_create(&c, tasks, &loop), TR_OK);
        g_loop = loop;
        killer k = {pthread_self(), (long)(tr_test_rand(&rng) % 3000)};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, killer_main, &k), 0);
        tr_loop_hooks hooks = {NULL, run_batch, NULL, NULL, NULL};
        int64_t t0 = tr_now_ns();
        CHECK_EQ(tr_loop_run(loop, &hooks), TR_OK);
        CHECK(tr_now_ns() - t0 < 5000000000LL);
        pthread_join(th, NULL);
        g_loop = NULL;
        CHECK_EQ(tr_loop_stop_reason(loop), TR_STOP_EXTERNAL);
        tr_loop_destroy(loop);
    }
    printf("test_loop_signal: %llu loops stopped from a signal handler\n",
           (unsigned long long)rounds);
    return 0;
}
