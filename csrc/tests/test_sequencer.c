/* Unit tests: the sequencer, single-threaded (SEMANTICS rules 2, 12, 15, 17, 18). */
#include "tailrace/sequencer.h"
#include "tr_test.h"

static void test_create(void) {
    tr_sequencer *s = NULL;
    CHECK_EQ(tr_sequencer_create(0, &s), TR_EINVAL);
    CHECK_EQ(tr_sequencer_create(TR_SEQ_MAX_CONCURRENCY + 1, &s), TR_EINVAL);
    CHECK_EQ(tr_sequencer_create(TR_SEQ_MAX_CONCURRENCY, &s), TR_OK);
    CHECK_EQ(tr_sequencer_max_concurrency(s), TR_SEQ_MAX_CONCURRENCY);
    tr_sequencer_destroy(s);
    tr_sequencer_destroy(NULL);
}

/* rule 2: at most max outstanding; at 1, k+1 is handed out only after k is released. */
static void test_limit(void) {
    tr_sequencer *s;
    tr_seq_release r[4];
    uint64_t seq;
    int i;
    CHECK_EQ(tr_sequencer_create(3, &s), TR_OK); /* ring 4, window 3 */
    for (i = 0; i < 3; i++) {
        CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_OK);
        CHECK_EQ(seq, i);
    }
    CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_EAGAIN);
    CHECK_EQ(tr_sequencer_outstanding(s), 3);
    CHECK_EQ(tr_sequencer_complete(s, 0, 0), TR_OK);
    CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_EAGAIN); /* completed is still outstanding */
    CHECK_EQ(tr_sequencer_release(s, r, 4), 1);
    CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_OK);
    CHECK_EQ(seq, 3);
    tr_sequencer_destroy(s);

    CHECK_EQ(tr_sequencer_create(1, &s), TR_OK);
    for (i = 0; i < 10; i++) {
        CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_OK);
        CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_EAGAIN);
        CHECK_EQ(tr_sequencer_complete(s, (uint64_t)i, 0), TR_OK);
        CHECK_EQ(tr_sequencer_release(s, r, 4), 1);
        CHECK_EQ(r[0].seq, i);
    }
    tr_sequencer_destroy(s);
}

/* rule 12: out-of-order completions are held until the gap fills; tags and flags pass through. */
static void test_gap_and_tags(void) {
    tr_sequencer *s;
    tr_seq_release r[8];
    uint64_t seq;
    int i;
    CHECK_EQ(tr_sequencer_create(8, &s), TR_OK);
    for (i = 0; i < 5; i++)
        CHECK_EQ(tr_sequencer_acquire(s, 100 + i, 200 + i, &seq), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 3, 0x0500), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 1, 0xff00), TR_OK);
    CHECK_EQ(tr_sequencer_release(s, r, 8), 0); /* 0 is a gap */
    CHECK_EQ(tr_sequencer_complete(s, 0, 0), TR_OK);
    CHECK_EQ(tr_sequencer_release(s, r, 8), 2);
    CHECK_EQ(r[0].seq, 0);
    CHECK_EQ(r[0].tag_a, 100);
    CHECK_EQ(r[0].tag_b, 200);
    CHECK_EQ(r[0].flags, 0);
    CHECK_EQ(r[1].seq, 1);
    CHECK_EQ(r[1].tag_a, 101);
    CHECK_EQ(r[1].flags, 0xff00);
    CHECK_EQ(tr_sequencer_released_upto(s), 2);
    CHECK_EQ(tr_sequencer_complete(s, 2, 0), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 4, 0), TR_OK);
    CHECK_EQ(tr_sequencer_release(s, r, 2), 2); /* max bounds the batch */
    CHECK_EQ(r[0].seq, 2);
    CHECK_EQ(r[1].seq, 3);
    CHECK_EQ(r[1].flags, 0x0500);
    CHECK_EQ(tr_sequencer_release(s, r, 0), 0);
    CHECK_EQ(tr_sequencer_release(s, r, 8), 1);
    CHECK_EQ(r[0].seq, 4);
    CHECK_EQ(tr_sequencer_outstanding(s), 0);
    CHECK_EQ(tr_sequencer_next_seq(s), 5);
    tr_sequencer_destroy(s);
}

