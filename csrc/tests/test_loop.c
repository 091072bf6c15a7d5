/* test_loop: exact scenarios of the dispatch loop (timeouts, stop, errors,
 * wake-ups, shutdown votes, user timers), with the fake binding of loop_harness.h. */
#include "loop_harness.h"

#include <stdio.h>
#include <unistd.h>

typedef struct delayed {
    tr_loop *loop;
    int what; /* 0 stop, 1 post error, 2 wake all partitions after making input available */
    harness *h;
} delayed;

static void *delayed_main(void *arg) {
    delayed *d = arg;
    usleep(20000);
    if (d->what == 0)
        tr_loop_stop(d->loop);
    if (d->what == 1)
        CHECK_EQ(tr_loop_post_error(d->loop, 0xdead), TR_OK);
    return NULL;
}

/* rule 16: a callback not completed in time stops the loop, naming it */
static void test_callback_timeout(void) {
    tr_loop_config c = h_config(2, 2);
    c.callback_timeout_ns = 30000000;
    harness h;
    h_init(&h, &c, 1, 5, H_NEVER);
    CHECK_EQ(h_run(&h, 0), TR_STOP_TIMEOUT);
    uint32_t t, p;
    uint64_t seq, handle;
    tr_loop_timeout_info(h.loop, &t, &p, &seq, &handle);
    CHECK(t < 2);
    CHECK_EQ(p, 0);
    CHECK_EQ(seq, 0);
    CHECK_EQ(handle, 0);
    CHECK_EQ(h.final_commits, 0);
    h_free(&h);
}

/* rule 19: an external stop wakes a parked loop; graceful: final commit of every task */
static void test_stop_wakes_parked_loop(void) {
    tr_loop_config c = h_config(3, 1);
    c.max_idle_ns = 10000000000LL; /* the idle re-poll must not be what wakes it */
    harness h;
    h_init(&h, &c, 1, UINT64_MAX, H_INLINE);
    delayed d = {h.loop, 0, &h};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, delayed_main, &d), 0);
    int64_t t0 = tr_now_ns();
    CHECK_EQ(h_run(&h, 0), TR_STOP_EXTERNAL);
    CHECK(tr_now_ns() - t0 < 2000000000LL);
    pthread_join(th, NULL);
    CHECK_EQ(h.final_commits, 3);
    for (uint32_t t = 0; t < 3; t++) {
        tr_mark m;
        CHECK_EQ(tr_loop_committed(h.loop, t, 0, &m), TR_OK);
        CHECK_EQ(m.position, 2); /* the live source gave 3 messages, all completed */
    }
    h_free(&h);
}

/* rule 16: an error posted from another thread stops the loop; the first error wins */
static void test_post_error(void) {
    tr_loop_config c = h_config(1, 1);
    harness h;
    h_init(&h, &c, 1, UINT64_MAX, H_INLINE);
    delayed d = {h.loop, 1, &h};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, delayed_main, &d), 0);
    CHECK_EQ(h_run(&h, 0), TR_STOP_ERROR);
    pthread_join(th, NULL);
    CHECK_EQ(tr_loop_post_error(h.loop, 0xbeef), TR_EALREADY);
    CHECK_EQ(tr_loop_take_error(h.loop), 0xdead);
    CHECK_EQ(tr_loop_take_error(h.loop), 0);
    CHECK_EQ(h.final_commits, 0);
    h_free(&h);
}

/* rule 14: the container stops once every task voted */
static void test_shutdown_votes(void) {
    tr_loop_config c = h_config(4, 1);
    harness h;
    h_init(&h, &c, 2, UINT64_MAX, H_INLINE);
    h.shutdown_after = 2;
    h.live_avail = 1000;
    CHECK_EQ(h_run(&h, 0), TR_STOP_SHUTDOWN);
    for (uint32_t t = 0; t < 4; t++)
        CHECK(h.next_proc[h_tp(&h, t, 0)] >= 3 || h.next_proc[h_tp(&h, t, 1)] >= 3);
    CHECK_EQ(h.final_commits, 4);
    h_free(&h);
}

