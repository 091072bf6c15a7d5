/* loop_harness.h: a pure-C fake binding for tr_loop tests.
 *
 * Items are (task, partition, index) packed into one word; the offset handle of
 * a message is its index, so watermark positions and handles must agree. The
 * harness checks, as the loop hands it operations:
 *   - rule 1: process invoked in index order per partition, each message once;
 *   - rule 2: at most max_concurrency invoked-and-incomplete per task;
 *   - rules 8/9/23: window, commit (unless async) and timers only with nothing incomplete;
 *   - rules 12/13: every watermark covers only completed messages, never moves back;
 *   - rule 15: with commit requests and no timer commits, each commit covers
 *     exactly the prefix up to the message that asked for it (one partition);
 *   - rule 21 (pool): process of one task never runs concurrently with itself.
 * Completion modes: inline on the loop thread, by completer threads in random
 * order (with deliberate double completions), on the loop's worker pool, or as
 * TR_TASK_INLINE tasks taking RUN ops (refilled with push_inputs; a run ends
 * right after a message that made a request, rule 15).
 */
#ifndef TR_LOOP_HARNESS_H
#define TR_LOOP_HARNESS_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tailrace/clock.h"
#include "tailrace/loop.h"
#include "tr_test.h"

enum { H_INLINE = 0, H_THREADS = 1, H_POOL = 2, H_NEVER = 3, H_RUN = 4 };

typedef struct h_pending {
    uint32_t task, part;
    uint64_t idx, seq;
    uint32_t req;
} h_pending;

typedef struct harness {
    tr_loop *loop;
    uint32_t ntasks, nparts, maxc;
    uint64_t nmsgs; /* per partition; UINT64_MAX: live (never ends) */
    int mode;
    int async_commit;
    uint32_t commit_every;   /* request a commit on every k-th message (0: never) */
    uint64_t shutdown_after; /* request SHUTDOWN_CURRENT at this index (0: never) */
    uint64_t live_avail;     /* live source: messages available per partition */
    _Atomic uint8_t *state;  /* [task][part][idx]: 0 new, 1 invoked, 2 completed */
    uint64_t *next_read, *next_proc, *checked, *wm_last;
    _Atomic int64_t *incomplete;
    _Atomic int *running;
    _Atomic uint8_t *commit_wait; /* [task]: a requested commit must run before the next process */
    uint64_t *req_fifo;           /* per task: requested commit positions (ring of 4096) */
    uint64_t *req_head, *req_tail;
    pthread_mutex_t mu;
    h_pending *pending;
    size_t npending, cap;
    _Atomic int quit;
    _Atomic uint64_t doubles, processed;
    uint64_t windows, commits, timers, eos, final_commits;
    uint64_t rng;
} harness;

static inline uint64_t h_item(uint32_t t, uint32_t p, uint64_t idx) {
    return ((uint64_t)t << 44) | ((uint64_t)p << 30) | (idx + 1);
}
static inline void h_decode(uint64_t item, uint32_t *t, uint32_t *p, uint64_t *idx) {
    *t = (uint32_t)(item >> 44);
    *p = (uint32_t)((item >> 30) & 0x3fff);
    *idx = (item & ((1ull << 30) - 1)) - 1;
}
static inline size_t h_tp(const harness *h, uint32_t t, uint32_t p) {
    return (size_t)t * h->nparts + p;
}
static inline size_t h_slot(const harness *h, uint32_t t, uint32_t p, uint64_t idx) {
    return h_tp(h, t, p) * (size_t)h->cap + idx; /* cap doubles as per-partition message room */
}

