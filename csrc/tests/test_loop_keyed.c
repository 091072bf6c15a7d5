/* test_loop_keyed.c: TR_TASK_KEYED look-ahead (rules 30, 31).
 *
 * A fake binding: one task, one partition; message i is item i + 1 with handle
 * i and key hash keys[i]. Checks: the look-ahead picks the first message whose
 * key is free; a ring holding only busy keys stops reading (rule 31); taken
 * slots are not handed back by drain_items; and with completions from another
 * thread in random order, per key invocation order = offset order, never two
 * outstanding, and the watermark is a gap-free prefix of completions. With
 * `spread`, the key hashes pushed are chosen to crowd the loop's busy-key set
 * (see kh_spread_hash): keys that share a slot must not wait for each other.
 *
 * Keyed tasks on the worker pool (key_pick's pool branch; the kp binding below):
 * several tasks, partitions and workers, many keys, calls of random length, so
 * completions reach the loop out of order, with commit requests that make
 * workers hand queued ops back; optionally keyed loop-thread tasks in the same
 * loop, completed in random order from another thread. Checked for meaning.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tailrace/loop.h"
#include "tr_test.h"

#define KMAX 4096

typedef struct kh {
    tr_loop *loop;
    const uint64_t *keys;
    uint64_t n, next_read;
    uint64_t invoked[KMAX], ninvoked;
    uint64_t seqs[KMAX];
    _Atomic uint8_t done[KMAX];
    int active[64]; /* per key: 1 while outstanding (keys are < 64 here) */
    uint64_t last_of_key[64];
    pthread_mutex_t mu;
    uint64_t pending[KMAX]; /* idx << 32 | seq, completed by the completer */
    size_t npending;
    _Atomic int quit;
    _Atomic int errors;
    uint64_t nruns, nprocess;    /* ops of each kind seen (loop thread) */
    uint64_t ncommits, nsettled; /* commit ops, and those tr_loop_task_settled allowed */
    uint64_t rng;
    int spread; /* push kh_spread_hash(key) instead of the key */
} kh;

/* A 64-bit hash for key k < 64 that the busy-key set (loop_internal.h:
 * key_slot, bits 40.. of hash * 0x9E3779B97F4A7C15) puts in slot k & 3 of any
 * set of fewer than 2^20 slots: 16 distinct hashes per slot, whose probes
 * overlap, so that freeing one shifts others back. */
static uint64_t kh_spread_hash(uint64_t k) {
    const uint64_t inverse = 0xF1DE83E19937733Dull; /* of 0x9E3779B97F4A7C15 mod 2^64 */
    return ((((k & 3) << 40) | ((k >> 2) << 60)) * inverse);
}

static uint64_t kh_rand(kh *h) {
    h->rng ^= h->rng << 13;
    h->rng ^= h->rng >> 7;
    h->rng ^= h->rng << 17;
    return h->rng;
}

static void kh_check_wm(kh *h) {
    tr_mark m;
    if (tr_loop_watermark(h->loop, 0, 0, &m) != TR_OK)
        return;
    if (m.handle != m.position)
        h->errors++;
    for (uint64_t i = 0; i <= m.position; i++) {
        if (!atomic_load(&h->done[i])) { /* rules 12, 13: never past an incomplete one */
            h->errors++;
            break;
        }
    }
}

