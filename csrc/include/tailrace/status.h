/* tailrace/status.h: the one status enum of the C library.
 *
 * Every fallible function returns a tr_status. There is no errno in the contract:
 * callers (the Cython binding's one error checker) map these codes to exceptions.
 */
#ifndef TAILRACE_STATUS_H
#define TAILRACE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tr_status {
    TR_OK = 0,
    TR_EAGAIN = 1,    /* would block: queue full or empty, concurrency limit reached */
    TR_ETIMEDOUT = 2, /* a timed wait expired */
    TR_EINVAL = 3,    /* an argument is out of range */
    TR_ENOMEM = 4,    /* allocation failed */
    TR_EALREADY = 5,  /* the callback was already completed or failed (rule 17) */
    TR_EUNKNOWN = 6,  /* sequence number is not outstanding (never handed out) */
    TR_EREGRESS = 7,  /* a watermark would move backwards (rule 13) */
    TR_ECLOSED = 8,   /* the object was closed or stopped */
    TR_EFAILED = 9,   /* a failed completion blocks release (rule 18) */
    TR_ESYS = 10      /* a pthread call failed */
} tr_status;

#define TR_STATUS_COUNT 11

/* Human-readable, static, never NULL (an unknown code gives "unknown status"). */
const char *tr_status_str(tr_status status);
/* The enum constant's name, e.g. "TR_EAGAIN"; static, never NULL. */
const char *tr_status_name(tr_status status);

#ifdef __cplusplus
}
#endif
#endif
