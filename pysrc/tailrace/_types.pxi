# Envelope and Coordinator: one of each is made per message, so they are
# compiled, final, and kept on a freelist. Both engines use these classes.
#
# Garbage collection: an Envelope is immutable, so it can be part of a
# reference cycle only through a field that can refer back to it. When every
# field is an immutable atomic value (str, int, float, bytes, bool, None: the
# common case), the envelope is untracked, as CPython does for such tuples: no
# collector pass visits it and allocating it does not trigger collections.
# Any other field (a dict message, even an empty one that CPython itself
# leaves untracked for now, or a tuple) keeps it tracked, so a cycle through
# it is still collected.

cdef extern from "Python.h":
    int PyObject_GC_IsTracked(object o)
    void PyObject_GC_Track(object o)
    void PyObject_GC_UnTrack(object o)
    bint _is_str "PyUnicode_CheckExact"(object o)
    bint _is_int "PyLong_CheckExact"(object o)
    bint _is_bytes "PyBytes_CheckExact"(object o)
    bint _is_float "PyFloat_CheckExact"(object o)
    bint _is_bool "PyBool_Check"(object o)
    # the same on a borrowed pointer: no reference taken for the check (_all_atomic)
    bint _p_is_str "PyUnicode_CheckExact"(PyObject *o)
    bint _p_is_int "PyLong_CheckExact"(PyObject *o)
    bint _p_is_bytes "PyBytes_CheckExact"(PyObject *o)
    bint _p_is_float "PyFloat_CheckExact"(PyObject *o)
    bint _p_is_bool "PyBool_Check"(PyObject *o)

# Envelope._ts before any source stamped it (no timestamp is that far before the epoch). A C
# constant, not a DEF: Cython keeps a DEF this large as a Python int, so every comparison of
# an int64_t with it built a PyLong (about 120 instructions a message on the timestamp path)
cdef extern from "<stdint.h>":
    const int64_t TS_UNSET "INT64_MIN"

# References handed over without counting them. Where Cython returns a named local, or
# unpacks a bound method before a call, it increments a count and decrements it again a few
# instructions later. On 3.12 and later the increment stores 32 bits (immortal objects) and
# the decrement loads the whole 64-bit count, which the CPU cannot forward from the store
# still in its buffer: a stall of some 20 cycles each time, on every message (perf annotate of
# sync_noop_1task on 3.12; 3.11 increments all 64 bits and does not stall). The hot paths
# (an envelope made or taken, the process call) therefore pass owned references as raw
# pointers and hand them over as they are.
cdef extern from *:
    """
    static CYTHON_INLINE PyObject *tr_handover(PyObject *owned) { return owned; }
    static CYTHON_INLINE PyObject *tr_new_raw(PyObject *type, PyObject *no_args) {
        PyTypeObject *t = (PyTypeObject *)type;
        return t->tp_new(t, no_args, NULL);
    }
    static CYTHON_INLINE PyObject *tr_type_of(PyObject *o) { return (PyObject *)Py_TYPE(o); }
    """
    # a new object of type t (an owned reference, NULL on error): t's tp_new, without __init__
    PyObject *_new_raw "tr_new_raw"(PyObject *t, PyObject *no_args) except NULL
    # the type of a borrowed object, no reference taken
    PyObject *_type_of "tr_type_of"(PyObject *o)

cdef tuple _NO_ARGS = ()

from tailrace.types import Scope as _Scope
from tailrace.types import SystemStreamPartition as _SSP

# Coordinator request bits (engines read them with Coordinator.take()).
COMMIT_CURRENT = 1
COMMIT_ALL = 2
SHUTDOWN_CURRENT = 4
SHUTDOWN_ALL = 8