static int kh_batch(void *ctx, tr_loop *loop) {
    kh *h = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        if (op.kind == TR_OP_REFILL) {
            uint64_t items[64], handles[64], hashes[64];
            size_t m = 0;
            while (m < op.handle && m < 64 && h->next_read < h->n) {
                items[m] = h->next_read + 1;
                handles[m] = h->next_read;
                hashes[m] =
                    h->spread ? kh_spread_hash(h->keys[h->next_read]) : h->keys[h->next_read];
                m++;
                h->next_read++;
            }
            if (m && tr_loop_push_inputs_keyed(loop, 0, 0, items, handles, hashes, m) != TR_OK)
                h->errors++;
            if (h->next_read == h->n)
                tr_loop_partition_state(loop, 0, 0, TR_PART_ENDED);
        } else if (op.kind == TR_OP_PROCESS) {
            h->nprocess++;
            uint64_t idx = op.item - 1, k = h->keys[idx] & 63;
            if (op.handle != idx)
                h->errors++;
            pthread_mutex_lock(&h->mu);
            if (h->active[k]) /* rule 30: never two outstanding of one key */
                h->errors++;
            if (h->last_of_key[k] != UINT64_MAX && h->last_of_key[k] >= idx)
                h->errors++; /* rule 30: offset order within a key */
            h->active[k] = 1;
            h->last_of_key[k] = idx;
            h->invoked[h->ninvoked] = idx;
            h->seqs[h->ninvoked++] = op.seq;
            h->pending[h->npending++] = (idx << 32) | op.seq;
            pthread_mutex_unlock(&h->mu);
        } else if (op.kind == TR_OP_RUN) {
            h->nruns++;
            /* TR_TASK_INLINE: the run completes in order; sometimes the last one
             * escapes (stays outstanding, completed later by the completer) */
            const uint64_t *its = (const uint64_t *)(uintptr_t)op.item;
            int escape = op.count > 0 && (kh_rand(h) & 3) == 0;
            for (uint32_t i = 0; i < op.count; i++) {
                uint64_t idx = its[i] - 1, k = h->keys[idx] & 63;
                pthread_mutex_lock(&h->mu);
                if (h->active[k])
                    h->errors++;
                if (h->last_of_key[k] != UINT64_MAX && h->last_of_key[k] >= idx)
                    h->errors++;
                h->last_of_key[k] = idx;
                h->invoked[h->ninvoked] = idx;
                h->seqs[h->ninvoked++] = UINT64_MAX;
                if (!(escape && i + 1 == op.count))
                    atomic_store(&h->done[idx], 1);
                pthread_mutex_unlock(&h->mu);
            }
            if (escape) {
                uint64_t seq = 0;
                uint64_t idx = its[op.count - 1] - 1;
                if (tr_loop_run_escape(loop, op.task, op.count, &seq) != TR_OK)
                    h->errors++;
                pthread_mutex_lock(&h->mu);
                h->active[h->keys[idx] & 63] = 1;
                h->pending[h->npending++] = (idx << 32) | seq;
                pthread_mutex_unlock(&h->mu);
            } else if (tr_loop_run_done(loop, op.task, op.count, op.count, 0) != TR_OK) {
                h->errors++;
            }
        } else if (op.kind == TR_OP_COMMIT) {
            /* a stateful commit (rule 27): settled means the invoked messages are
             * exactly 0..watermark, each of them done */
            h->ncommits++;
            if (tr_loop_task_settled(loop, op.task)) {
                h->nsettled++;
                tr_mark m;
                uint64_t upto = tr_loop_watermark(loop, 0, 0, &m) == TR_OK ? m.position + 1 : 0;
                pthread_mutex_lock(&h->mu);
                if (h->ninvoked != upto)
                    h->errors++;
                for (uint64_t i = 0; i < h->ninvoked; i++)
                    if (h->invoked[i] >= upto || !atomic_load(&h->done[h->invoked[i]]))
                        h->errors++;
                pthread_mutex_unlock(&h->mu);
            }
            tr_loop_control_done(loop, op.task, 0);
        } else if (op.kind >= TR_OP_WINDOW && op.kind <= TR_OP_END_OF_STREAM) {
            tr_loop_control_done(loop, op.task, 0);
        }
    }
    kh_check_wm(h);
    return 0;
}