/* rule 17: double completion, unknown seq, bad flags. */
static void test_statuses(void) {
    tr_sequencer *s;
    tr_seq_release r[8];
    uint64_t seq;
    CHECK_EQ(tr_sequencer_create(4, &s), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 0, 0), TR_EUNKNOWN);
    CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_OK);
    CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 2, 0), TR_EUNKNOWN);
    CHECK_EQ(tr_sequencer_complete(s, 6, 0), TR_EUNKNOWN); /* same slot as 2 */
    CHECK_EQ(tr_sequencer_complete(s, UINT64_MAX, 0), TR_EUNKNOWN);
    CHECK_EQ(tr_sequencer_complete(s, ((uint64_t)1 << 46), 0), TR_EUNKNOWN); /* aliases 0 */
    CHECK_EQ(tr_sequencer_complete(s, 0, 0x10000), TR_EINVAL);
    CHECK_EQ(tr_sequencer_complete(s, 0, 0), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 0, 0), TR_EALREADY);
    CHECK_EQ(tr_sequencer_complete(s, 0, TR_SEQ_FAILED), TR_EALREADY);
    CHECK_EQ(tr_sequencer_complete(s, 1, TR_SEQ_FAILED), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 1, 0), TR_EALREADY);
    CHECK_EQ(tr_sequencer_release(s, r, 8), 1);
    CHECK_EQ(tr_sequencer_complete(s, 0, 0), TR_EALREADY); /* released */
    tr_sequencer_destroy(s);
}

/* rule 15: release stops right after a commit; the next call continues. */
static void test_commit_stops(void) {
    tr_sequencer *s;
    tr_seq_release r[8];
    uint64_t seq;
    int i;
    CHECK_EQ(tr_sequencer_create(8, &s), TR_OK);
    for (i = 0; i < 5; i++)
        CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 0, 0), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 1, TR_SEQ_COMMIT), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 2, TR_SEQ_COMMIT | 0x100), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 3, 0), TR_OK);
    CHECK_EQ(tr_sequencer_release(s, r, 8), 2);
    CHECK_EQ(r[1].seq, 1);
    CHECK_EQ(r[1].flags, TR_SEQ_COMMIT);
    CHECK_EQ(tr_sequencer_release(s, r, 8), 1);
    CHECK_EQ(r[0].seq, 2);
    CHECK_EQ(r[0].flags, TR_SEQ_COMMIT | 0x100);
    CHECK_EQ(tr_sequencer_release(s, r, 8), 1);
    CHECK_EQ(r[0].seq, 3);
    tr_sequencer_destroy(s);
}

/* rule 18: a failed completion is never released and blocks what follows. */
static void test_failed_blocks(void) {
    tr_sequencer *s;
    tr_seq_release r[8];
    uint64_t seq, failed = 99;
    int i;
    CHECK_EQ(tr_sequencer_create(8, &s), TR_OK);
    CHECK_EQ(tr_sequencer_head_failed(s, &failed), TR_OK);
    for (i = 0; i < 4; i++)
        CHECK_EQ(tr_sequencer_acquire(s, 0, 0, &seq), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 2, TR_SEQ_FAILED), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 0, 0), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 1, 0), TR_OK);
    CHECK_EQ(tr_sequencer_complete(s, 3, 0), TR_OK);
    CHECK_EQ(tr_sequencer_head_failed(s, &failed), TR_OK); /* 0 is the head, not failed */
    CHECK_EQ(tr_sequencer_release(s, r, 8), 2);
    CHECK_EQ(tr_sequencer_head_failed(s, &failed), TR_EFAILED);
    CHECK_EQ(failed, 2);
    CHECK_EQ(tr_sequencer_release(s, r, 8), 0);
    CHECK_EQ(tr_sequencer_released_upto(s), 2);
    CHECK_EQ(tr_sequencer_outstanding(s), 2);
    tr_sequencer_destroy(s);
}

/* Many laps of the ring with a non-power-of-two window. */
static void test_laps(void) {
    tr_sequencer *s;
    tr_seq_release r[8];
    uint64_t seq, expect = 0, k;
    CHECK_EQ(tr_sequencer_create(5, &s), TR_OK);
    for (k = 0; k < 10000; k++) {
        while (tr_sequencer_acquire(s, k, 0, &seq) == TR_OK)
            CHECK_EQ(tr_sequencer_complete(s, seq, 0), TR_OK);
        CHECK_EQ(tr_sequencer_outstanding(s), 5);
        size_t n = tr_sequencer_release(s, r, 1 + k % 7), i;
        for (i = 0; i < n; i++)
            CHECK_EQ(r[i].seq, expect++);
    }
    tr_sequencer_destroy(s);
}

int main(void) {
    test_create();
    test_limit();
    test_gap_and_tags();
    test_statuses();
    test_commit_stops();
    test_failed_blocks();
    test_laps();
    puts("test_sequencer: ok");
    return 0;
}