static void h_check_watermarks(harness *h, uint32_t t, int final, int eos) {
    for (uint32_t p = 0; p < h->nparts; p++) {
        tr_mark m;
        tr_status st = tr_loop_watermark(h->loop, t, p, &m);
        size_t tp = h_tp(h, t, p);
        if (st == TR_EAGAIN) {
            CHECK(!(final && eos && h->nmsgs > 0));
            continue;
        }
        CHECK_EQ(st, TR_OK);
        CHECK_EQ(m.handle, m.position);          /* handle = index = read position */
        CHECK(m.position + 1 >= h->wm_last[tp]); /* never backwards */
        h->wm_last[tp] = m.position + 1;
        /* rules 12/13: everything up to the watermark has completed */
        while (h->checked[tp] <= m.position) {
            CHECK_EQ(atomic_load(&h->state[h_slot(h, t, p, h->checked[tp])]), 2);
            h->checked[tp]++;
        }
        if (final && eos)
            CHECK_EQ(m.position, h->nmsgs - 1);
        tr_status cs = tr_loop_mark_committed(h->loop, t, p, m);
        CHECK(cs == TR_OK || cs == TR_EREGRESS);
    }
}

static void h_complete(harness *h, uint32_t t, uint32_t p, uint64_t idx, uint64_t seq, uint32_t req,
                       int local) {
    atomic_store(&h->state[h_slot(h, t, p, idx)], 2);
    atomic_fetch_sub(&h->incomplete[t], 1);
    tr_status st = local ? tr_loop_complete_local(h->loop, t, seq, req)
                         : tr_loop_complete(h->loop, t, seq, req);
    CHECK_EQ(st, TR_OK);
}

static uint32_t h_requests(harness *h, uint32_t t, uint64_t idx) {
    uint32_t req = 0;
    if (h->commit_every && idx % h->commit_every == h->commit_every - 1) {
        req |= TR_REQ_COMMIT_CURRENT;
        h->req_fifo[(size_t)t * 4096 + (h->req_tail[t]++ % 4096)] = idx;
        /* with one message out at a time (or on the pool, which runs a task's
         * messages one by one), nothing more of this task may run before it */
        if (!h->async_commit && (h->mode == H_POOL || h->maxc == 1))
            atomic_store(&h->commit_wait[t], 1);
    }
    if (h->shutdown_after && idx == h->shutdown_after)
        req |= TR_REQ_SHUTDOWN_CURRENT;
    return req;
}

static void h_invoke(harness *h, uint32_t t, uint32_t p, uint64_t idx) {
    size_t tp = h_tp(h, t, p);
    CHECK_EQ(idx, h->next_proc[tp]); /* rule 1 */
    h->next_proc[tp]++;
    uint8_t zero = 0;
    CHECK(atomic_compare_exchange_strong(&h->state[h_slot(h, t, p, idx)], &zero, 1));
    CHECK_EQ(atomic_load(&h->commit_wait[t]), 0); /* rule 9: commit blocks new dispatch */
    int64_t inc = atomic_fetch_add(&h->incomplete[t], 1) + 1;
    CHECK(inc >= 1 && inc <= (int64_t)h->maxc); /* rule 2 */
    atomic_fetch_add(&h->processed, 1);
}

