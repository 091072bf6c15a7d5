/* test_encoding: the packed words of tailrace/encoding.h round-trip at their
 * limits and refuse what does not fit (STYLE habit 11; issue 13, defect 5). */
#include <stdio.h>

#include "tailrace/encoding.h"
#include "tr_test.h"

int main(void) {
    uint64_t w = 0;

    /* kind << 56 | task */
    CHECK(tr_enc_kind_task(4, TR_ENC_TASK_MAX, &w));
    CHECK_EQ(tr_enc_kind(w), 4);
    CHECK_EQ(tr_enc_task(w), TR_ENC_TASK_MAX);
    CHECK(tr_enc_kind_task(0xff, 0, &w));
    CHECK_EQ(tr_enc_kind(w), 0xff);
    w = 7;
    CHECK(!tr_enc_kind_task(1, TR_ENC_TASK_MAX + 1u, &w)); /* refused, not truncated */
    CHECK(!tr_enc_kind_task(0x100, 0, &w));
    CHECK_EQ(w, 7); /* nothing written */

    /* lazy ring items */
    CHECK(tr_lazy_item(TR_LAZY_OFFSET_LIMIT - 1, (1u << TR_LAZY_PART_BITS) - 1, &w));
    CHECK_EQ(w & 1, 1); /* odd: never a pointer */
    CHECK(tr_lazy_offset(w) == TR_LAZY_OFFSET_LIMIT - 1);
    CHECK_EQ(tr_lazy_partition(w), (1u << TR_LAZY_PART_BITS) - 1);
    CHECK(tr_lazy_item(0, 0, &w));
    CHECK(tr_lazy_offset(w) == 0 && tr_lazy_partition(w) == 0);
    CHECK(!tr_lazy_item(TR_LAZY_OFFSET_LIMIT, 0, &w));
    CHECK(!tr_lazy_item(0, 1u << TR_LAZY_PART_BITS, &w));

    /* offset handles */
    CHECK(tr_handle_int(TR_HANDLE_LIMIT - 1, &w));
    CHECK(w >> 1 == TR_HANDLE_LIMIT - 1 && (w & 1) == 0);
    CHECK(tr_handle_pinned(TR_HANDLE_LIMIT - 1, &w));
    CHECK(w >> 1 == TR_HANDLE_LIMIT - 1 && (w & 1) == 1);
    CHECK(!tr_handle_int(TR_HANDLE_LIMIT, &w));
    CHECK(!tr_handle_pinned(UINT64_MAX, &w));

    printf("test_encoding: ok\n");
    return 0;
}