/* rule 23: a user timer wakes the loop and runs like a window */
static void test_user_timer(void) {
    tr_loop_config c = h_config(2, 1);
    c.max_idle_ns = 10000000000LL;
    harness h;
    h_init(&h, &c, 1, UINT64_MAX, H_INLINE);
    tr_loop_set_user_timer(h.loop, 1, tr_now_ns() + 10000000);
    tr_loop_set_user_timer(h.loop, 0, tr_now_ns() + 5000000);
    tr_loop_set_user_timer(h.loop, 0, INT64_MAX); /* cancels task 0's */
    delayed d = {h.loop, 0, &h};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, delayed_main, &d), 0);
    CHECK_EQ(h_run(&h, 0), TR_STOP_EXTERNAL);
    pthread_join(th, NULL);
    CHECK_EQ(h.timers, 1);
    tr_task_stats ts;
    tr_loop_task_stats(h.loop, 1, &ts);
    CHECK_EQ(ts.timers, 1);
    tr_loop_task_stats(h.loop, 0, &ts);
    CHECK_EQ(ts.timers, 0);
    h_free(&h);
}

/* a task without partitions is at end of stream at once; bad configs are refused */
static void test_edges(void) {
    tr_loop_config c = h_config(2, 1);
    harness h;
    h_init(&h, &c, 0, 0, H_INLINE);
    CHECK_EQ(h_run(&h, 0), TR_STOP_END_OF_STREAM);
    CHECK_EQ(h.eos, 2);
    tr_loop_hooks hooks = {&h, h_run_batch, NULL, NULL, NULL};
    CHECK_EQ(tr_loop_run(h.loop, &hooks), TR_EINVAL); /* runs once */
    h_free(&h);
    tr_loop *L = NULL;
    tr_loop_task one = {1, 0};
    c = h_config(1, 0);
    CHECK_EQ(tr_loop_create(&c, &one, &L), TR_EINVAL);
    c = h_config(0, 1);
    CHECK_EQ(tr_loop_create(&c, &one, &L), TR_EINVAL);
    c = h_config(1, 1);
    c.input_buffer = 0;
    CHECK_EQ(tr_loop_create(&c, &one, &L), TR_EINVAL);
}

/* Runs (TR_TASK_INLINE): message 37 of 100 fails inside a run. The watermark
 * stays before it (rule 18), nothing after it is dispatched, the loop stops
 * with the error, and the items not taken are left for drain_items. */
typedef struct run_fail {
    harness h;
    uint64_t invoked, runs;
} run_fail;

static int run_fail_batch(void *ctx, tr_loop *loop) {
    run_fail *r = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        if (op.kind == TR_OP_REFILL) {
            uint64_t items[100], handles[100];
            uint64_t n = 100 - r->h.next_read[0];
            if (n > op.handle)
                n = op.handle;
            for (uint64_t i = 0; i < n; i++) {
                handles[i] = r->h.next_read[0] + i;
                items[i] = h_item(0, 0, handles[i]);
            }
            CHECK_EQ(tr_loop_push_inputs(loop, 0, 0, items, handles, n), TR_OK);
            r->h.next_read[0] += n;
            if (n == 0)
                tr_loop_partition_state(loop, 0, 0, TR_PART_ENDED);
            continue;
        }
        CHECK_EQ(op.kind, TR_OP_RUN);
        r->runs++;
        const uint64_t *items = (const uint64_t *)(uintptr_t)op.item;
        uint32_t i = 0;
        for (; i < op.count; i++) {
            uint32_t t, p;
            uint64_t idx;
            h_decode(items[i], &t, &p, &idx);
            CHECK_EQ(idx, r->invoked); /* rule 1 */
            r->invoked++;
            if (idx == 37) {
                CHECK_EQ(tr_loop_run_done(loop, 0, i + 1, i, 0), TR_OK);
                CHECK_EQ(tr_loop_post_error(loop, 0xbad), TR_OK);
                break;
            }
        }
        if (i == op.count)
            CHECK_EQ(tr_loop_run_done(loop, 0, i, i, 0), TR_OK);
    }
    return 0;
}