static void *kh_completer(void *arg) {
    kh *h = arg;
    while (!atomic_load(&h->quit)) {
        pthread_mutex_lock(&h->mu);
        if (h->npending) {
            size_t i = (size_t)(kh_rand(h) % h->npending);
            uint64_t e = h->pending[i];
            h->pending[i] = h->pending[--h->npending];
            uint64_t idx = e >> 32;
            h->active[h->keys[idx] & 63] = 0;
            atomic_store(&h->done[idx], 1);
            pthread_mutex_unlock(&h->mu);
            if (tr_loop_complete(h->loop, 0, e & 0xffffffffu, 0) != TR_OK)
                h->errors++;
        } else {
            pthread_mutex_unlock(&h->mu);
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static void *kh_stopper(void *arg) {
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    tr_loop_stop(arg);
    return NULL;
}

static void kh_init_flags(kh *h, const uint64_t *keys, uint64_t n, uint32_t maxc, uint32_t buffer,
                          uint32_t flags, int64_t commit_ns) {
    memset(h, 0, sizeof *h);
    h->keys = keys;
    h->n = n;
    h->rng = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 64; k++)
        h->last_of_key[k] = UINT64_MAX;
    pthread_mutex_init(&h->mu, NULL);
    tr_loop_config cfg = {0};
    cfg.ntasks = 1;
    cfg.max_concurrency = maxc;
    cfg.input_buffer = buffer;
    cfg.commit_ns = commit_ns;
    cfg.window_ns = 0;
    cfg.max_idle_ns = 1000000;
    cfg.shutdown_ns = 0; /* a stop does not wait for the never-completed ones */
    tr_loop_task task = {1, flags};
    CHECK(tr_loop_create(&cfg, &task, &h->loop) == TR_OK);
}

static void kh_init(kh *h, const uint64_t *keys, uint64_t n, uint32_t maxc, uint32_t buffer) {
    kh_init_flags(h, keys, n, maxc, buffer, TR_TASK_KEYED, 0);
}

/* 2000 pseudo-random keys below nkeys. */
static void kh_random_keys(uint64_t *keys, uint64_t seed, int nkeys) {
    uint64_t r = seed;
    for (int i = 0; i < 2000; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        keys[i] = (r >> 33) % (uint64_t)nkeys;
    }
}

/* Run the loop to its end while kh_completer completes in random order. */
static void kh_run_completing(kh *h) {
    pthread_t completer;
    CHECK(pthread_create(&completer, NULL, kh_completer, h) == 0);
    tr_loop_hooks hooks = {.ctx = h, .run_batch = kh_batch};
    CHECK(tr_loop_run(h->loop, &hooks) == TR_OK);
    atomic_store(&h->quit, 1);
    pthread_join(completer, NULL);
}

/* 2000 messages with pseudo-random keys below nkeys, run to the end while they complete in
 * random order: every one invoked, no ordering error. The keys live until the next call. */
static void kh_run_random(kh *h, uint64_t seed, uint32_t maxc, uint32_t buffer, int nkeys,
                          uint32_t flags, int64_t commit_ns, int spread) {
    static uint64_t keys[2000];
    kh_random_keys(keys, seed, nkeys);
    kh_init_flags(h, keys, 2000, maxc, buffer, flags, commit_ns);
    h->spread = spread;
    h->rng ^= seed;
    kh_run_completing(h);
    CHECK(h->errors == 0);
    CHECK(h->ninvoked == 2000);
}

/* Nothing completes: the look-ahead takes the first message of each free key
 * (spread: keys 1, 5 and 9 share a slot of the busy set, 2 and 6 another). */
static void test_lookahead_picks_free_keys(int spread) {
    static const uint64_t plain[] = {1, 1, 2, 3, 2, 4};
    static const uint64_t crowded[] = {1, 1, 5, 9, 5, 6};
    kh h;
    kh_init(&h, spread ? crowded : plain, 6, 8, 16);
    h.spread = spread;
    pthread_t stopper;
    CHECK(pthread_create(&stopper, NULL, kh_stopper, h.loop) == 0);
    tr_loop_hooks hooks = {.ctx = &h, .run_batch = kh_batch};
    CHECK(tr_loop_run(h.loop, &hooks) == TR_OK);
    pthread_join(stopper, NULL);
    CHECK(h.errors == 0);
    CHECK(h.ninvoked == 4);
    CHECK(h.invoked[0] == 0 && h.invoked[1] == 2 && h.invoked[2] == 3 && h.invoked[3] == 5);
    for (uint64_t i = 0; i < h.ninvoked; i++)
        CHECK(h.seqs[i] == i); /* rule 12: seqs in invocation order */
    tr_mark m;
    CHECK(tr_loop_watermark(h.loop, 0, 0, &m) == TR_EAGAIN);
    uint64_t out[8];
    size_t n = tr_loop_drain_items(h.loop, out, 8);
    /* only the untaken ones come back: items 2 (idx 1) and 5 (idx 4) */
    CHECK(n == 2 && out[0] == 2 && out[1] == 5);
    CHECK(tr_loop_drain_items(h.loop, out, 8) == 0);
    tr_task_stats s;
    tr_loop_task_stats(h.loop, 0, &s);
    CHECK(s.keys_in_flight == 4);
    CHECK(s.oldest_ns != INT64_MAX);
    tr_loop_destroy(h.loop);
    pthread_mutex_destroy(&h.mu);
}

/* Rule 31: a ring holding only busy keys stops reading. */
static void test_busy_ring_stops_reading(void) {
    static const uint64_t keys[] = {7, 7, 7, 7, 8, 9};
    kh h;
    kh_init(&h, keys, 6, 8, 4);
    pthread_t stopper;
    CHECK(pthread_create(&stopper, NULL, kh_stopper, h.loop) == 0);
    tr_loop_hooks hooks = {.ctx = &h, .run_batch = kh_batch};
    CHECK(tr_loop_run(h.loop, &hooks) == TR_OK);
    pthread_join(stopper, NULL);
    CHECK(h.errors == 0);
    CHECK(h.ninvoked == 1 && h.invoked[0] == 0);
    CHECK(tr_loop_read_count(h.loop, 0, 0) == 4); /* the buffer, no more */
    uint64_t out[8];
    CHECK(tr_loop_drain_items(h.loop, out, 8) == 3);
    tr_loop_destroy(h.loop);
    pthread_mutex_destroy(&h.mu);
}

/* Random completion order from another thread; push-time key checks above. */
static void test_random_completion(uint64_t seed, uint32_t maxc, uint32_t buffer, int nkeys,
                                   uint32_t flags, int spread) {
    kh h;
    kh_run_random(&h, seed, maxc, buffer, nkeys, flags, 0, spread);
    if (flags & TR_TASK_INLINE) /* runs, and (room for more than one) look-ahead after an escape */
        CHECK(h.nruns > 0 && (maxc == 1 || h.nprocess > 0));
    else
        CHECK(h.nruns == 0);
    CHECK(tr_loop_stop_reason(h.loop) == TR_STOP_END_OF_STREAM);
    tr_mark m;
    CHECK(tr_loop_watermark(h.loop, 0, 0, &m) == TR_OK && m.position == 1999);
    tr_task_stats s;
    tr_loop_task_stats(h.loop, 0, &s);
    CHECK(s.keys_in_flight == 0 && s.outstanding == 0);
    tr_loop_destroy(h.loop);
    pthread_mutex_destroy(&h.mu);
}

/* Rules 27, 30: commits every 200 us while completions come in random order;
 * settled commits see exactly a released prefix, and the catch-up after an
 * unsettled one (look-ahead off until nothing is ahead) gets settled ones through. */
static void test_settled_commits(uint64_t seed, uint32_t maxc, uint32_t buffer, int nkeys) {
    kh h;
    kh_run_random(&h, seed, maxc, buffer, nkeys, TR_TASK_KEYED, 200000, 0);
    CHECK(h.ncommits > h.nsettled); /* some found messages taken ahead ... */
    CHECK(h.nsettled > 1);          /* ... and settled ones followed, not only the final one */
    tr_loop_destroy(h.loop);
    pthread_mutex_destroy(&h.mu);
}

/* ------------------------------------------- keyed tasks on the worker pool */

/* kp: `ntasks` keyed tasks of `nparts` partitions of `nmsgs` messages each, on
 * a pool of `pool_size` workers (the pool branch of key_pick: a pool task's one
 * worker runs what it is handed one at a time, so the loop hands it messages in
 * offset order, busy keys included). Message i of partition p of task t is item
 * kp_item(t, p, i) with handle i and key kp_key(t, p, i) < nkeys. With `mixed`,
 * every fourth task (t % 4 == 3) runs on the loop thread instead: its PROCESS
 * ops are completed by kp_completer, in random order, from another thread.
 * Checked, as the loop hands out ops:
 *   - rule 30: per task, partition and key, invocation in offset order; per task
 *     and key, at most one message invoked and not completed;
 *   - each message invoked once (no duplicate), every one by the end (no loss);
 *   - rules 2, 21: a pool task runs one call at a time; a loop-thread task has at
 *     most max_concurrency invoked and not completed;
 *   - rules 9, 14: a commit runs with nothing of its task outstanding, and a pool
 *     task's requested commit runs before its next call;
 *   - rules 12, 13: every watermark covers only completed messages, never moves
 *     back, and reaches the last message at end of stream;
 *   - rule 27: a commit that tr_loop_task_settled allows sees exactly the
 *     released prefix invoked (nothing past the watermark). */
typedef struct kp_pending {
    uint64_t item, seq;
    uint32_t req;
} kp_pending;

typedef struct kp {
    tr_loop *loop;
    uint32_t ntasks, nparts, nkeys, maxc, pool_size, commit_every;
    uint64_t nmsgs, seed;
    int mixed;
    _Atomic uint8_t *state;       /* [t][p][i]: 0 not invoked, 1 invoked, 2 completed */
    uint64_t *last;               /* [t][p][key]: last index invoked (t's invoking thread) */
    _Atomic uint32_t *kbusy;      /* [t][key]: invoked, not completed */
    _Atomic uint32_t *busy;       /* [t]: invoked, not completed */
    _Atomic uint8_t *commit_wait; /* [t]: a pool task asked for a commit */
    _Atomic uint64_t *invoked;    /* [t] */
    uint64_t *next_read, *checked, *wm_next;       /* [t][p]: loop thread */
    uint64_t *rng;                                 /* [worker]: its own */
    uint64_t commits, settled, final_commits, eos; /* loop thread */
    pthread_mutex_t mu;
    kp_pending *pending; /* loop-thread tasks' outstanding ops (mixed) */
    size_t npending, cap;
    uint64_t crng; /* kp_completer's */
    _Atomic int quit;
} kp;

static inline uint64_t kp_item(uint32_t t, uint32_t p, uint64_t i) {
    return ((uint64_t)t << 44) | ((uint64_t)p << 30) | (i + 1);
}
static inline void kp_decode(uint64_t item, uint32_t *t, uint32_t *p, uint64_t *i) {
    *t = (uint32_t)(item >> 44);
    *p = (uint32_t)((item >> 30) & 0x3fff);
    *i = (item & ((1ull << 30) - 1)) - 1;
}
static inline size_t kp_tp(const kp *h, uint32_t t, uint32_t p) {
    return (size_t)t * h->nparts + p;
}
static inline int kp_pooled(const kp *h, uint32_t t) {
    return !(h->mixed && t % 4 == 3);
}
static uint32_t kp_key(const kp *h, uint32_t t, uint32_t p, uint64_t i) {
    uint64_t x = h->seed ^ ((uint64_t)t << 48) ^ ((uint64_t)p << 32) ^ i;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull; /* splitmix64's finaliser */
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((x ^ (x >> 31)) % h->nkeys);
}

static void kp_invoke(kp *h, uint32_t t, uint32_t p, uint64_t i) {
    uint8_t zero = 0;
    CHECK(atomic_compare_exchange_strong(&h->state[kp_tp(h, t, p) * h->nmsgs + i], &zero, 1));
    uint32_t k = kp_key(h, t, p, i);
    uint64_t *last = &h->last[kp_tp(h, t, p) * h->nkeys + k];
    CHECK(*last == UINT64_MAX || *last < i); /* rule 30: offset order within a key */
    *last = i;
    CHECK_EQ(atomic_fetch_add(&h->kbusy[(size_t)t * h->nkeys + k], 1), 0); /* rule 30 */
    uint32_t b = atomic_fetch_add(&h->busy[t], 1) + 1;
    CHECK(b <= (kp_pooled(h, t) ? 1 : h->maxc));  /* rules 2, 21 */
    CHECK_EQ(atomic_load(&h->commit_wait[t]), 0); /* rule 9 */
    atomic_fetch_add(&h->invoked[t], 1);
}

/* Before the completion is reported: the loop may release it at once. */
static void kp_completed(kp *h, uint32_t t, uint32_t p, uint64_t i) {
    atomic_store(&h->state[kp_tp(h, t, p) * h->nmsgs + i], 2);
    atomic_fetch_sub(&h->kbusy[(size_t)t * h->nkeys + kp_key(h, t, p, i)], 1);
    atomic_fetch_sub(&h->busy[t], 1);
}

static uint32_t kp_requests(kp *h, uint32_t t, uint64_t i) {
    if (!h->commit_every || i % h->commit_every != h->commit_every - 1)
        return 0;
    if (kp_pooled(h, t)) /* one call at a time: nothing more before the commit */
        atomic_store(&h->commit_wait[t], 1);
    return TR_REQ_COMMIT_CURRENT;
}

/* Loop thread: rules 12, 13 (and, final at end of stream, every message). */
static void kp_check_wm(kp *h, uint32_t t, int final_eos) {
    for (uint32_t p = 0; p < h->nparts; p++) {
        size_t tp = kp_tp(h, t, p);
        tr_mark m;
        tr_status st = tr_loop_watermark(h->loop, t, p, &m);
        if (st == TR_EAGAIN) {
            CHECK(!final_eos);
            continue;
        }
        CHECK_EQ(st, TR_OK);
        CHECK_EQ(m.handle, m.position);
        CHECK(m.position + 1 >= h->wm_next[tp]); /* never backwards */
        h->wm_next[tp] = m.position + 1;
        while (h->checked[tp] <= m.position) { /* never past an incomplete message */
            CHECK_EQ(atomic_load(&h->state[tp * h->nmsgs + h->checked[tp]]), 2);
            h->checked[tp]++;
        }
        if (final_eos)
            CHECK_EQ(m.position, h->nmsgs - 1);
    }
}

static int kp_batch(void *ctx, tr_loop *loop) {
    kp *h = ctx;
    tr_op op;
    while (tr_loop_next_op(loop, &op)) {
        uint32_t t = op.task, p, tt;
        uint64_t i;
        switch (op.kind) {
        case TR_OP_REFILL: {
            size_t tp = kp_tp(h, t, op.partition);
            uint64_t room = op.handle;
            while (room && h->next_read[tp] < h->nmsgs) {
                uint64_t items[64], handles[64], hashes[64];
                size_t m = 0;
                while (m < 64 && m < room && h->next_read[tp] < h->nmsgs) {
                    uint64_t k = h->next_read[tp]++;
                    items[m] = kp_item(t, op.partition, k);
                    handles[m] = k;
                    hashes[m++] = kp_key(h, t, op.partition, k);
                }
                CHECK_EQ(
                    tr_loop_push_inputs_keyed(loop, t, op.partition, items, handles, hashes, m),
                    TR_OK);
                room -= m;
            }
            if (h->next_read[tp] == h->nmsgs)
                tr_loop_partition_state(loop, t, op.partition, TR_PART_ENDED);
            break;
        }
        case TR_OP_PROCESS: /* a loop-thread task: completed later, by kp_completer */
            kp_decode(op.item, &tt, &p, &i);
            CHECK(!kp_pooled(h, t));
            CHECK_EQ(tt, t);
            CHECK_EQ(p, op.partition);
            CHECK_EQ(op.handle, i);
            kp_invoke(h, t, p, i);
            pthread_mutex_lock(&h->mu);
            CHECK(h->npending < h->cap);
            h->pending[h->npending++] = (kp_pending){op.item, op.seq, kp_requests(h, t, i)};
            pthread_mutex_unlock(&h->mu);
            break;
        case TR_OP_COMMIT:
            if (op.flags & TR_OPF_FINAL) {
                kp_check_wm(h, t, tr_loop_stop_reason(loop) == TR_STOP_END_OF_STREAM);
                h->final_commits++;
            } else {
                CHECK_EQ(atomic_load(&h->busy[t]), 0); /* rule 9 */
                kp_check_wm(h, t, 0);
                h->commits++;
                if (tr_loop_task_settled(loop, t)) { /* rule 27 */
                    h->settled++;
                    for (p = 0; p < h->nparts; p++) {
                        size_t tp = kp_tp(h, t, p);
                        for (i = h->wm_next[tp]; i < h->next_read[tp]; i++)
                            CHECK_EQ(atomic_load(&h->state[tp * h->nmsgs + i]), 0);
                    }
                }
                atomic_store(&h->commit_wait[t], 0);
            }
            tr_loop_control_done(loop, t, 0);
            break;
        case TR_OP_END_OF_STREAM:
            CHECK_EQ(atomic_load(&h->busy[t]), 0); /* rule 11 */
            CHECK_EQ(atomic_load(&h->invoked[t]), (uint64_t)h->nparts * h->nmsgs);
            h->eos++;
            tr_loop_control_done(loop, t, 0);
            break;
        default:
            CHECK(0); /* no windows, no timers, no runs (keyed) */
        }
    }
    for (uint32_t t = 0; t < h->ntasks; t++)
        kp_check_wm(h, t, 0);
    return 0;
}

/* A call takes a random time (mostly a short spin, sometimes a sleep), so the
 * workers' completions reach the loop interleaved, out of hand-out order. */
static void kp_call(uint64_t *rng) {
    uint64_t r = tr_test_rand(rng);
    if (r % 64 == 0) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    } else {
        for (volatile uint64_t n = (r >> 8) % 512; n; n--) {
        }
    }
}

static void kp_pool_batch(void *ctx, tr_loop *loop, uint32_t worker) {
    kp *h = ctx;
    tr_op op;
    while (tr_loop_pool_next(loop, worker, &op)) {
        CHECK_EQ(op.flags & TR_OPF_DISCARD, 0); /* the loop stops only at end of stream */
        uint32_t t, p;
        uint64_t i;
        kp_decode(op.item, &t, &p, &i);
        CHECK_EQ(t, op.task);
        CHECK(kp_pooled(h, t));
        CHECK_EQ(t % h->pool_size, worker); /* a pool task's one worker */
        kp_invoke(h, t, p, i);
        uint32_t req = kp_requests(h, t, i);
        kp_call(&h->rng[worker]);
        kp_completed(h, t, p, i);
        CHECK_EQ(tr_loop_pool_done(loop, worker, &op, req), TR_OK);
    }
}

static void *kp_completer(void *arg) {
    kp *h = arg;
    while (!atomic_load(&h->quit)) {
        pthread_mutex_lock(&h->mu);
        if (h->npending == 0) {
            pthread_mutex_unlock(&h->mu);
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        size_t k = (size_t)(tr_test_rand(&h->crng) % h->npending);
        kp_pending e = h->pending[k];
        h->pending[k] = h->pending[--h->npending];
        pthread_mutex_unlock(&h->mu);
        uint32_t t, p;
        uint64_t i;
        kp_decode(e.item, &t, &p, &i);
        kp_completed(h, t, p, i);
        CHECK_EQ(tr_loop_complete(h->loop, t, e.seq, e.req), TR_OK);
    }
    return NULL;
}

static void test_pool(uint64_t seed, uint32_t ntasks, uint32_t nparts, uint64_t nmsgs,
                      uint32_t nkeys, uint32_t pool_size, uint32_t maxc, uint32_t buffer,
                      uint32_t commit_every, int mixed) {
    kp h;
    memset(&h, 0, sizeof h);
    h.ntasks = ntasks;
    h.nparts = nparts;
    h.nmsgs = nmsgs;
    h.nkeys = nkeys;
    h.pool_size = pool_size;
    h.maxc = maxc;
    h.commit_every = commit_every;
    h.mixed = mixed;
    h.seed = seed * 0x9E3779B97F4A7C15ull;
    h.crng = h.seed | 1;
    size_t ntp = (size_t)ntasks * nparts;
    h.state = calloc(ntp * nmsgs, sizeof *h.state);
    h.last = malloc(ntp * nkeys * sizeof *h.last);
    h.kbusy = calloc((size_t)ntasks * nkeys, sizeof *h.kbusy);
    h.busy = calloc(ntasks, sizeof *h.busy);
    h.commit_wait = calloc(ntasks, sizeof *h.commit_wait);
    h.invoked = calloc(ntasks, sizeof *h.invoked);
    h.next_read = calloc(ntp, sizeof *h.next_read);
    h.checked = calloc(ntp, sizeof *h.checked);
    h.wm_next = calloc(ntp, sizeof *h.wm_next);
    h.rng = calloc(pool_size, sizeof *h.rng);
    h.cap = (size_t)ntasks * maxc + 16;
    h.pending = calloc(h.cap, sizeof *h.pending);
    CHECK(h.state && h.last && h.kbusy && h.busy && h.commit_wait && h.invoked && h.next_read &&
          h.checked && h.wm_next && h.rng && h.pending);
    for (size_t j = 0; j < ntp * nkeys; j++)
        h.last[j] = UINT64_MAX;
    for (uint32_t w = 0; w < pool_size; w++)
        h.rng[w] = (h.seed + w) | 1;
    pthread_mutex_init(&h.mu, NULL);

    tr_loop_config cfg = {0};
    cfg.ntasks = ntasks;
    cfg.max_concurrency = maxc;
    cfg.input_buffer = buffer;
    cfg.pool_size = pool_size;
    cfg.commit_ns = 300000; /* timer commits too, between requested ones */
    cfg.max_idle_ns = 1000000;
    cfg.shutdown_ns = 5000000000LL;
    tr_loop_task *tasks = calloc(ntasks, sizeof *tasks);
    CHECK(tasks);
    for (uint32_t t = 0; t < ntasks; t++) {
        tasks[t].npartitions = nparts;
        tasks[t].flags = TR_TASK_KEYED | (kp_pooled(&h, t) ? TR_TASK_POOL : 0);
    }
    CHECK_EQ(tr_loop_create(&cfg, tasks, &h.loop), TR_OK);
    free(tasks);

    pthread_t completer;
    if (mixed)
        CHECK_EQ(pthread_create(&completer, NULL, kp_completer, &h), 0);
    tr_loop_hooks hooks = {&h, kp_batch, kp_pool_batch, NULL, NULL};
    CHECK_EQ(tr_loop_run(h.loop, &hooks), TR_OK);
    atomic_store(&h.quit, 1);
    if (mixed)
        pthread_join(completer, NULL);

    CHECK_EQ(tr_loop_stop_reason(h.loop), TR_STOP_END_OF_STREAM);
    CHECK_EQ(h.eos, ntasks);
    CHECK_EQ(h.final_commits, ntasks);
    CHECK(h.commits > 0);
    uint64_t items[8];
    CHECK_EQ(tr_loop_drain_items(h.loop, items, 8), 0); /* nothing left behind */
    for (uint32_t t = 0; t < ntasks; t++) {
        CHECK_EQ(atomic_load(&h.invoked[t]), (uint64_t)nparts * nmsgs);
        for (size_t j = (size_t)t * nparts * nmsgs; j < (size_t)(t + 1) * nparts * nmsgs; j++)
            CHECK_EQ(atomic_load(&h.state[j]), 2); /* none lost */
        tr_task_stats s;
        tr_loop_task_stats(h.loop, t, &s);
        CHECK_EQ(s.processed, (uint64_t)nparts * nmsgs);
        CHECK_EQ(s.completed, (uint64_t)nparts * nmsgs);
        CHECK_EQ(s.outstanding, 0);
        CHECK_EQ(s.keys_in_flight, 0);
    }
    tr_loop_destroy(h.loop);
    pthread_mutex_destroy(&h.mu);
    free(h.state);
    free(h.last);
    free((void *)h.kbusy);
    free((void *)h.busy);
    free((void *)h.commit_wait);
    free((void *)h.invoked);
    free(h.next_read);
    free(h.checked);
    free(h.wm_next);
    free(h.rng);
    free(h.pending);
}

int main(void) {
    test_lookahead_picks_free_keys(0);
    test_lookahead_picks_free_keys(1);
    test_busy_ring_stops_reading();
    const uint32_t K = TR_TASK_KEYED, KI = TR_TASK_KEYED | TR_TASK_INLINE;
    for (int spread = 0; spread < 2; spread++) {
        test_random_completion(1, 8, 32, 5, K, spread);
        test_random_completion(2, 64, 1024, 40, K, spread);
        test_random_completion(3, 1, 4, 3, K, spread);
        test_random_completion(4, 16, 8, 2, K, spread);
        test_random_completion(10, 64, 1024, 64, K, spread);
        /* runs (loop-thread tasks) mixed with look-ahead once one escapes */
        test_random_completion(5, 8, 32, 5, KI, spread);
        test_random_completion(6, 64, 256, 40, KI, spread);
        test_random_completion(7, 1, 4, 3, KI, spread);
    }
    test_settled_commits(8, 8, 32, 5);
    test_settled_commits(9, 64, 256, 40);
    /* keyed tasks on the pool: seed, tasks, partitions, messages, keys, workers,
     * max concurrency, input buffer, commit request every k-th message, mixed */
    test_pool(11, 8, 3, 600, 1000, 3, 1, 64, 0, 0);  /* many keys */
    test_pool(12, 6, 2, 600, 3, 2, 1, 32, 37, 0);    /* few keys, many queued per key */
    test_pool(13, 5, 1, 1500, 40, 4, 8, 256, 53, 0); /* one partition, long look-ahead */
    test_pool(14, 8, 3, 500, 40, 3, 8, 32, 29, 1);   /* loop-thread keyed tasks beside */
    printf("test_loop_keyed: ok\n");
    return 0;
}