static int h_run_batch(void *ctx, tr_loop *loop) {
    harness *h = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        uint32_t t = op.task, p, tt;
        uint64_t idx;
        switch (op.kind) {
        case TR_OP_REFILL: {
            size_t tp = h_tp(h, t, op.partition);
            uint64_t avail = h->nmsgs == UINT64_MAX ? h->live_avail : h->nmsgs;
            uint64_t n = avail - h->next_read[tp];
            if (n > op.handle)
                n = op.handle;
            if (h->mode == H_RUN) {
                uint64_t items[64], handles[64];
                for (uint64_t done = 0; done < n;) {
                    size_t m = n - done < 64 ? (size_t)(n - done) : 64;
                    for (size_t i = 0; i < m; i++) {
                        handles[i] = h->next_read[tp] + i;
                        items[i] = h_item(t, op.partition, handles[i]);
                    }
                    CHECK_EQ(tr_loop_push_inputs(loop, t, op.partition, items, handles, m), TR_OK);
                    h->next_read[tp] += m;
                    done += m;
                }
                if (n) /* the ring is full now: one more does not fit */
                    CHECK_EQ(tr_loop_push_inputs(loop, t, op.partition, items, handles,
                                                 op.handle - n + 1),
                             TR_EAGAIN);
            } else {
                for (uint64_t i = 0; i < n; i++) {
                    uint64_t k = h->next_read[tp]++;
                    CHECK_EQ(
                        tr_loop_push_input(loop, t, op.partition, h_item(t, op.partition, k), k),
                        TR_OK);
                }
            }
            if (n == 0)
                tr_loop_partition_state(loop, t, op.partition,
                                        h->nmsgs == UINT64_MAX ? TR_PART_IDLE : TR_PART_ENDED);
            break;
        }
        case TR_OP_PROCESS: {
            h_decode(op.item, &tt, &p, &idx);
            CHECK_EQ(tt, t);
            CHECK_EQ(p, op.partition);
            CHECK_EQ(op.handle, idx);
            h_invoke(h, t, p, idx);
            uint32_t req = h_requests(h, t, idx);
            if (h->mode == H_INLINE || h->mode == H_RUN) {
                h_complete(h, t, p, idx, op.seq, req, 1);
                /* completed inline: the same task's next message, if it may take one */
                while (tr_loop_next_of_task(loop, t, &op)) {
                    CHECK_EQ(op.kind, TR_OP_PROCESS);
                    CHECK_EQ(op.task, t);
                    h_decode(op.item, &tt, &p, &idx);
                    CHECK_EQ(tt, t);
                    CHECK_EQ(p, op.partition);
                    CHECK_EQ(op.handle, idx);
                    h_invoke(h, t, p, idx);
                    req = h_requests(h, t, idx);
                    h_complete(h, t, p, idx, op.seq, req, 1);
                }
            } else if (h->mode == H_THREADS) {
                pthread_mutex_lock(&h->mu);
                CHECK(h->npending < h->cap * 4 + (size_t)h->ntasks * h->maxc);
                h->pending[h->npending++] = (h_pending){t, p, idx, op.seq, req};
                pthread_mutex_unlock(&h->mu);
            }
            break;
        }
        case TR_OP_RUN: {
            CHECK_EQ(h->mode, H_RUN);
            CHECK(op.count >= 1 && op.count <= TR_RUN_MAX);
            CHECK_EQ(atomic_load(&h->incomplete[t]), 0); /* rule 2: nothing outstanding */
            const uint64_t *items = (const uint64_t *)(uintptr_t)op.item;
            uint32_t done = 0, req = 0;
            int escaped = 0;
            while (done < op.count && req == 0) {
                h_decode(items[done], &tt, &p, &idx);
                CHECK_EQ(tt, t);
                CHECK(p < h->nparts && (done > 0 || p == op.partition));
                h_invoke(h, t, p, idx);
                req = h_requests(h, t, idx);
                done++;
                if (idx % 5 == 2) {
                    /* an async callback that escaped the run: sequenced now,
                     * completed after (inline here) */
                    uint64_t seq;
                    CHECK_EQ(tr_loop_run_escape(loop, t, done, &seq), TR_OK);
                    h_complete(h, t, p, idx, seq, req, 1);
                    escaped = 1;
                    break;
                }
                atomic_store(&h->state[h_slot(h, t, p, idx)], 2);
                atomic_fetch_sub(&h->incomplete[t], 1);
            }
            if (!escaped)
                CHECK_EQ(tr_loop_run_done(loop, t, done, done, req), TR_OK);
            CHECK_EQ(tr_loop_run_done(loop, t, 0, 0, 0), TR_EINVAL); /* no run open */
            break;
        }
        case TR_OP_WINDOW:
            CHECK_EQ(atomic_load(&h->incomplete[t]), 0); /* rule 8 */
            h->windows++;
            tr_loop_control_done(loop, t, 0);
            break;
        case TR_OP_TIMER:
            CHECK_EQ(atomic_load(&h->incomplete[t]), 0); /* rule 23 */
            h->timers++;
            tr_loop_control_done(loop, t, 0);
            break;
        case TR_OP_COMMIT:
            if (op.flags & TR_OPF_FINAL) {
                h_check_watermarks(h, t, 1, tr_loop_stop_reason(loop) == TR_STOP_END_OF_STREAM);
                h->final_commits++;
            } else {
                if (!h->async_commit)
                    CHECK_EQ(atomic_load(&h->incomplete[t]), 0); /* rule 9 */
                h_check_watermarks(h, t, 0, 0);
                if (h->commit_every && h->nparts == 1 && h->req_head[t] < h->req_tail[t]) {
                    /* rule 15: exactly the prefix up to the requesting message */
                    tr_mark m;
                    CHECK_EQ(tr_loop_watermark(loop, t, 0, &m), TR_OK);
                    CHECK_EQ(m.position, h->req_fifo[(size_t)t * 4096 + (h->req_head[t]++ % 4096)]);
                }
                h->commits++;
                atomic_store(&h->commit_wait[t], 0);
            }
            tr_loop_control_done(loop, t, 0);
            break;
        case TR_OP_END_OF_STREAM:
            CHECK_EQ(atomic_load(&h->incomplete[t]), 0); /* rule 11 */
            for (uint32_t q = 0; q < h->nparts; q++)
                CHECK_EQ(h->next_proc[h_tp(h, t, q)], h->nmsgs);
            h->eos++;
            tr_loop_control_done(loop, t, 0);
            break;
        default:
            CHECK(0);
        }
    }
    return 0;
}

