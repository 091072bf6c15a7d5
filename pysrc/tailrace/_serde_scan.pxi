# Byte scans for tailrace.serdes' orjson fast path: run once per encoded or decoded
# message, so compiled (one pass over the buffer, no allocation). serdes keeps a
# pure-Python version of each and a test checks all three agree with the regexes
# they stand for.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE


def json_long_digits(bytes data not None):
    """True when ``data`` holds a run of 19 or more ASCII digits (regex ``[0-9]{19}``)."""
    cdef const unsigned char *b = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t i, run = 0, n = PyBytes_GET_SIZE(data)
    for i in range(n):
        if 48 <= b[i] <= 57:
            run += 1
            if run >= 19:
                return True
        else:
            run = 0
    return False


def json_std_decides(bytes data not None):
    """True when ``data`` matches ``[0-9][eE]|0\\.0000|null``: orjson output the standard
    library may write differently (an exponent, a small float, NaN or inf as null)."""
    cdef const unsigned char *out = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(data)
    cdef unsigned char c
    for i in range(n):
        c = out[i]
        if 48 <= c <= 57:
            if i + 1 < n and (out[i + 1] == 101 or out[i + 1] == 69):  # e, E
                return True
            if (c == 48 and i + 5 < n and out[i + 1] == 46 and out[i + 2] == 48
                    and out[i + 3] == 48 and out[i + 4] == 48 and out[i + 5] == 48):  # 0.0000
                return True
        elif (c == 110 and i + 3 < n and out[i + 1] == 117 and out[i + 2] == 108
              and out[i + 3] == 108):  # null
            return True
    return False