static void test_run_failure(void) {
    tr_loop_config c = h_config(1, 1);
    c.input_buffer = 50;
    run_fail r;
    memset(&r, 0, sizeof r);
    r.h.next_read = calloc(1, sizeof(uint64_t));
    tr_loop_task one = {1, TR_TASK_INLINE};
    CHECK_EQ(tr_loop_create(&c, &one, &r.h.loop), TR_OK);
    tr_loop_hooks hooks = {&r, run_fail_batch, NULL, NULL, NULL};
    CHECK_EQ(tr_loop_run(r.h.loop, &hooks), TR_OK);
    CHECK_EQ(tr_loop_stop_reason(r.h.loop), TR_STOP_ERROR);
    CHECK_EQ(tr_loop_take_error(r.h.loop), 0xbad);
    CHECK_EQ(r.invoked, 38);
    CHECK(r.runs >= 1);
    tr_mark m;
    CHECK_EQ(tr_loop_watermark(r.h.loop, 0, 0, &m), TR_OK);
    CHECK_EQ(m.position, 36); /* rule 18 */
    CHECK_EQ(m.handle, 36);
    tr_task_stats ts;
    tr_loop_task_stats(r.h.loop, 0, &ts);
    CHECK_EQ(ts.processed, 38);
    CHECK_EQ(ts.completed, 37);
    uint64_t items[64];
    uint64_t left = 0, n;
    while ((n = tr_loop_drain_items(r.h.loop, items, 64)) > 0) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t t, p;
            uint64_t idx;
            h_decode(items[i], &t, &p, &idx);
            CHECK(idx > 37 && idx < r.h.next_read[0]);
        }
        left += n;
    }
    CHECK_EQ(left, r.h.next_read[0] - 38); /* taken items are not drained again */
    tr_loop_destroy(r.h.loop);
    free(r.h.next_read);
}

/* rules 8, 23: a timer that a message of a run schedules due at once ends the
 * run; the timer runs before the next message. One scheduled far ahead does
 * not end it. */
typedef struct timer_run {
    harness h;
    uint64_t invoked, timer_ops,
        timer_after; /* timer_after: messages invoked before the timer op */
    int yielded_at_10, yielded_at_20;
} timer_run;

static int timer_run_batch(void *ctx, tr_loop *loop) {
    timer_run *r = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        if (op.kind == TR_OP_REFILL) {
            uint64_t items[100], handles[100];
            uint64_t n = 100 - r->h.next_read[0];
            if (n > op.handle)
                n = op.handle;
            for (uint64_t i = 0; i < n; i++) {
                handles[i] = r->h.next_read[0] + i;
                items[i] = h_item(0, 0, handles[i]);
            }
            CHECK_EQ(tr_loop_push_inputs(loop, 0, 0, items, handles, n), TR_OK);
            r->h.next_read[0] += n;
            if (n == 0)
                tr_loop_partition_state(loop, 0, 0, TR_PART_ENDED);
            continue;
        }
        if (op.kind != TR_OP_RUN) {
            if (op.kind == TR_OP_TIMER) {
                r->timer_ops++;
                r->timer_after = r->invoked;
            }
            tr_loop_control_done(loop, op.task, 0);
            continue;
        }
        const uint64_t *items = (const uint64_t *)(uintptr_t)op.item;
        uint32_t i = 0;
        for (; i < op.count; i++) {
            if (tr_loop_run_yield(loop))
                break;
            uint32_t t, p;
            uint64_t idx;
            h_decode(items[i], &t, &p, &idx);
            CHECK_EQ(idx, r->invoked); /* rule 1 */
            r->invoked++;
            if (idx == 10) {
                tr_loop_set_user_timer(loop, 0, tr_now_ns());
                r->yielded_at_10 = tr_loop_run_yield(loop);
            } else if (idx == 20) {
                tr_loop_set_user_timer(loop, 0, tr_now_ns() + 3600000000000LL);
                r->yielded_at_20 = tr_loop_run_yield(loop);
            }
        }
        CHECK_EQ(tr_loop_run_done(loop, 0, i, i, 0), TR_OK);
    }
    return 0;
}

