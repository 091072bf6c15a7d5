/* stress_loop: the dispatch loop under random out-of-order completion from
 * several threads, inline completion, and the worker pool, checked for meaning
 * by the fake binding in loop_harness.h (order, concurrency bound, no loss, no
 * duplicates, watermark never ahead of completion, exact commit prefixes). */
#include "loop_harness.h"

#include <stdio.h>

static void scenario(const char *name, tr_loop_config cfg, uint32_t nparts, uint64_t nmsgs,
                     int mode, int completers, uint32_t commit_every) {
    harness h;
    h_init(&h, &cfg, nparts, nmsgs, mode);
    h.commit_every = commit_every;
    int64_t t0 = tr_now_ns();
    tr_stop_reason r = h_run(&h, completers);
    CHECK_EQ(r, TR_STOP_END_OF_STREAM);
    h_check_all_done(&h);
    tr_loop_stats ls;
    tr_loop_get_stats(h.loop, &ls);
    CHECK_EQ(ls.envelopes_chosen, (uint64_t)cfg.ntasks * nparts * nmsgs);
    for (uint32_t t = 0; t < cfg.ntasks; t++) {
        tr_task_stats ts;
        tr_loop_task_stats(h.loop, t, &ts);
        CHECK_EQ(ts.processed, (uint64_t)nparts * nmsgs);
        CHECK_EQ(ts.completed, (uint64_t)nparts * nmsgs);
        CHECK_EQ(ts.done, 1);
    }
    printf("%-28s %8llu msgs  %6.1f ms  windows %llu commits %llu doubles %llu wakeups %llu\n",
           name, (unsigned long long)atomic_load(&h.processed), (double)(tr_now_ns() - t0) / 1e6,
           (unsigned long long)h.windows, (unsigned long long)h.commits,
           (unsigned long long)atomic_load(&h.doubles), (unsigned long long)ls.idle_wakeups);
    h_free(&h);
}

int main(int argc, char **argv) {
    double scale = tr_test_scale(argc, argv);
    tr_loop_config c;

    c = h_config(64, 1);
    c.window_ns = 1000000;
    c.commit_ns = 2000000;
    scenario("inline 64 tasks", c, 2, tr_test_scaled(2000, scale), H_INLINE, 0, 0);

    c = h_config(64, 1);
    c.window_ns = 1000000;
    c.commit_ns = 2000000;
    c.input_buffer = 100;
    scenario("runs 64 tasks", c, 2, tr_test_scaled(3000, scale), H_RUN, 0, 0);

    c = h_config(4, 3);
    c.input_buffer = 200;
    scenario("inline, commit requests", c, 1, tr_test_scaled(3000, scale), H_INLINE, 0, 11);

    c = h_config(4, 2);
    c.input_buffer = 200;
    scenario("runs, commit requests", c, 1, tr_test_scaled(3000, scale), H_RUN, 0, 13);

    c = h_config(4, 1);
    c.input_buffer = 200;
    c.async_commit = 1;
    scenario("runs, async commit requests", c, 1, tr_test_scaled(3000, scale), H_RUN, 0, 9);

    c = h_config(16, 8);
    scenario("threads, commit requests", c, 1, tr_test_scaled(3000, scale), H_THREADS, 3, 7);

    c = h_config(8, 64);
    c.window_ns = 1000000;
    c.commit_ns = 1500000;
    c.async_commit = 1;
    c.input_buffer = 100;
    scenario("threads, async commit", c, 3, tr_test_scaled(3000, scale), H_THREADS, 3, 0);

    c = h_config(8, 4);
    c.window_ns = 500000;
    c.commit_ns = 700000;
    scenario("threads, windows", c, 2, tr_test_scaled(2000, scale), H_THREADS, 2, 0);

    c = h_config(10, 1);
    c.pool_size = 3;
    c.window_ns = 2000000;
    c.commit_ns = 3000000;
    scenario("pool of 3", c, 2, tr_test_scaled(2000, scale), H_POOL, 0, 0);

    c = h_config(6, 4);
    c.pool_size = 2;
    scenario("pool, commit requests", c, 1, tr_test_scaled(2000, scale), H_POOL, 0, 5);
    printf("stress_loop: ok\n");
    return 0;
}