@cython.final
@cython.freelist(8192)  # covers a batch of runs (64 x 64) freed before the refills that reuse them
cdef class Envelope:
    """One input message, as ``process`` receives it (immutable).

    Attributes:
        system: the name of the system it was read from (``"files"``, ``"mem"``), a str.
        stream: the name of its stream in that system, a str.
        partition: the number of its partition in that stream, an int.
        offset: where it is in its partition: an int for files, memory and Kafka, an entry id
            (a str) for Redis; a checkpoint stores the offset of the last completed message.
        key: its key (what ``collector.send(..., key=...)`` or the input's key field gave it),
            or None.
        message: the message itself, decoded (a str for text lines, the JSON value for JSON
            Lines).
        ssp: its :class:`SystemStreamPartition` (system, stream, partition).
        timestamp: its event time in ms since the epoch, an int (rule 32: from
            ``task.timestamp.field``, the task's ``timestamp`` method, the system's own record
            time, or the time it was read); None for an envelope no engine has read yet.
    """

    cdef readonly str system
    cdef readonly str stream
    cdef readonly Py_ssize_t partition
    """The number of its partition in that stream (an int)."""
    # the offset: _offset, or the int _int_offset when _int (an input with int offsets
    # passes a C integer: its int object is made only if something reads it)
    cdef object _offset
    cdef Py_ssize_t _int_offset
    cdef bint _int
    cdef readonly object key
    cdef readonly object message
    # the event time (rule 32) in ms since the epoch; TS_UNSET until a system or an engine
    # stamps it (an engine stamps every envelope it reads before dispatching it)
    cdef int64_t _ts

    def __init__(self, str system, str stream, Py_ssize_t partition, offset, key, message,
                 timestamp=None):
        self.system = system
        self.stream = stream
        self.partition = partition
        self._offset = offset
        self._int = False
        self.key = key
        self.message = message
        self._ts = TS_UNSET if timestamp is None else _timestamp_arg(timestamp)
        _settle(self)

    @property
    def timestamp(self):
        """Its event time (rule 32): an int, ms since the epoch; None before an engine read it."""
        return None if self._ts == TS_UNSET else self._ts

    @property
    def offset(self):
        """Where this message is in its partition: an int for files, memory and Kafka, an entry id
        (a str) for Redis."""
        return envelope_offset(self)

    @property
    def ssp(self):
        """The SystemStreamPartition this message came from."""
        return _SSP(self.system, self.stream, self.partition)

    def __repr__(self):
        return (f"Envelope({self.system}.{self.stream}[{self.partition}] offset={self.offset!r} "
                f"key={self.key!r} message={self.message!r})")

    def _astuple(self):
        return (self.system, self.stream, self.partition, self.offset, self.key, self.message)

    def __eq__(self, other):
        if not isinstance(other, Envelope):
            return NotImplemented
        return self._astuple() == (<Envelope>other)._astuple()

    def __hash__(self):
        return hash((self.system, self.stream, self.partition, self.offset))

    def __reduce__(self):
        return (Envelope, self._astuple() + (self.timestamp,))


cdef int64_t _timestamp_arg(object value) except? -1:
    if type(value) is not int:
        raise TypeError(f"timestamp must be an int (ms since the epoch), got {value!r}")
    if value <= TS_UNSET or value > 0x7FFFFFFFFFFFFFFF:
        raise OverflowError(f"timestamp {value} is out of range")
    return <int64_t>value


# Envelope's object fields as member descriptors (slots) instead of the properties
# Cython makes for `cdef readonly` fields: CPython 3.11+ specialises a read of a
# member descriptor (LOAD_ATTR_SLOT: a type-version check and a load) but not of a
# property written in C, which goes through the generic attribute lookup and a
# getter call (~160 instructions more for each `envelope.message` in a task).
cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        const char *name
        int type
        Py_ssize_t offset
        int flags
        const char *doc
    int T_OBJECT_EX
    int READONLY

cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        Py_ssize_t tp_basicsize
        PyObject *tp_dict
    object PyDescr_NewMember(PyTypeObject *type, PyMemberDef *member)
    void PyType_Modified(PyTypeObject *type)

cdef PyMemberDef _ENVELOPE_MEMBERS[4]  # static: a member descriptor keeps a pointer to its entry


cdef void _member(int i, const char *name, Py_ssize_t offset, const char *doc) noexcept:
    _ENVELOPE_MEMBERS[i].name = name  # name and doc: C string literals, static
    _ENVELOPE_MEMBERS[i].type = T_OBJECT_EX  # never NULL: tp_new sets object fields to None
    _ENVELOPE_MEMBERS[i].offset = offset
    _ENVELOPE_MEMBERS[i].flags = READONLY
    _ENVELOPE_MEMBERS[i].doc = doc  # what help(Envelope) shows under the attribute


