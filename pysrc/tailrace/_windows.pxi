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
from libc.stdlib cimport malloc, free

cdef extern from *:
    """
    /* A tuple's hash is not cached: the window key's is computed once and used for each of
     * its dict operations (the _KnownHash calls of 3.11 and 3.12; plain ones after). */
    #if PY_VERSION_HEX < 0x030D0000
    #define tr_dict_get_h(d, k, h) _PyDict_GetItem_KnownHash((d), (k), (h))
    #define tr_dict_set_h(d, k, v, h) _PyDict_SetItem_KnownHash((d), (k), (v), (h))
    #else
    #define tr_dict_get_h(d, k, h) PyDict_GetItemWithError((d), (k))
    #define tr_dict_set_h(d, k, v, h) PyDict_SetItem((d), (k), (v))
    #endif
    """
    # borrowed, or NULL: absent or an error (a tuple of an int and a str or int: none)
    PyObject *tr_dict_get_h(object d, object key, Py_hash_t h)
    int tr_dict_set_h(object d, object key, object value, Py_hash_t h) except -1


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
    cdef object parts  # Agg of Count/Sum/Min/Max fields: nparts, kinds and fields set; else None
    cdef Py_ssize_t nparts
    cdef int *kinds  # nparts kinds (0 Count, 1 Sum, 2 Min, 3 Max), owned (__dealloc__)
    cdef list fields  # each part's message field (None for Count)
    cdef list scratch  # process: the parts' new values, before any is written
    cdef int64_t start_at0, start_at1  # the last two windows' starts, and their int objects
    cdef object start_obj0, start_obj1

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
        self.start_at0 = self.start_at1 = TS_UNSET  # (no window starts there)
        if parts is not None:
            self.kinds = <int *>malloc(len(parts) * sizeof(int))
            if self.kinds is NULL:
                raise MemoryError()
            for i, (kind, _) in enumerate(parts):
                self.kinds[i] = kind
            self.nparts = len(parts)
            self.fields = [field for _, field in parts]
            self.scratch = [None] * self.nparts

    def __dealloc__(self):
        free(self.kinds)

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
        cdef Py_hash_t h
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
        # the start as the int object of an earlier message of its window where one is at
        # hand (two: the window now and the one before, out of order within the lag): the
        # lookups of equal keys then compare it by identity
        if start == self.start_at0:
            start_obj = self.start_obj0
        elif start == self.start_at1:
            start_obj = self.start_obj1
        else:
            start_obj = start
            self.start_at1, self.start_obj1 = self.start_at0, self.start_obj0
            self.start_at0, self.start_obj0 = start, start_obj
        skey = (start_obj, key)
        h = hash(skey)
        found = tr_dict_get_h(self.entries, skey, h)
        created = found is NULL
        if not journaled and not created and self.nparts:
            # process (no journal): the accumulator changes in place, no new one a message;
            # the runtime's flush hands the store a copy
            if not self._fold_parts_into(<object>found, env):
                return self.slow(envelope, collector, coordinator)  # it says what is wrong
            if tr_dict_get_h(self.dirty, skey, h) is NULL:
                tr_dict_set_h(self.dirty, skey, <object>found, h)
            return True
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
        tr_dict_set_h(self.entries, skey, acc, h)
        tr_dict_set_h(self.dirty, skey, acc, h)
        return True

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef bint _fold_values(self, list acc, dict message, list out) except -1:
        """Agg of Count / Sum / Min / Max of fields, without a Python call: each part's new
        value into ``out`` (``nparts`` long), ``acc`` left as it is; False for a missing field
        (the runtime's add then says what is wrong). A raising part leaves ``acc`` unchanged."""
        cdef Py_ssize_t i
        cdef int kind
        cdef PyObject *found
        for i in range(self.nparts):
            kind = self.kinds[i]
            v = acc[i]
            if kind == 0:
                out[i] = v + 1
                continue
            found = PyDict_GetItem(message, self.fields[i])  # borrowed: owned as x at once
            if found is NULL:
                return False
            x = <object>found
            if kind == 1:
                out[i] = v + x
            elif kind == 2:
                out[i] = x if v is None or x < v else v
            else:
                out[i] = x if v is None or x > v else v
        return True

    cdef bint _fold_parts_into(self, object base, Envelope env) except -1:
        """``_fold_values`` into ``base`` itself, every part computed before any is written
        (a raising or missing part changes nothing). False to leave the message to the
        runtime's add."""
        cdef list new = self.scratch
        cdef Py_ssize_t i
        message = env.message
        if type(base) is not list or type(message) is not dict or len(<list>base) != self.nparts:
            return False
        try:
            if not self._fold_values(<list>base, <dict>message, new):
                return False
            for i in range(self.nparts):
                (<list>base)[i] = new[i]
        finally:
            for i in range(self.nparts):
                new[i] = None  # holds no value past the call
        return True

    cdef object _fold_parts(self, object base, Envelope env):
        """``_fold_values`` into a new accumulator, or None to leave the message to the
        runtime's add (a missing field)."""
        message = env.message
        if type(base) is not list or type(message) is not dict or len(<list>base) != self.nparts:
            return None
        out = [None] * self.nparts
        return out if self._fold_values(<list>base, <dict>message, out) else None