static void h_run_pool_batch(void *ctx, tr_loop *loop, uint32_t worker) {
    harness *h = ctx;
    tr_op op;
    while (tr_loop_pool_next(loop, worker, &op)) {
        if (op.flags & TR_OPF_DISCARD)
            continue;
        uint32_t t, p;
        uint64_t idx;
        h_decode(op.item, &t, &p, &idx);
        CHECK_EQ(t, op.task);
        CHECK_EQ(atomic_exchange(&h->running[t], 1), 0); /* rule 21 */
        h_invoke(h, t, p, idx);
        uint32_t req = h_requests(h, t, idx);
        atomic_store(&h->running[t], 0);
        atomic_store(&h->state[h_slot(h, t, p, idx)], 2);
        atomic_fetch_sub(&h->incomplete[t], 1);
        CHECK_EQ(tr_loop_pool_done(loop, worker, &op, req), TR_OK);
    }
}

static void *h_completer(void *arg) {
    harness *h = arg;
    uint64_t rng = (uint64_t)(uintptr_t)&rng ^ 0x9e3779b97f4a7c15ull;
    for (;;) {
        pthread_mutex_lock(&h->mu);
        if (h->npending == 0) {
            pthread_mutex_unlock(&h->mu);
            if (atomic_load(&h->quit))
                return NULL;
            sched_yield();
            continue;
        }
        size_t k = (size_t)(tr_test_rand(&rng) % h->npending);
        h_pending e = h->pending[k];
        h->pending[k] = h->pending[--h->npending];
        pthread_mutex_unlock(&h->mu);
        h_complete(h, e.task, e.part, e.idx, e.seq, e.req, 0);
        if (tr_test_rand(&rng) % 16 == 0) { /* rule 17: a second resolution loses */
            tr_status st = tr_test_rand(&rng) % 2 ? tr_loop_complete(h->loop, e.task, e.seq, 0)
                                                  : tr_loop_fail(h->loop, e.task, e.seq);
            CHECK_EQ(st, TR_EALREADY);
            atomic_fetch_add(&h->doubles, 1);
        }
    }
}