static void test_timer_set_in_run(void) {
    tr_loop_config c = h_config(1, 1);
    c.input_buffer = 200;
    timer_run r;
    memset(&r, 0, sizeof r);
    r.h.next_read = calloc(1, sizeof(uint64_t));
    tr_loop_task one = {1, TR_TASK_INLINE};
    CHECK_EQ(tr_loop_create(&c, &one, &r.h.loop), TR_OK);
    tr_loop_hooks hooks = {&r, timer_run_batch, NULL, NULL, NULL};
    CHECK_EQ(tr_loop_run(r.h.loop, &hooks), TR_OK);
    CHECK_EQ(tr_loop_stop_reason(r.h.loop), TR_STOP_END_OF_STREAM);
    CHECK_EQ(r.invoked, 100);
    CHECK_EQ(r.yielded_at_10, 1);
    CHECK_EQ(r.yielded_at_20, 0);
    CHECK_EQ(r.timer_ops, 1);
    CHECK_EQ(r.timer_after, 11); /* before message 11 started */
    tr_loop_destroy(r.h.loop);
    free(r.h.next_read);
}

/* Rings start at the refill size (with many partitions, FILL_BUDGET split)
 * and grow on demand: partition 0 of 2048 takes pushes up to the full input
 * buffer (rule 6), mixing push_input and push_inputs, keeps them in order,
 * and refuses one more. */
static int grow_batch(void *ctx, tr_loop *loop) {
    int *pushed = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        if (op.kind == TR_OP_REFILL) {
            if (op.task != 0 || op.partition != 0 || *pushed)
                continue;
            uint64_t items[600], handles[600];
            for (uint64_t i = 0; i < 600; i++) {
                items[i] = h_item(0, 0, i);
                handles[i] = i;
            }
            CHECK_EQ(tr_loop_push_inputs(loop, 0, 0, items, handles, 30), TR_OK);
            for (uint64_t i = 30; i < 100; i++)
                CHECK_EQ(tr_loop_push_input(loop, 0, 0, h_item(0, 0, i), i), TR_OK);
            CHECK_EQ(tr_loop_push_inputs(loop, 0, 0, items + 100, handles + 100, 500), TR_OK);
            for (uint64_t i = 600; i < 1000; i++)
                CHECK_EQ(tr_loop_push_input(loop, 0, 0, h_item(0, 0, i), i), TR_OK);
            CHECK_EQ(tr_loop_push_input(loop, 0, 0, h_item(0, 0, 1000), 1000), TR_EAGAIN);
            CHECK_EQ(tr_loop_push_inputs(loop, 0, 0, items, handles, 1), TR_EAGAIN);
            *pushed = 1;
            tr_loop_stop(loop);
        } else if (op.kind == TR_OP_COMMIT) {
            tr_loop_control_done(loop, op.task, 0);
        } else {
            CHECK(0); /* nothing runs: the stop came with the first batch */
        }
    }
    return 0;
}

static void test_ring_growth(void) {
    tr_loop_config c = h_config(1, 1);
    c.input_buffer = 1000;
    tr_loop_task one = {2048, TR_TASK_INLINE};
    tr_loop *L = NULL;
    CHECK_EQ(tr_loop_create(&c, &one, &L), TR_OK);
    int pushed = 0;
    tr_loop_hooks hooks = {&pushed, grow_batch, NULL, NULL, NULL};
    CHECK_EQ(tr_loop_run(L, &hooks), TR_OK);
    CHECK_EQ(pushed, 1);
    uint64_t out[64], n, seen = 0;
    while ((n = tr_loop_drain_items(L, out, 64)) != 0) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t t, p;
            uint64_t idx;
            h_decode(out[i], &t, &p, &idx);
            CHECK_EQ(p, 0);
            CHECK_EQ(idx, seen); /* rule 1: in order across the growths */
            seen++;
        }
    }
    CHECK_EQ(seen, 1000);
    tr_loop_destroy(L);
}

/* tr_loop_partition_fill: with 2048 partitions each one starts at a share of
 * FILL_BUDGET; raised to the input buffer, the partition is refilled at once
 * up to it (clamped to the limit), and unknown partitions are refused. */
typedef struct fill_state {
    int refills;
    uint64_t pushed, ran;
} fill_state;

