# The one place a C status code becomes a Python exception (habit 4).

from tailrace.errors import CoreError as _CoreError


cdef object status_error(capi.tr_status status, object context=None):
    """New reference: the exception for a non-OK status (never raises itself)."""
    cdef bytes name = capi.tr_status_name(status)
    cdef bytes text = capi.tr_status_str(status)
    if status == capi.TR_ENOMEM:
        return MemoryError(f"{context}: {text.decode()}" if context else text.decode())
    return _CoreError(<int>status, name.decode(), text.decode(), context)


cdef inline int check(capi.tr_status status, object context=None) except -1:
    """Raise for a non-OK status; return 0 otherwise."""
    if status == capi.TR_OK:
        return 0
    raise status_error(status, context)


def status_name(int status):
    """The C enum constant's name for a status code (e.g. 'TR_EAGAIN')."""
    return (<bytes>capi.tr_status_name(<capi.tr_status>status)).decode()


def status_str(int status):
    """The C library's description of a status code."""
    return (<bytes>capi.tr_status_str(<capi.tr_status>status)).decode()


def now_ns():
    """The core's monotonic clock in nanoseconds."""
    return capi.tr_now_ns()
