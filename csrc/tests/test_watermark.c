/* Unit tests: the watermark tracker (SEMANTICS rules 12, 13). */
#include "tailrace/watermark.h"
#include "tr_test.h"

static tr_mark mk(uint64_t p, uint64_t h) {
    tr_mark m = {p, h};
    return m;
}

int main(void) {
    tr_watermark *w;
    tr_mark m;

    CHECK_EQ(tr_watermark_create(0, &w), TR_OK);
    CHECK_EQ(tr_watermark_partitions(w), 0);
    CHECK_EQ(tr_watermark_advance(w, 0, 1, 1), TR_EINVAL);
    CHECK_EQ(tr_watermark_get(w, 0, &m), TR_EINVAL);
    CHECK(!tr_watermark_dirty(w));
    tr_watermark_destroy(w);
    tr_watermark_destroy(NULL);

    CHECK_EQ(tr_watermark_create(3, &w), TR_OK);
    CHECK_EQ(tr_watermark_partitions(w), 3);
    CHECK_EQ(tr_watermark_get(w, 1, &m), TR_EAGAIN);
    CHECK_EQ(tr_watermark_committed(w, 1, &m), TR_EAGAIN);
    CHECK_EQ(tr_watermark_committed(w, 3, &m), TR_EINVAL);
    CHECK_EQ(tr_watermark_mark_committed(w, 1, mk(0, 0)), TR_EREGRESS); /* nothing completed */
    CHECK_EQ(tr_watermark_mark_committed(w, 3, mk(0, 0)), TR_EINVAL);
    CHECK_EQ(tr_watermark_advance(w, 3, 0, 0), TR_EINVAL);

    /* rule 12: position 0 is a valid first mark. */
    CHECK_EQ(tr_watermark_advance(w, 1, 0, 500), TR_OK);
    CHECK_EQ(tr_watermark_get(w, 1, &m), TR_OK);
    CHECK_EQ(m.position, 0);
    CHECK_EQ(m.handle, 500);
    CHECK(tr_watermark_dirty(w));
    /* rule 13: never backwards, equal is a regress too; nothing changes. */
    CHECK_EQ(tr_watermark_advance(w, 1, 0, 1), TR_EREGRESS);
    CHECK_EQ(tr_watermark_advance(w, 1, 5, 505), TR_OK);
    CHECK_EQ(tr_watermark_advance(w, 1, 4, 504), TR_EREGRESS);
    CHECK_EQ(tr_watermark_get(w, 1, &m), TR_OK);
    CHECK_EQ(m.position, 5);
    CHECK_EQ(m.handle, 505);
    CHECK_EQ(tr_watermark_get(w, 0, &m), TR_EAGAIN); /* partitions are independent */

    /* rule 13: never commit past the low watermark; committed never goes back. */
    CHECK_EQ(tr_watermark_mark_committed(w, 1, mk(6, 506)), TR_EREGRESS);
    CHECK_EQ(tr_watermark_mark_committed(w, 1, mk(3, 503)), TR_OK);
    CHECK(tr_watermark_dirty(w));
    CHECK_EQ(tr_watermark_committed(w, 1, &m), TR_OK);
    CHECK_EQ(m.position, 3);
    CHECK_EQ(m.handle, 503);
    CHECK_EQ(tr_watermark_mark_committed(w, 1, mk(2, 502)), TR_EREGRESS);
    CHECK_EQ(tr_watermark_mark_committed(w, 1, mk(3, 503)), TR_OK); /* re-commit is fine */
    CHECK_EQ(tr_watermark_mark_committed(w, 1, mk(5, 505)), TR_OK);
    CHECK(!tr_watermark_dirty(w));
    CHECK_EQ(tr_watermark_advance(w, 2, 9, 9), TR_OK);
    CHECK(tr_watermark_dirty(w));
    CHECK_EQ(tr_watermark_advance(w, 1, 6, 506), TR_OK);
    CHECK(tr_watermark_dirty(w));
    CHECK_EQ(tr_watermark_mark_committed(w, 2, mk(9, 9)), TR_OK);
    CHECK(tr_watermark_dirty(w));
    CHECK_EQ(tr_watermark_mark_committed(w, 1, mk(6, 506)), TR_OK);
    CHECK(!tr_watermark_dirty(w));
    tr_watermark_destroy(w);
    puts("test_watermark: ok");
    return 0;
}