static int fill_batch(void *ctx, tr_loop *loop) {
    fill_state *f = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        if (op.kind == TR_OP_COMMIT) {
            tr_loop_control_done(loop, op.task, 0);
            continue;
        }
        if (op.kind == TR_OP_RUN) {
            const uint64_t *items = (const uint64_t *)(uintptr_t)op.item;
            for (uint32_t i = 0; i < op.count; i++) {
                uint32_t t, p;
                uint64_t idx;
                h_decode(items[i], &t, &p, &idx);
                CHECK_EQ(idx, f->ran); /* rule 1 */
                f->ran++;
            }
            CHECK_EQ(tr_loop_run_done(loop, op.task, op.count, op.count, 0), TR_OK);
            continue;
        }
        CHECK_EQ(op.kind, TR_OP_REFILL);
        if (op.partition != 0 || f->refills == 2)
            continue;
        uint64_t items[1000], handles[1000];
        /* first: the share of the budget (65536 / 2048, at least a run: 64), then
         * up to the raised fill */
        CHECK_EQ(op.handle, f->refills == 0 ? 64u : 1000u - (f->pushed - f->ran));
        for (uint64_t i = 0; i < op.handle; i++) {
            handles[i] = f->pushed + i;
            items[i] = h_item(0, 0, handles[i]);
        }
        CHECK_EQ(tr_loop_push_inputs(loop, 0, 0, items, handles, op.handle), TR_OK);
        f->pushed += op.handle;
        if (++f->refills == 1) {
            CHECK_EQ(tr_loop_partition_fill(loop, 0, 2048, 10), TR_EINVAL);
            CHECK_EQ(tr_loop_partition_fill(loop, 1, 0, 10), TR_EINVAL);
            CHECK_EQ(tr_loop_partition_fill(loop, 0, 0, 5000), TR_OK); /* clamped to 1000 */
        } else {
            tr_loop_stop(loop);
        }
    }
    return 0;
}

static void test_partition_fill(void) {
    tr_loop_config c = h_config(1, 1);
    c.input_buffer = 1000;
    tr_loop_task one = {2048, TR_TASK_INLINE};
    tr_loop *L = NULL;
    CHECK_EQ(tr_loop_create(&c, &one, &L), TR_OK);
    fill_state f = {0, 0, 0};
    tr_loop_hooks hooks = {&f, fill_batch, NULL, NULL, NULL};
    CHECK_EQ(tr_loop_run(L, &hooks), TR_OK);
    CHECK_EQ(f.refills, 2);
    CHECK(f.pushed > 1000 - 64); /* the second poll asked for more than the share */
    uint64_t out[64], n, seen = f.ran;
    while ((n = tr_loop_drain_items(L, out, 64)) != 0) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t t, p;
            uint64_t idx;
            h_decode(out[i], &t, &p, &idx);
            CHECK_EQ(idx, seen); /* in order, nothing lost */
            seen++;
        }
    }
    CHECK_EQ(seen, f.pushed);
    tr_loop_destroy(L);
}

/* Rule 5 under timers: two inline tasks whose commits fall due together and
 * take long (as a checkpoint store that waits for a broker does). The run that
 * comes first in a batch takes every message until the next commit is due, so
 * the other task's RUN op would end before its first message, batch after
 * batch, and that task starve until the first one ran dry. A run cut before
 * its first message keeps its turn: the two tasks alternate. */
typedef struct fair_run {
    tr_loop *loop;
    uint64_t next_read[2];
    uint64_t invoked[2];
    uint64_t at_end_of_1;     /* task 0's messages invoked when task 1 invoked its last */
    uint64_t streak, longest; /* messages of one task in a row while the other had input */
    uint32_t last;
} fair_run;

#define FAIR_MSGS 120u

