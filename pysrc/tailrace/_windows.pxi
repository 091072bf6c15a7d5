# The common case of a tumbling window's add (tailrace.windows, rules 34, 35), compiled: a
# message of an open window that exists already is a dict lookup, the fold and two dict
# stores. Everything else (a window to create, a late message, hopping windows, updates
# emission, processing time, a key that is no str or int) goes to the runtime's Python
# add, which decides the same way. The runtime (_FixedRuntime) owns the dicts; this object
# only reads its settings, fixed when it was made. Loop thread only (a task whose add may run
# on another thread gets no TumblingAdd). References: PyDict_GetItem's are borrowed and each is
# turned into an owned object (<object>found) before anything can change its dict.

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
    cdef object parts  # Agg of Count/Sum/Min/Max fields: kinds and fields set; else None
    cdef list kinds
    cdef list fields

    def __init__(self, runtime, field, fold, int copy, int64_t size, int64_t offset, int64_t grace,
                 loop, uint32_t task, watermark, journal_current, initial, no_acc, parts=None):
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
        self.parts = parts
        if parts is not None:
            self.kinds = [kind for kind, _ in parts]
            self.fields = [field for _, field in parts]

    def __call__(self, envelope, collector, coordinator=None):
        return self.add(envelope, collector, coordinator)

    def add(self, envelope, collector, coordinator=None):
        """The runtime's ``add`` (a method: called with the fast calling convention)."""
        return self._add(envelope, collector, coordinator, True)

    def process(self, envelope, collector, coordinator):
        """The task's ``process`` when this window's add is all of it (a task declaring one
        window and no process, without callback timeouts): nothing can fail after the add,
        and a failing add changes nothing, so no undo journal is kept."""
        return self._add(envelope, collector, coordinator, False)

    cdef object _add(self, envelope, collector, coordinator, bint journaled):
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
        created = found is NULL
        base = self.initial() if created else <object>found
        if self.parts is not None:
            acc = self._fold_parts(base, env)
            if acc is None:
                return self.slow(envelope, collector, coordinator)  # it says what is wrong
        else:
            acc = base
            if self.copy and not created:  # the journal keeps base as it is
                if type(acc) is list:
                    acc = PyList_GetSlice(acc, 0, len(<list>acc))
                elif type(acc) is dict:
                    acc = (<dict>acc).copy()
            acc = self.fold(acc, envelope)  # raising: nothing changed
        if journaled:
            journal = self.journal_current()
            if journal is not None:  # rules 39, 40: undone with the store writes
                journal.push(self.runtime, skey, self.no_acc if created else base)
        if created:  # a new window: in the close-time index
            when = start + self.size + self.grace
            found = PyDict_GetItem(self.closing, when)
            if found is NULL:
                self.new_close_time(when, skey)  # a heap entry, maybe the timer
            else:
                (<list>found).append(skey)
        PyDict_SetItem(self.entries, skey, acc)
        PyDict_SetItem(self.dirty, skey, acc)
        return True

    cdef object _fold_parts(self, object base, Envelope env):
        """Agg of Count / Sum / Min / Max of fields, without a Python call: the new
        accumulator, or None to leave the message to the runtime's add (a missing field)."""
        cdef list acc = <list?>base
        cdef list out = []
        cdef Py_ssize_t i, n = len(self.kinds)
        cdef int kind
        cdef PyObject *found
        message = env.message
        if type(message) is not dict or len(acc) != n:
            return None
        for i in range(n):
            kind = self.kinds[i]
            v = acc[i]
            if kind == 0:
                out.append(v + 1)
                continue
            found = PyDict_GetItem(<dict>message, self.fields[i])
            if found is NULL:
                return None
            x = <object>found
            if kind == 1:
                out.append(v + x)
            elif kind == 2:
                out.append(x if v is None or x < v else v)
            else:
                out.append(x if v is None or x > v else v)
        return out
