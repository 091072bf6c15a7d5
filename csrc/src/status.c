/* status.c: names and messages for tr_status (one table, indexed by code). */
#include "tailrace/status.h"

#include <stddef.h>

static const char *const status_str[TR_STATUS_COUNT] = {
    [TR_OK] = "success",
    [TR_EAGAIN] = "would block (queue full or empty, or concurrency limit reached)",
    [TR_ETIMEDOUT] = "timed wait expired",
    [TR_EINVAL] = "argument out of range",
    [TR_ENOMEM] = "out of memory",
    [TR_EALREADY] = "callback already completed or failed",
    [TR_EUNKNOWN] = "sequence number was never handed out",
    [TR_EREGRESS] = "watermark would move backwards",
    [TR_ECLOSED] = "object closed or stopped",
    [TR_EFAILED] = "a failed completion blocks release",
    [TR_ESYS] = "a pthread call failed",
};

static const char *const status_name[TR_STATUS_COUNT] = {
    [TR_OK] = "TR_OK",
    [TR_EAGAIN] = "TR_EAGAIN",
    [TR_ETIMEDOUT] = "TR_ETIMEDOUT",
    [TR_EINVAL] = "TR_EINVAL",
    [TR_ENOMEM] = "TR_ENOMEM",
    [TR_EALREADY] = "TR_EALREADY",
    [TR_EUNKNOWN] = "TR_EUNKNOWN",
    [TR_EREGRESS] = "TR_EREGRESS",
    [TR_ECLOSED] = "TR_ECLOSED",
    [TR_EFAILED] = "TR_EFAILED",
    [TR_ESYS] = "TR_ESYS",
};

/* The enum's underlying type is implementation-defined, so compare as unsigned
 * to reject negative values coming from other languages (cffi, Cython). */
static int status_known(tr_status status) {
    return (unsigned)status < (unsigned)TR_STATUS_COUNT;
}

const char *tr_status_str(tr_status status) {
    return status_known(status) ? status_str[status] : "unknown status";
}

const char *tr_status_name(tr_status status) {
    return status_known(status) ? status_name[status] : "TR_UNKNOWN_STATUS";
}
