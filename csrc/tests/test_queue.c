/* Unit tests: the MPSC queue, single-threaded (exact capacity, order, batches). */
#include <stdatomic.h>

#include "tailrace/clock.h"
#include "tailrace/queue.h"
#include "tr_test.h"

static tr_item item(uint64_t a) {
    tr_item it = {a, ~a};
    return it;
}

static void test_create(void) {
    tr_queue *q = NULL;
    CHECK_EQ(tr_queue_create(0, NULL, &q), TR_EINVAL);
    CHECK_EQ(tr_queue_create(((size_t)1 << 30) + 1, NULL, &q), TR_EINVAL);
    CHECK_EQ(tr_queue_create(1, NULL, &q), TR_OK);
    CHECK_EQ(tr_queue_capacity(q), 2);
    CHECK(tr_queue_notifier(q) != NULL);
    tr_queue_destroy(q);
    CHECK_EQ(tr_queue_create(3, NULL, &q), TR_OK);
    CHECK_EQ(tr_queue_capacity(q), 4);
    tr_queue_destroy(q);
    CHECK_EQ(tr_queue_create(1024, NULL, &q), TR_OK);
    CHECK_EQ(tr_queue_capacity(q), 1024);
    tr_queue_destroy(q);
    tr_queue_destroy(NULL);
}

static void test_fifo_full_empty(void) {
    tr_queue *q;
    tr_item out;
    uint64_t i, lap;
    CHECK_EQ(tr_queue_create(8, NULL, &q), TR_OK);
    CHECK(tr_queue_empty_sc(q));
    CHECK_EQ(tr_queue_try_pop_sc(q, &out), TR_EAGAIN);
    for (lap = 0; lap < 5; lap++) { /* several laps: cells are reused */
        for (i = 0; i < 8; i++)
            CHECK_EQ(tr_queue_try_push_mpsc(q, item(lap * 100 + i)), TR_OK);
        CHECK_EQ(tr_queue_try_push_mpsc(q, item(999)), TR_EAGAIN); /* full: nothing stored */
        CHECK_EQ(tr_queue_size_approx(q), 8);
        CHECK(!tr_queue_empty_sc(q));
        for (i = 0; i < 8; i++) {
            CHECK_EQ(tr_queue_try_pop_sc(q, &out), TR_OK);
            CHECK_EQ(out.a, lap * 100 + i);
            CHECK_EQ(out.b, ~(lap * 100 + i));
        }
        CHECK_EQ(tr_queue_try_pop_sc(q, &out), TR_EAGAIN);
        CHECK(tr_queue_empty_sc(q));
        CHECK_EQ(tr_queue_size_approx(q), 0);
    }
    tr_queue_destroy(q);
}

static void test_batches(void) {
    tr_queue *q;
    tr_item in[20], out[20];
    size_t i, n;
    for (i = 0; i < 20; i++)
        in[i] = item(i);
    CHECK_EQ(tr_queue_create(16, NULL, &q), TR_OK);
    CHECK_EQ(tr_queue_try_push_batch_mpsc(q, in, 0), 0);
    CHECK_EQ(tr_queue_try_push_batch_mpsc(q, in, 5), 5);
    CHECK_EQ(tr_queue_try_push_batch_mpsc(q, in + 5, 15), 11); /* a prefix: as many as fit */
    CHECK_EQ(tr_queue_try_push_batch_mpsc(q, in + 16, 4), 0);  /* full */
    CHECK_EQ(tr_queue_try_pop_batch_sc(q, out, 0), 0);
    n = tr_queue_try_pop_batch_sc(q, out, 3);
    CHECK_EQ(n, 3);
    for (i = 0; i < 3; i++)
        CHECK_EQ(out[i].a, i);
    /* Three cells free again, at the wrapped end of the ring. */
    CHECK_EQ(tr_queue_try_push_batch_mpsc(q, in + 16, 4), 3);
    n = tr_queue_try_pop_batch_sc(q, out, 20);
    CHECK_EQ(n, 16);
    for (i = 0; i < 16; i++)
        CHECK_EQ(out[i].a, i + 3);
    CHECK_EQ(tr_queue_try_pop_batch_sc(q, out, 20), 0);
    /* A batch larger than the ring pushes one ring's worth. */
    {
        tr_item big[40];
        for (i = 0; i < 40; i++)
            big[i] = item(i);
        CHECK_EQ(tr_queue_try_push_batch_mpsc(q, big, 40), 16);
    }
    tr_queue_destroy(q);
}

static void test_pop_wait_timeout_and_shared_notifier(void) {
    tr_notifier n;
    tr_queue *q1, *q2;
    tr_item out;
    int64_t t0;
    CHECK_EQ(tr_notifier_init(&n), TR_OK);
    CHECK_EQ(tr_queue_create(4, &n, &q1), TR_OK);
    CHECK_EQ(tr_queue_create(4, &n, &q2), TR_OK);
    CHECK(tr_queue_notifier(q1) == &n);
    CHECK(tr_queue_notifier(q2) == &n);
    t0 = tr_now_ns();
    CHECK_EQ(tr_queue_pop_wait_sc(q1, &out, 5 * 1000 * 1000), TR_ETIMEDOUT);
    CHECK(tr_now_ns() - t0 >= 5 * 1000 * 1000);
    CHECK_EQ(tr_queue_pop_wait_sc(q1, &out, 0), TR_ETIMEDOUT);
    CHECK_EQ(tr_queue_try_push_mpsc(q2, item(7)), TR_OK);
    CHECK_EQ(tr_queue_pop_wait_sc(q2, &out, 0), TR_OK);
    CHECK_EQ(out.a, 7);
    CHECK_EQ(tr_queue_try_push_mpsc(q1, item(8)), TR_OK);
    CHECK_EQ(tr_queue_pop_wait_sc(q1, &out, -1), TR_OK);
    CHECK_EQ(out.a, 8);
    tr_queue_destroy(q1);
    tr_queue_destroy(q2);
    tr_notifier_destroy(&n);
}

int main(void) {
    test_create();
    test_fifo_full_empty();
    test_batches();
    test_pop_wait_timeout_and_shared_notifier();
    puts("test_queue: ok");
    return 0;
}