cdef Py_ssize_t _field_offset(object probe, object value) except -1:
    """Where in ``probe`` (an Envelope) the pointer to ``value`` is kept."""
    cdef char *base = <char *><PyObject *>probe
    cdef Py_ssize_t off
    for off in range(<Py_ssize_t>sizeof(PyObject), (<PyTypeObject *>Envelope).tp_basicsize,
                     <Py_ssize_t>sizeof(void *)):
        if (<PyObject **>(base + off))[0] == <PyObject *>value:
            return off
    raise RuntimeError("Envelope: a field was not found in its object")


cdef int _envelope_members() except -1:
    # distinct objects in each field, found in the object's memory (Cython's struct of
    # the class has no name to give offsetof)
    system, stream = "".join(["sys", "tem"]), "".join(["str", "eam"])
    key, message = object(), object()
    cdef Envelope probe = new_envelope(system, stream, 0, None, key, message)
    cdef PyTypeObject *tp = <PyTypeObject *>Envelope
    cdef Py_ssize_t i
    _member(0, "system", _field_offset(probe, system),
            "The name of the system the message was read from (a str).")
    _member(1, "stream", _field_offset(probe, stream), "The name of its stream in that system (a str).")
    _member(2, "key", _field_offset(probe, key), "The message's key, or None.")
    _member(3, "message", _field_offset(probe, message),
            "The message itself, decoded (a str for text lines, the JSON value for JSON Lines).")
    for i in range(4):  # tp_dict is borrowed from the type; the dict owns each new descriptor
        (<dict>tp.tp_dict)[_ENVELOPE_MEMBERS[i].name.decode()] = PyDescr_NewMember(tp, &_ENVELOPE_MEMBERS[i])
    PyType_Modified(tp)
    return 0


_envelope_members()


cdef extern from *:
    # the reference ``owned`` holds becomes the returned Envelope's, no count taken (typed:
    # a cast of an object result would take a count and drop it again)
    Envelope _handover_envelope "tr_handover"(PyObject *owned)


cdef inline Envelope new_envelope(str system, str stream, Py_ssize_t partition,
                                  object offset, object key, object message):
    """New reference. Skips __init__ (arguments are trusted, types already checked)."""
    cdef PyObject *p = _new_raw(<PyObject *>Envelope, <PyObject *>_NO_ARGS)  # owned: handed over
    (<Envelope>p).system = system
    (<Envelope>p).stream = stream
    (<Envelope>p).partition = partition
    (<Envelope>p)._offset = offset
    (<Envelope>p)._int = False
    (<Envelope>p).key = key
    (<Envelope>p).message = message
    (<Envelope>p)._ts = TS_UNSET
    _settle_new(<Envelope>p)
    return _handover_envelope(p)


cdef inline Envelope new_envelope_at(str system, str stream, Py_ssize_t partition,
                                     Py_ssize_t offset, object key, object message):
    """new_envelope with an int offset, kept as a C integer until read."""
    return new_envelope_at_ts(system, stream, partition, offset, key, message, TS_UNSET)


cdef inline Envelope new_envelope_at_ts(str system, str stream, Py_ssize_t partition,
                                        Py_ssize_t offset, object key, object message, int64_t ts):
    """new_envelope_at, stamped ``ts``."""
    cdef PyObject *p = _new_raw(<PyObject *>Envelope, <PyObject *>_NO_ARGS)  # owned: handed over
    (<Envelope>p).system = system
    (<Envelope>p).stream = stream
    (<Envelope>p).partition = partition
    (<Envelope>p)._int_offset = offset
    (<Envelope>p)._int = True
    (<Envelope>p).key = key
    (<Envelope>p).message = message
    (<Envelope>p)._ts = ts
    _settle_new(<Envelope>p)
    return _handover_envelope(p)


cdef inline object envelope_offset(Envelope e):
    return e._int_offset if e._int else e._offset


cdef inline bint _atomic(object o) noexcept:
    return o is None or _is_str(o) or _is_int(o) or _is_bytes(o) or _is_float(o) or _is_bool(o)


cdef inline bint _p_atomic(PyObject *o) noexcept:
    """_atomic of a borrowed field: no reference counted (each costs an immortality check
    on 3.12+), once per envelope made."""
    return (o == <PyObject *>None or _p_is_str(o) or _p_is_int(o) or _p_is_bytes(o)
            or _p_is_float(o) or _p_is_bool(o))


cdef inline bint _all_atomic(Envelope e) noexcept:
    return (_p_atomic(<PyObject *>e.message) and _p_atomic(<PyObject *>e.key)
            and (e._int or _p_atomic(<PyObject *>e._offset)))


