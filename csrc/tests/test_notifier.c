/* Unit tests: the clock and the notifier (event count). */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "tailrace/clock.h"
#include "tailrace/notifier.h"
#include "tr_test.h"

static tr_notifier n;
static atomic_int flag;

static void *waker(void *arg) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    (void)arg;
    nanosleep(&ts, NULL);
    atomic_store(&flag, 1);
    tr_notifier_notify(&n);
    return NULL;
}

int main(void) {
    int64_t t0, t1;
    uint64_t key;
    pthread_t th;

    t0 = tr_now_ns();
    t1 = tr_now_ns();
    CHECK(t1 >= t0);

    CHECK_EQ(tr_notifier_init(&n), TR_OK);

    /* No sleeper: a notify is the fast path (no wake-up counted). */
    tr_notifier_notify(&n);
    CHECK_EQ(atomic_load(&n.wakeups), 0);

    /* A notify between prepare and commit is not lost. */
    key = tr_notifier_prepare_wait(&n);
    tr_notifier_notify(&n);
    CHECK_EQ(tr_notifier_commit_wait(&n, key, -1), TR_OK);
    CHECK_EQ(atomic_load(&n.wakeups), 1);
    CHECK_EQ(atomic_load(&n.sleeping), 0);

    /* cancel_wait: the next notify is fast again. */
    key = tr_notifier_prepare_wait(&n);
    tr_notifier_cancel_wait(&n);
    tr_notifier_notify(&n);
    CHECK_EQ(atomic_load(&n.wakeups), 1);

    /* Timeout. */
    key = tr_notifier_prepare_wait(&n);
    t0 = tr_now_ns();
    CHECK_EQ(tr_notifier_commit_wait(&n, key, 10 * 1000 * 1000), TR_ETIMEDOUT);
    CHECK(tr_now_ns() - t0 >= 10 * 1000 * 1000);
    /* Zero timeout returns at once. */
    key = tr_notifier_prepare_wait(&n);
    CHECK_EQ(tr_notifier_commit_wait(&n, key, 0), TR_ETIMEDOUT);

    /* Another thread wakes a real sleeper (protocol of the header). */
    CHECK_EQ(pthread_create(&th, NULL, waker, NULL), 0);
    for (;;) {
        key = tr_notifier_prepare_wait(&n);
        if (atomic_load(&flag)) {
            tr_notifier_cancel_wait(&n);
            break;
        }
        CHECK_EQ(tr_notifier_commit_wait(&n, key, 5LL * 1000 * 1000 * 1000), TR_OK);
    }
    pthread_join(th, NULL);

    tr_notifier_destroy(&n);
    puts("test_notifier: ok");
    return 0;
}
