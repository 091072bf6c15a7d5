# Event timestamps (rule 32; tailrace/timestamps.py says where they come from). Each
# engine stamps the envelopes it reads, once, before they are buffered for dispatch:
# stamp_envelopes for a batch (the reference engine, the C loop's eager refills),
# TimestampReader.stamp for one envelope. Without a TimestampReader (no field, no
# method) stamping is one int store for an envelope no system stamped (ingestion time).

from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.exc cimport PyErr_Clear

cdef extern from *:
    """
    /* An exact int as int64_t without raising: 1 and *out set, or 0 (too large; the caller
     * takes its slow path, which says why). Inline for the sizes a ms timestamp has (two
     * 30-bit digits on 3.11; compact ones on 3.12+), else PyLong_AsLongLongAndOverflow. */
    static inline int tr_ts_long(PyObject *o, int64_t *out) {
    #if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
        const digit *d = ((PyLongObject *)o)->ob_digit;
        switch (Py_SIZE(o)) {
        case 0: *out = 0; return 1;
        case 1: *out = (int64_t)d[0]; return 1;
        case -1: *out = -(int64_t)d[0]; return 1;
        case 2: *out = ((int64_t)d[1] << 30) | (int64_t)d[0]; return 1;
        case -2: *out = -(((int64_t)d[1] << 30) | (int64_t)d[0]); return 1;
        default: break;
        }
    #elif PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
            *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
            return 1;
        }
    #endif
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        *out = (int64_t)v;
        return 1;
    }
    """
    bint tr_ts_long(PyObject *o, int64_t *out) noexcept
    PyObject *_dict_get "PyDict_GetItemWithError"(PyObject *d, PyObject *key)

import time as _ts_time

from tailrace import timestamps as _timestamps_py
from tailrace.types import BadInput as _TsBadInput

cdef dict _UNIT_CODES = {"ms": 0, "s": 1, "us": 2, "ns": 3, "iso8601": 4}


@cython.final
cdef class TimestampReader:
    """Reads each envelope's timestamp from a message field or the task's ``timestamp``
    method (rule 32). Loop thread only. Built by tailrace.timestamps.timestamp_reader."""

    cdef str task
    cdef object field  # the message field (str), or None: the method
    cdef str unit
    cdef int unit_code
    cdef object method  # the task's bound timestamp method, or None
    cdef str source  # where the timestamp is looked for, as errors say it

    def __init__(self, str task, field, str unit, method):
        if unit not in _UNIT_CODES:
            raise ValueError(f"unit must be one of {', '.join(_UNIT_CODES)}, got {unit!r}")
        self.task = task
        self.field = field
        self.unit = unit
        self.unit_code = _UNIT_CODES[unit]
        self.method = method
        if field is not None:
            self.source = f"message field {field!r} ({unit})"
        else:
            self.source = "the task's timestamp method"

    cdef int64_t _read(self, Envelope env) except? -1:
        """The timestamp of ``env`` (raises when it cannot be read)."""
        cdef int overflow = 0
        cdef long long v
        if self.field is None:
            value = self.method(env)
            if type(value) is not int:
                raise _timestamps_py.TimestampUnreadable(
                    f"timestamp() must return an int (ms since the epoch), got {value!r}")
            return _timestamp_arg(value)
        message = env.message
        if type(message) is not dict:
            raise _timestamps_py.TimestampUnreadable(
                f"the message is a {type(message).__name__}, not an object with fields")
        value = (<dict>message).get(self.field, _MISSING)
        if value is _MISSING:
            raise _timestamps_py.TimestampUnreadable(f"the message has no field {self.field!r}")
        if self.unit_code == 0 and _is_int(value):
            v = PyLong_AsLongLongAndOverflow(value, &overflow)
            if overflow == 0 and v != TS_UNSET:
                return <int64_t>v
        if self.unit_code == 4:
            return _timestamps_py.iso8601_ms(value)
        return _timestamps_py.number_ms(value, self.unit)

    cpdef Envelope stamp(self, Envelope env):
        """``env`` with its timestamp set (new reference), or in its place a bad message
        (rule 39) whose BadInput names task, partition, offset and why."""
        cdef PyObject *found
        cdef int64_t ts
        # the common case without a try (its setup saves the exception state): an int of
        # ms in a dict's field; anything else takes _read, which says what is wrong
        if self.unit_code == 0 and self.field is not None and type(env.message) is dict:
            # borrowed; PyDict_GetItem would save and restore the exception state each time
            found = _dict_get(<PyObject *>env.message, <PyObject *>self.field)
            if found is NULL:
                PyErr_Clear()  # a key's __eq__ that raised: _read looks again and says so
            elif _p_is_int(found) and tr_ts_long(found, &ts) and ts != TS_UNSET:
                env._ts = ts
                return env
        return self._stamp_slow(env)

    cdef Envelope _stamp_slow(self, Envelope env):
        try:
            env._ts = self._read(env)
            return env
        except Exception as e:
            error = _timestamps_py.timestamp_error(self.task, env.ssp, env.offset, self.source, e)
            bad = Envelope(env.system, env.stream, env.partition, env.offset, env.key,
                           _TsBadInput(error, None, env.message))
            bad._ts = env._ts  # the system's time, where it gave one; else none
            return bad


cdef object _MISSING = object()


cpdef int stamp_envelopes(list batch, TimestampReader reader, int64_t now_ms) except -1:
    """Stamp every envelope of ``batch`` read at wall time ``now_ms`` (ms since the epoch):
    by ``reader`` when there is one (an unreadable timestamp replaces the envelope by a bad
    message in its place), else those no system stamped get ``now_ms`` (ingestion time)."""
    cdef Py_ssize_t i, n = len(batch)
    cdef Envelope env
    if reader is None:
        for i in range(n):
            env = <Envelope?>batch[i]
            if env._ts == TS_UNSET:
                env._ts = now_ms
        return 0
    for i in range(n):
        env = <Envelope?>batch[i]
        batch[i] = reader.stamp(env)
    return 0


def wall_ms(clock):
    """The wall time of ``clock`` (tailrace.clock; None: real time) in whole ms since the epoch."""
    return int((_ts_time.time() if clock is None else clock.time()) * 1000)