static int fair_run_batch(void *ctx, tr_loop *loop) {
    fair_run *r = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        uint32_t t = op.task;
        if (op.kind == TR_OP_REFILL) {
            uint64_t items[FAIR_MSGS], handles[FAIR_MSGS];
            uint64_t n = FAIR_MSGS - r->next_read[t];
            if (n > op.handle)
                n = op.handle;
            for (uint64_t i = 0; i < n; i++) {
                handles[i] = r->next_read[t] + i;
                items[i] = h_item(t, 0, handles[i]);
            }
            CHECK_EQ(tr_loop_push_inputs(loop, t, 0, items, handles, n), TR_OK);
            r->next_read[t] += n;
            if (n == 0)
                tr_loop_partition_state(loop, t, 0, TR_PART_ENDED);
            continue;
        }
        if (op.kind != TR_OP_RUN) {
            if (op.kind == TR_OP_COMMIT && !(op.flags & TR_OPF_FINAL))
                usleep(4000); /* a slow checkpoint write, on the loop thread */
            tr_loop_control_done(loop, t, 0);
            continue;
        }
        const uint64_t *items = (const uint64_t *)(uintptr_t)op.item;
        uint32_t i = 0;
        for (; i < op.count; i++) {
            if (tr_loop_run_yield(loop))
                break;
            uint32_t tt, p;
            uint64_t idx;
            h_decode(items[i], &tt, &p, &idx);
            CHECK_EQ(tt, t);
            CHECK_EQ(idx, r->invoked[t]); /* rule 1 */
            usleep(500);
            r->invoked[t]++;
            if (r->invoked[1 - t] < FAIR_MSGS) {
                r->streak = r->last == t ? r->streak + 1 : 1;
                if (r->streak > r->longest)
                    r->longest = r->streak;
            }
            r->last = t;
            if (t == 1 && r->invoked[1] == FAIR_MSGS)
                r->at_end_of_1 = r->invoked[0];
        }
        CHECK_EQ(tr_loop_run_done(loop, t, i, i, 0), TR_OK);
    }
    return 0;
}

static void test_cut_runs_keep_their_turn(void) {
    tr_loop_config c = h_config(2, 1);
    c.input_buffer = FAIR_MSGS;
    c.commit_ns = 10000000; /* both tasks' commits due every 10 ms, together */
    fair_run r;
    memset(&r, 0, sizeof r);
    r.last = UINT32_MAX;
    tr_loop_task two[2] = {{1, TR_TASK_INLINE}, {1, TR_TASK_INLINE}};
    CHECK_EQ(tr_loop_create(&c, two, &r.loop), TR_OK);
    tr_loop_hooks hooks = {&r, fair_run_batch, NULL, NULL, NULL};
    CHECK_EQ(tr_loop_run(r.loop, &hooks), TR_OK);
    CHECK_EQ(tr_loop_stop_reason(r.loop), TR_STOP_END_OF_STREAM);
    CHECK_EQ(r.invoked[0], FAIR_MSGS);
    CHECK_EQ(r.invoked[1], FAIR_MSGS);
    /* each run lasts a commit interval at most (~12 messages of 0.5 ms after a
     * 4 ms commit); starving, one task would run all of its 120 in a row */
    if (r.longest > 3 * TR_RUN_MAX / 2 || (r.at_end_of_1 && r.at_end_of_1 < FAIR_MSGS / 2)) {
        fprintf(stderr, "unfair: longest streak %llu, task 0 at %llu when task 1 ended\n",
                (unsigned long long)r.longest, (unsigned long long)r.at_end_of_1);
        CHECK(0);
    }
    tr_loop_destroy(r.loop);
}

/* Rule 33 in a sync run (tr_loop_event_seen_run): one task reading two partitions hands
 * their messages over in runs, timestamps out of order, and its watermark is recomputed
 * only when read. Read on the loop thread after every message, it is what a recompute
 * after every message gives: max(previous, min over both of the largest handed over -
 * lag). Reader threads meanwhile see it from outside (as of the last recompute): never
 * backwards, never ahead of what the loop thread last read. Both partitions end: +inf. */
#define ET_N 3000
#define ET_LAG 40
#define ET_READERS 2

typedef struct et_run {
    tr_loop *loop;
    uint64_t next_read[2];
    int64_t seen[2], expected;
    _Atomic int running;
    uint64_t handed, runs;
} et_run;

static int64_t et_ts(uint32_t p, uint64_t idx) {
    /* out of order within 100 ms: a zigzag per partition, partition 1 behind */
    return 1000000 + (int64_t)idx * 10 + (int64_t)((idx * 7919) % 97) - (int64_t)p * 300;
}