static void h_init(harness *h, tr_loop_config *cfg, uint32_t nparts, uint64_t nmsgs, int mode) {
    memset(h, 0, sizeof *h);
    h->ntasks = cfg->ntasks;
    h->nparts = nparts;
    h->maxc = cfg->max_concurrency;
    h->nmsgs = nmsgs;
    h->mode = mode;
    h->live_avail = 3;
    h->async_commit = cfg->async_commit;
    h->cap = (size_t)(nmsgs == UINT64_MAX ? 1u << 16 : nmsgs) + 1;
    size_t ntp = (size_t)cfg->ntasks * nparts;
    h->state = calloc(ntp * h->cap, 1);
    h->next_read = calloc(ntp, sizeof(uint64_t));
    h->next_proc = calloc(ntp, sizeof(uint64_t));
    h->checked = calloc(ntp, sizeof(uint64_t));
    h->wm_last = calloc(ntp, sizeof(uint64_t));
    h->incomplete = calloc(cfg->ntasks, sizeof *h->incomplete);
    h->running = calloc(cfg->ntasks, sizeof *h->running);
    h->commit_wait = calloc(cfg->ntasks, sizeof *h->commit_wait);
    h->req_fifo = calloc((size_t)cfg->ntasks * 4096, sizeof(uint64_t));
    h->req_head = calloc(cfg->ntasks, sizeof(uint64_t));
    h->req_tail = calloc(cfg->ntasks, sizeof(uint64_t));
    h->pending =
        calloc(h->cap * 4 + (size_t)cfg->ntasks * cfg->max_concurrency, sizeof *h->pending);
    pthread_mutex_init(&h->mu, NULL);
    tr_loop_task *tasks = calloc(cfg->ntasks, sizeof *tasks);
    for (uint32_t t = 0; t < cfg->ntasks; t++) {
        tasks[t].npartitions = nparts;
        tasks[t].flags = TR_TASK_WINDOW | (mode == H_POOL ? TR_TASK_POOL : 0) |
                         (mode == H_RUN ? TR_TASK_INLINE : 0);
    }
    CHECK_EQ(tr_loop_create(cfg, tasks, &h->loop), TR_OK);
    free(tasks);
}

static tr_stop_reason h_run(harness *h, int ncompleters) {
    pthread_t th[8];
    for (int i = 0; i < ncompleters; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, h_completer, h), 0);
    tr_loop_hooks hooks = {h, h_run_batch, h_run_pool_batch, NULL, NULL};
    CHECK_EQ(tr_loop_run(h->loop, &hooks), TR_OK);
    atomic_store(&h->quit, 1);
    for (int i = 0; i < ncompleters; i++)
        pthread_join(th[i], NULL);
    uint64_t items[64];
    while (tr_loop_drain_items(h->loop, items, 64) > 0) {
    }
    return tr_loop_stop_reason(h->loop);
}

__attribute__((unused)) static void h_check_all_done(harness *h) {
    for (uint32_t t = 0; t < h->ntasks; t++)
        for (uint32_t p = 0; p < h->nparts; p++) {
            CHECK_EQ(h->next_proc[h_tp(h, t, p)], h->nmsgs); /* no loss */
            for (uint64_t i = 0; i < h->nmsgs; i++)
                CHECK_EQ(atomic_load(&h->state[h_slot(h, t, p, i)]), 2);
        }
    CHECK_EQ(h->eos, h->ntasks);
    CHECK_EQ(h->final_commits, h->ntasks);
}

static void h_free(harness *h) {
    tr_loop_destroy(h->loop);
    free(h->state);
    free(h->next_read);
    free(h->next_proc);
    free(h->checked);
    free(h->wm_last);
    free((void *)h->incomplete);
    free((void *)h->running);
    free((void *)h->commit_wait);
    free(h->req_fifo);
    free(h->req_head);
    free(h->req_tail);
    free(h->pending);
    pthread_mutex_destroy(&h->mu);
}

static tr_loop_config h_config(uint32_t ntasks, uint32_t maxc) {
    tr_loop_config c;
    memset(&c, 0, sizeof c);
    c.ntasks = ntasks;
    c.max_concurrency = maxc;
    c.input_buffer = 16;
    c.window_ns = -1;
    c.commit_ns = -1;
    c.callback_timeout_ns = -1;
    c.max_idle_ns = 2000000;
    c.shutdown_ns = 5000000000LL;
    return c;
}

#endif