cdef inline void _settle_new(Envelope e) noexcept:
    """_settle for an envelope just made by tp_new, which tracked it (a GC type). Settled
    once, when it is made: its fields never change after that."""
    if _all_atomic(e):
        PyObject_GC_UnTrack(e)


cdef inline void _settle(Envelope e) noexcept:
    """Track e for cycle collection unless every field is atomic (see the top)."""
    if _all_atomic(e):
        if PyObject_GC_IsTracked(e):
            PyObject_GC_UnTrack(e)
    elif not PyObject_GC_IsTracked(e):
        PyObject_GC_Track(e)


def entry_envelope(str system, str stream, Py_ssize_t partition, offset, key, message):
    """The Envelope of a Redis stream entry: its timestamp is the milliseconds part of its id
    ``"<ms>-<seq>"`` (rule 32: the system's own record time)."""
    cdef Envelope e = new_envelope(system, stream, partition, offset, key, message)
    cdef Py_ssize_t dash
    if type(offset) is str:
        dash = (<str>offset).find("-")
        if 0 < dash <= 18 and (<str>offset)[:dash].isascii() and (<str>offset)[:dash].isdigit():
            e._ts = <int64_t>int((<str>offset)[:dash])
    return e


def make_envelopes(str system, str stream, Py_ssize_t partition, Py_ssize_t first_offset,
                   messages, keys=None):
    """Envelopes for ``messages`` with consecutive int offsets from ``first_offset``.

    ``keys`` is None or a sequence as long as ``messages``. Returns a new list.
    """
    cdef list out = []
    cdef Py_ssize_t i = first_offset
    if keys is None:
        for m in messages:
            out.append(new_envelope_at(system, stream, partition, i, None, m))
            i += 1
    else:
        if len(keys) != len(messages):
            raise ValueError(f"{len(messages)} messages but {len(keys)} keys")
        for k, m in zip(keys, messages):
            out.append(new_envelope_at(system, stream, partition, i, k, m))
            i += 1
    return out


@cython.final
@cython.freelist(256)
cdef class Coordinator:
    """Lets process/window/end_of_stream request a commit or a shutdown (rule 14).

    A request made while processing message k takes effect once messages 0..k of
    the task have completed in order. Scope.CURRENT_TASK (default) or
    Scope.ALL_TASKS_IN_CONTAINER. Requests are recorded; they never raise later.
    """

    cdef public int _requests

    def __cinit__(self):
        self._requests = 0

    def commit(self, scope=_Scope.CURRENT_TASK):
        """Request a commit of this task (or of every task)."""
        cdef int s = _scope(scope)
        self._requests |= COMMIT_CURRENT if s == 1 else COMMIT_ALL

    def shutdown(self, scope=_Scope.CURRENT_TASK):
        """Vote to stop (CURRENT_TASK), or stop the whole container (ALL_TASKS_IN_CONTAINER)."""
        cdef int s = _scope(scope)
        self._requests |= SHUTDOWN_CURRENT if s == 1 else SHUTDOWN_ALL

    @property
    def commit_requested(self):
        """The widest commit scope requested so far, or None."""
        if self._requests & COMMIT_ALL:
            return _Scope.ALL_TASKS_IN_CONTAINER
        if self._requests & COMMIT_CURRENT:
            return _Scope.CURRENT_TASK
        return None

    @property
    def shutdown_requested(self):
        """The widest shutdown scope requested so far, or None."""
        if self._requests & SHUTDOWN_ALL:
            return _Scope.ALL_TASKS_IN_CONTAINER
        if self._requests & SHUTDOWN_CURRENT:
            return _Scope.CURRENT_TASK
        return None

    cpdef int take(self):
        """Engines: the request bits (COMMIT_*/SHUTDOWN_*), and clear them."""
        cdef int r = self._requests
        self._requests = 0
        return r

    def __repr__(self):
        return f"Coordinator(commit={self.commit_requested!r}, shutdown={self.shutdown_requested!r})"


cdef inline int _scope(object scope) except -1:
    cdef int s
    try:
        s = int(scope)
    except (TypeError, ValueError):
        s = 0
    if s != 1 and s != 2:
        raise ValueError(f"scope must be Scope.CURRENT_TASK or Scope.ALL_TASKS_IN_CONTAINER, got {scope!r}")
    return s
