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
    printf("test_loop_keyed: ok\n");
    return 0;
}
