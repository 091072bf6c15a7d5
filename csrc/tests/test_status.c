/* Unit tests: tr_status names and messages. */
#include <string.h>

#include "tailrace/status.h"
#include "tr_test.h"

int main(void) {
    static const char *const names[TR_STATUS_COUNT] = {
        "TR_OK",       "TR_EAGAIN",   "TR_ETIMEDOUT", "TR_EINVAL",  "TR_ENOMEM", "TR_EALREADY",
        "TR_EUNKNOWN", "TR_EREGRESS", "TR_ECLOSED",   "TR_EFAILED", "TR_ESYS"};
    int i, j;
    for (i = 0; i < TR_STATUS_COUNT; i++) {
        CHECK(strcmp(tr_status_name((tr_status)i), names[i]) == 0);
        CHECK(tr_status_str((tr_status)i) != NULL);
        CHECK(strlen(tr_status_str((tr_status)i)) > 0);
        for (j = 0; j < i; j++)
            CHECK(strcmp(tr_status_str((tr_status)i), tr_status_str((tr_status)j)) != 0);
    }
    CHECK(strcmp(tr_status_str((tr_status)TR_STATUS_COUNT), "unknown status") == 0);
    CHECK(strcmp(tr_status_str((tr_status)-1), "unknown status") == 0);
    CHECK(tr_status_name((tr_status)1000) != NULL);
    puts("test_status: ok");
    return 0;
}
