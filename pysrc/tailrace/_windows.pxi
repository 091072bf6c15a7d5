# The common case of a tumbling window's add (tailrace.windows, rules 34, 35), compiled: a
# message of an open window that exists already is a dict lookup, the fold and two dict
# stores. Everything else (a window to create, a late message, hopping windows, updates
# emission, processing time, a key that is no str or int) goes to the runtime's Python
# add, which decides the same way. The runtime (_FixedRuntime) owns the dicts; this object
# only reads its settings, fixed when it was made.

from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.list cimport PyList_GetSlice


@cython.final
cdef class TumblingAdd:
    """``runtime.add`` for a tumbling window on event time with ``emit="final"``: its bound
    ``add``, called as the runtime's ``add(envelope, collector, coordinator=None)``; returns
    True (joined its window) or what the runtime's ``add`` returns."""

    cdef object runtime  # tailrace.windows._FixedRuntime
    cdef object slow  # runtime.add (bound)
    cdef dict entries  # (start, key) -> accumulator: the runtime's overlay
    cdef dict dirty  # its windows written since the last flush (the runtime clears it in place)
    cdef object field  # the key's message field (str), or None: envelope.key
    cdef object fold  # acc, envelope -> acc
    cdef int copy  # 0: none; 1: copy a list or dict accumulator first (see _fresh_copier)
    cdef int64_t size, offset, grace
    cdef LoopRunner loop  # the C engine's loop (watermark read in C), or None
    cdef uint32_t task
    cdef object watermark  # otherwise: () -> raw watermark
    cdef object journal_current  # tailrace.stores.journal_current
    cdef object initial  # () -> a new window's accumulator
    cdef object no_acc  # what the journal takes for "no window yet" (tailrace.stores' MISSING)
    cdef dict closing  # close time -> [(start, key), ...] of the runtime's index
    cdef object new_close_time  # runtime._new_close_time(when, entry): a time not in closing yet

    def __init__(self, runtime, field, fold, int copy, int64_t size, int64_t offset, int64_t grace,
                 loop, uint32_t task, watermark, journal_current, initial, no_acc):
        self.runtime = runtime
        self.slow = runtime.add
        self.entries = runtime._entries
        self.dirty = runtime._dirty
        self.field = field
        self.fold = fold
        self.copy = copy
        self.size = size
        self.offset = offset
        self.grace = grace
        self.loop = loop
        self.task = task
        self.watermark = watermark
        self.journal_current = journal_current
        self.initial = initial
        self.no_acc = no_acc
        self.closing = runtime._closing
        self.new_close_time = runtime._new_close_time

    def __call__(self, envelope, collector, coordinator=None):
        return self.add(envelope, collector, coordinator)

    def add(self, envelope, collector, coordinator=None):
        """The runtime's ``add`` (a method: called with the fast calling convention)."""
        cdef Envelope env
        cdef int64_t ts, start, w, rel
        cdef PyObject *found
        if type(envelope) is not Envelope:
            return self.slow(envelope, collector, coordinator)
        env = <Envelope>envelope
        ts = env._ts
        if ts == TS_UNSET:
            return self.slow(envelope, collector, coordinator)
        if self.field is None:
            key = env.key
        else:
            message = env.message
            if type(message) is not dict:
                return self.slow(envelope, collector, coordinator)
            found = PyDict_GetItem(<dict>message, self.field)
            if found is NULL:
                return self.slow(envelope, collector, coordinator)
            key = <object>found
        if type(key) is not str and type(key) is not int:
            return self.slow(envelope, collector, coordinator)
        # the window's start, floor division as Python's (windows before the epoch too);
        # no overflow: timestamps are ms since the epoch, far from the int64 bounds
        rel = (ts - self.offset) % self.size
        if rel < 0:
            rel += self.size
        start = ts - rel
        if self.loop is not None:
            w = capi.tr_loop_event_watermark(self.loop._loop, self.task)
        else:
            w = <int64_t>self.watermark()
        if w >= start + self.size + self.grace:
            return self.slow(envelope, collector, coordinator)  # late (rule 35)
        skey = (start, key)
        found = PyDict_GetItem(self.entries, skey)
        journal = self.journal_current()
        if found is NULL:  # a new window: in the close-time index, then as any other
            if journal is not None:
                journal.push(self.runtime, skey, self.no_acc)
            when = start + self.size + self.grace
            found = PyDict_GetItem(self.closing, when)
            if found is NULL:
                self.new_close_time(when, skey)  # a heap entry, maybe the timer
            else:
                (<list>found).append(skey)
            acc = self.fold(self.initial(), envelope)
            PyDict_SetItem(self.entries, skey, acc)
            PyDict_SetItem(self.dirty, skey, acc)
            return True
        acc = <object>found
        if journal is not None:
            journal.push(self.runtime, skey, acc)  # rules 39, 40: undone with the store writes
        if self.copy:
            if type(acc) is list:
                acc = PyList_GetSlice(acc, 0, len(<list>acc))
            elif type(acc) is dict:
                acc = (<dict>acc).copy()
        acc = self.fold(acc, envelope)
        PyDict_SetItem(self.entries, skey, acc)
        PyDict_SetItem(self.dirty, skey, acc)
        return True