static int et_run_batch(void *ctx, tr_loop *loop) {
    et_run *r = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        if (op.kind == TR_OP_REFILL) {
            uint32_t p = op.partition;
            uint64_t items[64], handles[64];
            uint64_t n = ET_N - r->next_read[p];
            if (n > op.handle)
                n = op.handle;
            if (n > 64)
                n = 64;
            int64_t newest = TR_ET_NONE;
            for (uint64_t i = 0; i < n; i++) {
                handles[i] = r->next_read[p] + i;
                items[i] = h_item(0, p, handles[i]);
                if (et_ts(p, handles[i]) > newest)
                    newest = et_ts(p, handles[i]);
            }
            if (n) {
                CHECK_EQ(tr_loop_push_inputs(loop, 0, p, items, handles, n), TR_OK);
                CHECK_EQ(tr_loop_event_time_read(loop, 0, p, newest, n), TR_OK);
            }
            r->next_read[p] += n;
            if (n == 0)
                tr_loop_partition_state(loop, 0, p, TR_PART_ENDED);
            continue;
        }
        if (op.kind != TR_OP_RUN) {
            if (op.kind == TR_OP_END_OF_STREAM) /* rule 37: +infinity before end_of_stream */
                CHECK_EQ(tr_loop_event_watermark(loop, 0), TR_ET_END);
            tr_loop_control_done(loop, 0, 0);
            continue;
        }
        r->runs++;
        const uint64_t *items = (const uint64_t *)(uintptr_t)op.item;
        for (uint32_t i = 0; i < op.count; i++) {
            uint32_t t, p;
            uint64_t idx;
            h_decode(items[i], &t, &p, &idx);
            int64_t ts = et_ts(p, idx);
            CHECK_EQ(tr_loop_event_seen_run(loop, 0, i, ts), 0); /* no event-time timer */
            if (ts > r->seen[p])
                r->seen[p] = ts;
            if (r->seen[0] != TR_ET_NONE && r->seen[1] != TR_ET_NONE) {
                int64_t low = (r->seen[0] < r->seen[1] ? r->seen[0] : r->seen[1]) - ET_LAG;
                if (low > r->expected)
                    r->expected = low;
            }
            int64_t w = tr_loop_event_watermark(loop, 0); /* the loop thread: recomputed */
            CHECK_EQ(w, r->expected);
            r->handed++;
        }
        CHECK_EQ(tr_loop_run_done(loop, 0, op.count, op.count, 0), TR_OK);
    }
    return 0;
}

static void *et_reader(void *arg) {
    et_run *r = arg;
    int64_t last = TR_ET_NONE;
    while (atomic_load_explicit(&r->running, memory_order_acquire)) {
        /* as of the last recompute (the end of a run at the latest) */
        int64_t w = tr_loop_event_watermark(r->loop, 0);
        CHECK(w >= last);
        CHECK(w == TR_ET_END || w <= 1000000 + (int64_t)ET_N * 10 + 97 - ET_LAG);
        last = w;
    }
    return NULL;
}

static void test_event_seen_run_recomputes_when_read(void) {
    tr_loop_config c = h_config(1, 1);
    c.input_buffer = 128;
    c.event_lag_ms = ET_LAG;
    c.event_idle_ns = 0;
    et_run r;
    memset(&r, 0, sizeof r);
    r.seen[0] = r.seen[1] = r.expected = TR_ET_NONE;
    tr_loop_task one = {2, TR_TASK_INLINE | TR_TASK_EVENT_TRACK};
    CHECK_EQ(tr_loop_create(&c, &one, &r.loop), TR_OK);
    atomic_store(&r.running, 1);
    pthread_t th[ET_READERS];
    for (int i = 0; i < ET_READERS; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, et_reader, &r), 0);
    tr_loop_hooks hooks = {&r, et_run_batch, NULL, NULL, NULL};
    CHECK_EQ(tr_loop_run(r.loop, &hooks), TR_OK);
    atomic_store(&r.running, 0);
    for (int i = 0; i < ET_READERS; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(tr_loop_stop_reason(r.loop), TR_STOP_END_OF_STREAM);
    CHECK_EQ(r.handed, 2 * ET_N);
    CHECK(r.runs < r.handed); /* runs of many messages: the recompute waited within them */
    CHECK_EQ(tr_loop_event_watermark(r.loop, 0), TR_ET_END); /* rule 37, after the run */
    tr_loop_destroy(r.loop);
}

int main(void) {
    test_callback_timeout();
    test_stop_wakes_parked_loop();
    test_post_error();
    test_shutdown_votes();
    test_user_timer();
    test_edges();
    test_run_failure();
    test_timer_set_in_run();
    test_ring_growth();
    test_partition_fill();
    test_cut_runs_keep_their_turn();
    test_event_seen_run_recomputes_when_read();
    printf("test_loop: ok\n");
    return 0;
}
