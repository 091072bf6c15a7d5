# The binding of the C dispatch loop (csrc/include/tailrace/loop.h).
#
# The GIL is released in one place, LoopRunner.run (`with nogil`). The C loop
# re-enters Python only through the trampolines below (`noexcept with gil`):
# _batch_trampoline once per batch on the loop thread, _pool_trampoline once
# per batch on a pool thread. They catch every exception, record it, and tell
# the loop to stop; nothing propagates into C.
#
# Pins (habit 5): while C holds a pointer to a Python object, a reference is
# held for it:
#   - envelope in an input ring: INCREF in _refill; the PROCESS op hands that
#     reference back (_take_item steals it); leftovers are released in _drain.
#   - a lazy item in an input ring (odd: offset and partition index, see
#     _refill_range) is no pointer: its message lives in the reader's list,
#     which _PartState.range_messages holds for the whole run.
#   - error object posted to the loop: INCREF in _post; released by take_error
#     (handed to the caller) or __dealloc__.
#   - string offsets: not pointers in C; C holds integer ids, the objects live
#     in _PartState.pinned and are released (with the GIL) in _refill once the
#     watermark moved past them.
#   - the runner itself: every Callback holds a reference to its LoopRunner, so
#     the C loop outlives any callback that can still call into it.

from cpython.exc cimport PyErr_CheckSignals
from cpython.method cimport PyMethod_Check, PyMethod_GET_FUNCTION, PyMethod_GET_SELF
from cpython.long cimport PyLong_AsLongLongAndOverflow

import threading as _threading
import time as _time

from tailrace.errors import CallbackError as _CallbackError
from tailrace.errors import CallbackTimeoutError as _CallbackTimeoutError
from tailrace.errors import TaskError as _TaskError
from tailrace.types import BadInput as _BadInputType

import functools as _functools

# an envelope whose input could not be read (rule 39): never handed to process
cdef object _BAD_INPUT = _BadInputType

cdef extern from *:
    """
    /* A sync task's process(envelope, collector, coordinator), its bound method unpacked
       once a run (func and self borrowed from it): no count taken or dropped around the
       call, where Cython's own unpacking of the method takes one and drops it at once
       (a store-forwarding stall on 3.12+: see tr_handover in _types.pxi). */
    static CYTHON_INLINE PyObject *tr_call_process(PyObject *func, PyObject *self, PyObject *env,
                                                   PyObject *collector, PyObject *coord) {
        PyObject *args[5] = {NULL, self, env, collector, coord};
        PyObject **at = self != NULL ? args + 1 : args + 2;
        size_t nargsf = self != NULL ? 4 : (3 | PY_VECTORCALL_ARGUMENTS_OFFSET);
        vectorcallfunc call = PyVectorcall_Function(func);  /* a Python function's: direct */
        if (call != NULL)
            return call(func, at, nargsf, NULL);
        return PyObject_Vectorcall(func, at, nargsf, NULL);
    }
    """
    object _call_process "tr_call_process"(PyObject *func, PyObject *self, object env,
                                           object collector, object coord)
    # a borrowed item of a borrowed list (Cython's PyList_GET_ITEM counts the list)
    PyObject *_list_item "PyList_GET_ITEM"(PyObject *lst, Py_ssize_t i)


def _retry_sync(process, Envelope env, collector, Coordinator coord):
    """One more attempt of a sync process call (task.error.retries)."""
    coord._requests = 0
    process(env, collector, coord)


cdef extern from "Python.h":
    unsigned long PyThread_get_thread_ident()
    ctypedef struct PyThreadState:
        pass
    ctypedef int PyGILState_STATE
    PyGILState_STATE PyGILState_Ensure() nogil
    void PyGILState_Release(PyGILState_STATE) nogil
    PyThreadState *PyEval_SaveThread() nogil
    void PyEval_RestoreThread(PyThreadState *tstate) nogil

# Packed words (lazy ring items, offset handles) are made and read only with the
# range-checked helpers of tailrace/encoding.h (capi.tr_lazy_*, capi.tr_handle_*).
DEF RUN_PENDING = 1
DEF RUN_DONE = 2
DEF RUN_FAILED = 3
DEF RUN_ABANDONED = 4  # failed, then skipped or dead-lettered: a later resolution is dropped

DEF V_FAIL = 0  # tailrace.engine.policy's verdicts
DEF V_IGNORED = 1

OP_PROCESS = capi.TR_OP_PROCESS
OP_WINDOW = capi.TR_OP_WINDOW
OP_COMMIT = capi.TR_OP_COMMIT
OP_TIMER = capi.TR_OP_TIMER
OP_END_OF_STREAM = capi.TR_OP_END_OF_STREAM
STOP_REASONS = {
    capi.TR_STOP_NONE: "none",
    capi.TR_STOP_END_OF_STREAM: "end_of_stream",
    capi.TR_STOP_SHUTDOWN: "shutdown",
    capi.TR_STOP_EXTERNAL: "stop",
    capi.TR_STOP_ERROR: "error",
    capi.TR_STOP_TIMEOUT: "timeout",
}


@cython.final
cdef class _PartState:
    """Loop-side state of one input partition (touched with the GIL)."""

    cdef public object ssp
    cdef public object reader
    cdef public object low_watermark  # last released offset (or the start offset)
    cdef public object committed  # last committed offset
    cdef public object newest_read
    cdef public long long read_n
    cdef public long long released_n
    cdef public long long committed_n
    cdef dict pinned  # id -> offset object, for offsets that are not small ints
    cdef object poll_range  # the reader's _tailrace_poll_range (MemorySystem bounded), or None
    # wall time (ms since the epoch) of its latest read: the ingestion time of a lazy item
    # (_take_item), which an envelope without another timestamp gets (rule 32)
    cdef int64_t read_ms
    # The lists poll_range returned the first time, when they are lists: lazy ring
    # items index them (a later call returning other objects gets eager envelopes).
    cdef list range_messages
    cdef list range_keys
    cdef bint range_keyed
    cdef str system
    cdef str stream
    cdef Py_ssize_t partition
    cdef long long next_id
    cdef long long purged

    def __init__(self, ssp, reader, start):
        self.ssp = ssp
        self.reader = reader
        self.low_watermark = start
        self.committed = start
        self.newest_read = None
        self.pinned = {}
        self.poll_range = getattr(reader, "_tailrace_poll_range", None)
        self.system = ssp.system
        self.stream = ssp.stream
        self.partition = ssp.partition

    cdef inline uint64_t handle_for(self, object offset):
        cdef int overflow = 0
        cdef long long v
        cdef uint64_t h
        if _is_int(offset):
            v = PyLong_AsLongLongAndOverflow(offset, &overflow)
            if overflow == 0 and v >= 0 and capi.tr_handle_int(<uint64_t>v, &h):
                return h
        cdef long long i = self.next_id
        if not capi.tr_handle_pinned(<uint64_t>i, &h):
            raise OverflowError(f"{self.ssp}: more than 2**62 pinned offsets")
        self.next_id += 1
        self.pinned[i] = offset  # a reference held until the watermark passes it
        return h

    cdef inline uint64_t handle_of(self, Envelope env) except? 0:
        """handle_for(env.offset), without making an int offset's object."""
        cdef uint64_t h
        if env._int and env._int_offset >= 0 and capi.tr_handle_int(<uint64_t>env._int_offset, &h):
            return h
        return self.handle_for(envelope_offset(env))

    cdef object offset_of(self, uint64_t handle):
        if handle & 1 == 0:
            return <object>(handle >> 1)
        return self.pinned.get(<long long>(handle >> 1))

    cdef void purge_below(self, uint64_t handle):
        """Drop pinned offsets older than the watermark's own (GIL held)."""
        if handle & 1 == 0:
            return
        cdef long long upto = <long long>(handle >> 1)
        cdef dict pinned = self.pinned
        while self.purged < upto:
            pinned.pop(self.purged, None)
            self.purged += 1

    @property
    def pinned_count(self):
        return len(self.pinned)


@cython.final
cdef class _TaskSlot:
    """Per-task data the batch executor needs (immutable during the run)."""

    cdef public str name
    cdef public object plan
    cdef public object process  # bound process / process_async
    cdef public object collector
    cdef public Coordinator coordinator  # reused by sync process (one thread at a time)
    cdef public bint is_async
    cdef public bint pooled_concurrent  # sync on the pool at max concurrency > 1
    cdef public list parts  # _PartState per partition index
    cdef public long long failed
    cdef public long long ignored
    cdef public long long commits
    cdef public long long timers  # user timers fired (one TIMER op runs every timer due)
    # task.error.policy (tailrace.engine.policy.ErrorPolicy) when it decides anything
    # besides failing, else None; journal: a sync task's undo journal (stores), or None
    cdef public object policy
    cdef public object journal  # a tailrace.stores.Journal, or None
    # where its envelopes' timestamps come from when not from the system or the wall clock
    # (rule 32): a field or its timestamp method; None: the system's time or ingestion time
    cdef public TimestampReader timestamps
    # event-time timers or windows (rules 35, 38): its watermark follows the messages handed
    # to it (tr_loop_event_seen, before each call); part_index: (stream, partition) -> index
    cdef public bint et_track
    cdef public dict part_index

    def __init__(self, str name, plan, process, collector, bint is_async, list parts):
        self.name = name
        self.plan = plan
        self.process = process
        self.collector = collector
        self.coordinator = Coordinator()
        self.is_async = is_async
        self.parts = parts


@cython.final
@cython.freelist(1024)
cdef class Callback:
    """Completion handle of one envelope (rules 12, 17, 22). Any thread, once.

    Exactly one of ``complete()`` / ``fail(exc)`` may be called; a second
    resolution stops the container with CallbackError.
    """

    cdef LoopRunner _runner  # pins the runner and its C loop
    cdef Envelope _env
    cdef Coordinator _coordinator
    cdef uint64_t _seq
    cdef uint32_t _task
    cdef bint _inline  # completed on the loop thread inside its batch
    # completed during its own process_async call on the loop thread: sequenced when the
    # call returns, so a request the call makes after complete() counts (rule 14)
    cdef bint _held
    # with task.callback.timeout.ms: while its process_async call runs on the loop thread,
    # the monotonic time past which a completion is late (0: not in that call)
    cdef double _late_after
    # In a run (_run_async) a callback has no sequence number until it escapes:
    # _rstate RUN_PENDING / RUN_DONE / RUN_FAILED (with the requests in _rreq),
    # changed only with the GIL held; 0 once sequenced (complete() goes to C).
    cdef int _rstate
    cdef int _rreq

    def complete(self):
        """Mark the message done (from any thread)."""
        self._runner._resolve(self, None)

    def fail(self, exc):
        """Mark the message failed: stops the container with TaskError (rule 16)."""
        if not isinstance(exc, BaseException):
            exc = TypeError(f"callback.fail() expects an exception, got {exc!r}")
        self._runner._resolve(self, exc)

    def __repr__(self):
        return f"<callback task={self._task} seq={self._seq} offset={self._env.offset!r}>"


@cython.boundscheck(True)  # the reader's lists are checked at refill; a later shrink raises
cdef inline Envelope _take_item(uint64_t item, _TaskSlot slot):
    """The envelope of a ring item, as a new reference.

    An even item is an envelope: this steals the ring's pin. An odd one is lazy
    (_refill_range): the envelope is built now, from the reader's lists, so it
    is made and freed while warm instead of waiting cold in the ring.
    """
    cdef PyObject *ps  # borrowed from slot.parts (no count taken: see tr_handover)
    cdef Py_ssize_t off
    if item & 1:
        ps = _list_item(<PyObject *>slot.parts, capi.tr_lazy_partition(item))
        off = <Py_ssize_t>capi.tr_lazy_offset(item)
        if slot.timestamps is None:  # stamped with its ingestion time
            return new_envelope_at_ts(
                (<_PartState>ps).system, (<_PartState>ps).stream, (<_PartState>ps).partition, off,
                (<_PartState>ps).range_keys[off] if (<_PartState>ps).range_keyed else None,
                (<_PartState>ps).range_messages[off], (<_PartState>ps).read_ms)
        # a tracking task's (its watermark follows the messages handed to it, rule 33): read
        # now, or a bad message in its place (rule 39)
        return slot.timestamps.stamp(new_envelope_at(
            (<_PartState>ps).system, (<_PartState>ps).stream, (<_PartState>ps).partition, off,
            (<_PartState>ps).range_keys[off] if (<_PartState>ps).range_keyed else None,
            (<_PartState>ps).range_messages[off]))
    return _handover_envelope(<PyObject *>item)  # the pin _refill took is now the caller's


cdef int _batch_trampoline(void *ctx, capi.tr_loop *loop) noexcept with gil:
    cdef LoopRunner r = <LoopRunner>ctx
    try:
        PyErr_CheckSignals()  # Python-level signal handlers (stop()) run here
        r._run_batch()
        return 0
    except BaseException as e:  # noqa: B036 - nothing may cross into C
        r._fatal(e)
        return 1


# Pool workers keep ONE Python thread state for their lifetime (issue 13,
# defect 6): without it every run_pool_batch's `with gil` created a thread state
# and destroyed it on release, so threading.local and the thread's Thread object
# were lost every batch. worker_started makes the state (PyGILState_Ensure) and
# gives the GIL back while keeping it (PyEval_SaveThread); the trampolines'
# `with gil` then find and reuse it; worker_stopping takes the GIL with it and
# releases it for good. The runner stores the two handles per worker.

cdef void _keep_worker_state(void *ctx, uint32_t worker, PyGILState_STATE st,
                             PyThreadState *ts) noexcept with gil:
    cdef LoopRunner r = <LoopRunner>ctx
    r._wgil[worker] = st
    r._wts[worker] = ts
    # the worker's pin on the runner (its hooks' context): a worker abandoned by a
    # bounded stop (rule 19) may run after run() returned; released in _unpin_runner
    Py_INCREF(r)


cdef void _unpin_runner(void *ctx) noexcept with gil:
    Py_DECREF(<object>ctx)  # the pin taken in _keep_worker_state (may dealloc the runner)


cdef void _worker_state(void *ctx, uint32_t worker, PyGILState_STATE *st,
                        PyThreadState **ts) noexcept with gil:
    cdef LoopRunner r = <LoopRunner>ctx
    st[0] = r._wgil[worker]
    ts[0] = r._wts[worker]


cdef void _worker_started(void *ctx, uint32_t worker) noexcept nogil:
    cdef PyGILState_STATE st = PyGILState_Ensure()  # the thread state, GIL held
    cdef PyThreadState *ts = PyEval_SaveThread()  # GIL released, state kept
    _keep_worker_state(ctx, worker, st, ts)


cdef void _worker_stopping(void *ctx, uint32_t worker) noexcept nogil:
    cdef PyGILState_STATE st
    cdef PyThreadState *ts
    _worker_state(ctx, worker, &st, &ts)
    PyEval_RestoreThread(ts)  # GIL held again with the kept state
    _unpin_runner(ctx)  # ctx may be gone after this
    PyGILState_Release(st)  # drops the state and the GIL


cdef void _pool_trampoline(void *ctx, capi.tr_loop *loop, uint32_t worker) noexcept with gil:
    cdef LoopRunner r = <LoopRunner>ctx
    try:
        r._run_pool_batch(worker)
    except BaseException as e:  # noqa: B036 - nothing may cross into C
        r._fatal(e)
        r._post(e)  # stops the loop (the recorded exception is what run reports)


# task.ordering = key (rules 30, 31): the key hash the ring item carries. Tests
# only: _key_hash_override(key) -> int forces hashes (e.g. two keys colliding).
_key_hash_override = None
cdef uint64_t _NONE_KEY_HASH = 0x9E3779B97F4A7C15ULL  # every message without a key: one key


def _set_key_hash_override(fn):
    """Tests only: hash keys with ``fn(key) -> int`` (None: the default hash)."""
    global _key_hash_override
    _key_hash_override = fn


cdef uint64_t _key_hash(object key) except? 0xFFFFFFFFFFFFFFFF:
    """The 64-bit hash of an envelope key (one process: Python's hash is enough)."""
    if _key_hash_override is not None:
        return <uint64_t>((<object>_key_hash_override)(key) & 0xFFFFFFFFFFFFFFFF)
    if key is None:
        return _NONE_KEY_HASH
    try:
        return <uint64_t>hash(key)
    except TypeError:  # an unhashable key (a dict, a list): its canonical text stands for it
        from .ordering import unhashable_key_text

        return <uint64_t>hash(unhashable_key_text(key))


cdef Envelope _bad_key_envelope(Envelope env, object e, _TaskSlot slot, object ssp):
    """``env`` in its place as a bad message (rule 39): its key has no identity under
    task.ordering = key (the error names task, partition, offset and the key's type)."""
    from .ordering import key_error

    error = key_error(slot.name, ssp, env.offset, env.key, e)
    error.__cause__ = e
    cdef Envelope bad = Envelope(env.system, env.stream, env.partition, env.offset, None,
                                 _BAD_INPUT(error, None, env.message))
    bad._ts = env._ts  # its timestamp was read (rule 33 counted it)
    return bad


cdef int _hash_envelope_keys(uint64_t *items, uint64_t *hashes, size_t m,
                             _TaskSlot slot, object ssp, list keep) except -1:
    """hashes[j] = the key hash of envelope items[j], j < m. An envelope whose key has none
    is replaced by a bad message in its place (_bad_key_envelope; its hash None's): items
    borrowed from a list are kept alive by ``keep``; with ``keep`` None they hold the ring's
    pin, which moves to the replacement."""
    cdef size_t j = 0
    cdef Envelope env
    cdef Envelope bad
    while j < m:
        env = <Envelope><PyObject *>items[j]
        try:
            hashes[j] = _key_hash(env.key)
        except Exception as e:
            bad = _bad_key_envelope(env, e, slot, ssp)
            if keep is not None:
                keep.append(bad)
            else:
                Py_INCREF(bad)
                Py_DECREF(env)
            items[j] = <uint64_t><PyObject *>bad
            hashes[j] = _NONE_KEY_HASH
        j += 1
    return 0


cdef int _hash_listed_keys(object keys, Py_ssize_t start, uint64_t *hashes, size_t m) except -1:
    """hashes[j] = the key hash of the message at offset start + j (its key in the list
    ``keys``; every key None when ``keys`` is None), j < m; 1 (hashes unset) when a key has
    none: the caller builds those envelopes now (_hash_envelope_keys makes it a bad one)."""
    cdef size_t j = 0
    try:
        while j < m:
            hashes[j] = _key_hash(None if keys is None else (<list>keys)[start + j])
            j += 1
    except Exception:
        return 1
    return 0


cdef class LoopRunner:
    """The C dispatch loop and its batch executor; used by tailrace.engine.native.

    ``handler`` provides the rarely-run operations as Python methods:
    ``on_window(task)``, ``on_commit(task, final)``, ``on_timer(task, before)`` and
    ``on_end_of_stream(task)``, each returning coordinator request bits
    (an exception there is recorded and stops the loop).
    """

    cdef capi.tr_loop *_loop
    cdef list _slots
    cdef PyObject **_slotv  # borrowed from _slots
    cdef uint32_t _ntasks
    cdef object _handler
    cdef object _ignores
    cdef bint _has_ignores
    cdef unsigned long _loop_thread
    cdef bint _in_batch
    cdef object _fatal_error
    cdef bint _running
    cdef uint32_t _input_buffer
    cdef bint _keyed  # task.ordering = key: rings carry key hashes (rules 30, 31)
    cdef double _cb_timeout_s  # task.callback.timeout.ms in seconds; <= 0: off
    cdef PyGILState_STATE *_wgil  # per pool worker: see _worker_started
    cdef PyThreadState **_wts
    # a StuckCallWatch (tailrace.engine.watchdog) or None: told about each sync call
    # on the loop thread while callback timeouts are on
    cdef public object watch
    cdef capi.tr_manual_clock _manual_clock  # the loop's clock when ``clock`` is manual
    cdef object _clock  # a manual tailrace.clock.Clock, or None (real time)
    cdef Callback _calling  # the callback whose process_async call runs on the loop thread
    cdef object _jbind  # tailrace.stores.journal_bind / journal_undo (imported at __init__)
    cdef object _jundo
    cdef object _journal_type

    def __cinit__(self):
        self._loop = NULL
        self._slotv = NULL
        self._wgil = NULL
        self._wts = NULL

    def __init__(self, list slots, handler, config, list window_flags, clock=None):
        cdef capi.tr_loop_config cfg
        cdef capi.tr_loop_task *tasks
        cdef Py_ssize_t i
        cdef _TaskSlot s
        self._slots = slots
        self._ntasks = len(slots)
        self._handler = handler
        self._ignores = config.ignores
        self._has_ignores = bool(config.ignored_exceptions)
        # not at import: tailrace.stores imports the serdes, which import this module
        from tailrace.stores import Journal, journal_bind, journal_undo
        self._jbind = journal_bind
        self._jundo = journal_undo
        self._journal_type = Journal
        cfg.ntasks = self._ntasks
        cfg.max_concurrency = config.max_concurrency
        cfg.input_buffer = config.input_buffer_size
        self._input_buffer = cfg.input_buffer
        self._keyed = getattr(config, "ordering", "partition") == "key"
        cfg.pool_size = config.thread_pool_size
        cfg.async_commit = 1 if config.async_commit else 0
        cfg.window_ns = <int64_t>config.window_ms * 1000000
        cfg.commit_ns = <int64_t>config.commit_ms * 1000000
        cfg.callback_timeout_ns = <int64_t>config.callback_timeout_ms * 1000000
        self._cb_timeout_s = config.callback_timeout_ms / 1000.0
        cfg.max_idle_ns = <int64_t>config.max_idle_ms * 1000000
        cfg.shutdown_ns = <int64_t>config.drain_ms * 1000000  # (rule 19: the drain's wait)
        cfg.event_lag_ms = config.watermark_lag_ms  # rule 33
        cfg.event_idle_ns = <int64_t>config.watermark_idle_ms * 1000000
        self._wgil = <PyGILState_STATE *>malloc(max(1, cfg.pool_size) * sizeof(PyGILState_STATE))
        self._wts = <PyThreadState **>malloc(max(1, cfg.pool_size) * sizeof(PyThreadState *))
        if self._wgil is NULL or self._wts is NULL:
            raise MemoryError()
        cfg.clock_fn = NULL  # real time (tr_now_ns)
        cfg.clock_ctx = NULL
        cfg.clock_manual = 0
        self._clock = None
        if clock is not None and clock.manual:  # virtual time: the clock's owner moves it
            self._clock = clock
            capi.tr_manual_clock_set(&self._manual_clock, <int64_t>round(clock.monotonic() * 1e9))
            cfg.clock_fn = capi.tr_manual_clock_read
            cfg.clock_ctx = <void *>&self._manual_clock
            cfg.clock_manual = 1
        tasks = <capi.tr_loop_task *>malloc(max(1, self._ntasks) * sizeof(capi.tr_loop_task))
        self._slotv = <PyObject **>malloc(max(1, self._ntasks) * sizeof(PyObject *))
        if tasks is NULL or self._slotv is NULL:
            free(tasks)
            raise MemoryError()
        try:
            for i in range(self._ntasks):
                s = <_TaskSlot>slots[i]
                self._slotv[i] = <PyObject *>s  # borrowed: _slots keeps it alive
                tasks[i].npartitions = len(s.parts)
                tasks[i].flags = 0
                if not s.is_async and config.thread_pool_size > 0:
                    tasks[i].flags |= capi.TR_TASK_POOL
                    s.pooled_concurrent = config.max_concurrency > 1
                else:
                    tasks[i].flags |= capi.TR_TASK_INLINE  # runs: _run_sync / _run_async
                if window_flags[i]:
                    tasks[i].flags |= capi.TR_TASK_WINDOW
                if self._keyed:
                    tasks[i].flags |= capi.TR_TASK_KEYED
                if s.et_track:
                    tasks[i].flags |= capi.TR_TASK_EVENT_TRACK
            check(capi.tr_loop_create(&cfg, tasks, &self._loop), "dispatch loop")
        finally:
            free(tasks)

    def __dealloc__(self):
        cdef uint64_t err
        if self._loop is not NULL:
            self._drain()
            err = capi.tr_loop_take_error(self._loop)
            if err:
                Py_DECREF(<object><PyObject *>err)  # the pin taken in _post
            capi.tr_loop_destroy(self._loop)
            self._loop = NULL
        free(self._slotv)
        self._slotv = NULL
        free(self._wgil)
        free(self._wts)
        self._wgil = NULL
        self._wts = NULL

    # -- running (the loop thread) ---------------------------------------------
    def run(self):
        """Run the loop on this thread until it stops; returns the stop reason name."""
        cdef capi.tr_loop_hooks hooks
        cdef capi.tr_status st
        hooks.ctx = <void *>self
        hooks.run_batch = _batch_trampoline
        hooks.run_pool_batch = _pool_trampoline
        hooks.worker_started = _worker_started
        hooks.worker_stopping = _worker_stopping
        self._loop_thread = PyThread_get_thread_ident()
        self._running = True
        try:
            with nogil:  # the one place the GIL is released (habit 6)
                st = capi.tr_loop_run(self._loop, &hooks)
        finally:
            self._running = False
            self._drain()
        check(st, "dispatch loop")
        return STOP_REASONS.get(<int>capi.tr_loop_stop_reason(self._loop), "error")

    cdef int _run_batch(self) except -1:
        cdef capi.tr_op op
        cdef capi.tr_loop *loop = self._loop
        cdef _TaskSlot slot
        cdef Envelope env
        cdef Coordinator coord
        cdef Callback cb
        cdef int req
        cdef double t0
        cdef capi.tr_status st
        self._in_batch = True
        try:
            while capi.tr_loop_next_op(loop, &op):
                slot = <_TaskSlot>self._slotv[op.task]
                if op.kind == capi.TR_OP_RUN:
                    if slot.is_async:
                        self._run_async(slot, op.task, <const uint64_t *><uintptr_t>op.item, op.count)
                    else:
                        self._run_sync(slot, op.task, <const uint64_t *><uintptr_t>op.item, op.count)
                elif op.kind == capi.TR_OP_PROCESS:
                    env = _take_item(op.item, slot)
                    if slot.et_track:
                        self._seen(slot, op.task, env)  # the loop acts before its next op
                    if not slot.is_async:
                        coord = slot.coordinator
                        t0 = self._call_begins(slot, env)
                        if slot.journal is not None:
                            self._jbind(slot.journal)
                        try:
                            if _type_of(<PyObject *>env.message) == <PyObject *>_BAD_INPUT:
                                raise (<object>env.message).error
                            slot.process(env, slot.collector, coord)
                        except Exception as e:
                            self._call_ends()
                            if not self._sync_error(slot, op.task, op.seq, env, e, coord, True):
                                continue
                        finally:
                            if slot.journal is not None:
                                self._jbind(None)
                                slot.journal.clear()
                        self._call_ends()
                        if slot.et_track:  # after its call; the loop acts before its next op
                            self._done(slot, op.task, env)
                        if t0 and self._returned_late(slot, env, coord, t0):
                            check(capi.tr_loop_fail(loop, op.task, op.seq), "callback failure")
                            continue
                        req = coord._requests
                        coord._requests = 0
                        st = capi.tr_loop_complete_local(loop, op.task, op.seq, <uint32_t>req)
                        if st != capi.TR_OK:  # the message only when raising: it formats the offset
                            check(st, f"completion of {slot.name} at {env.ssp} offset {env.offset!r}")
                    else:
                        # completed inline: go on with this task's next message
                        # without a batch rebuild (a bounded burst, see next_of_task)
                        while True:
                            cb = self._new_callback(env, op.task)
                            cb._seq = op.seq
                            if self._cb_timeout_s > 0:
                                cb._late_after = _time.monotonic() + self._cb_timeout_s
                            self._calling = cb
                            try:
                                if _type_of(<PyObject *>env.message) == <PyObject *>_BAD_INPUT:
                                    raise (<object>env.message).error
                                slot.process(env, slot.collector, cb._coordinator, cb)
                            except Exception as e:
                                cb._held = False  # it failed after all (rules 16, 18)
                                verdict, e = self._bad(slot, env, e, None, None, 0, False)
                                if verdict == V_FAIL:
                                    slot.failed += 1
                                    self._post(self._failure(slot, env, e))
                                    break
                                # skipped or dead-lettered: it completes; a later resolution
                                # of its callback is dropped
                                cb._rstate = RUN_ABANDONED
                                cb._coordinator._requests = 0
                                st = capi.tr_loop_complete_local(loop, op.task, cb._seq, 0)
                                cb._inline = st == capi.TR_OK
                                if st != capi.TR_OK:
                                    check(st, f"completion of {slot.name} at {env.ssp} offset {env.offset!r}")
                            finally:
                                self._calling = None
                                cb._late_after = 0
                            if slot.et_track:  # a CQ_ETIMER queued: next_of_task hands out no more
                                self._done(slot, op.task, env)
                            if cb._held:  # completed during the call: with what the call asked
                                cb._held = False
                                req = cb._coordinator._requests
                                cb._coordinator._requests = 0
                                st = capi.tr_loop_complete_local(loop, op.task, cb._seq, <uint32_t>req)
                                cb._inline = st == capi.TR_OK
                                if st != capi.TR_OK:
                                    check(st, f"completion of {slot.name} at {env.ssp} offset {env.offset!r}")
                            if not cb._inline or not capi.tr_loop_next_of_task(loop, op.task, &op):
                                break
                            env = _take_item(op.item, slot)
                            if slot.et_track:  # a CQ_ETIMER queued: next_of_task hands out no more
                                self._seen(slot, op.task, env)
                elif op.kind == capi.TR_OP_REFILL:
                    self._refill(slot, op.task, op.partition, <Py_ssize_t>op.handle)
                else:
                    self._control(op.kind, op.task, op.flags, op.handle)
        finally:
            self._in_batch = False
        return 0

    cdef inline Callback _new_callback(self, Envelope env, uint32_t t):
        """The callback (and its own coordinator) handed to one process_async call."""
        cdef Callback cb = Callback.__new__(Callback)
        cb._runner = self
        cb._env = env
        cb._task = t
        cb._coordinator = Coordinator.__new__(Coordinator)
        return cb

    cdef int _run_sync(self, _TaskSlot slot, uint32_t t, const uint64_t *items,
                       uint32_t n) except -1:
        """A RUN op: up to n messages of one partition in a row, reported with one run_done.

        The run ends right after a message whose coordinator made a request (the
        loop acts on it before this task gets more, rule 15) or that failed.
        """
        cdef uint32_t consumed = 0
        cdef uint32_t completed = 0
        cdef int req = 0
        cdef Envelope env
        cdef Coordinator coord = slot.coordinator
        cdef capi.tr_status st
        cdef double t0 = 0
        cdef bint timed = self._cb_timeout_s > 0
        cdef bint calling = False  # inside process: an exception now is the message's
        cdef bint more = True
        cdef object journal = slot.journal
        cdef Py_ssize_t mark = 0
        cdef int verdict
        cdef bint track = slot.et_track
        cdef bint et_due = False
        # process, its bound method unpacked once a run (_call_process): both borrowed from
        # the bound method, which the local ``process`` keeps alive for the whole run
        cdef PyObject *pfunc
        cdef PyObject *pself = NULL
        process = slot.process
        if PyMethod_Check(process):
            pfunc = PyMethod_GET_FUNCTION(process)
            pself = PyMethod_GET_SELF(process)
        else:
            pfunc = <PyObject *>process
        collector = slot.collector
        if journal is not None:
            self._jbind(journal)
        try:
            while more:
                # the try around process is set up once per run, not once per message (each
                # setup reads the thread state and saves the exception state: on 3.12 a TLS
                # call through libpython); an exception that process raises ends this inner
                # loop, and an ignored one goes on with the next message
                try:
                    while consumed < n:
                        if capi.tr_loop_run_yield(self._loop):
                            break  # a barrier is due or a stop was asked: the rest waits (rules 8, 19)
                        env = _take_item(items[consumed], slot)
                        # a sync run: the watermark's recompute may wait for the run's end
                        # or a read on this thread (rule 33; tr_loop_event_seen_run)
                        if track and capi.tr_loop_event_seen_run(self._loop, t, consumed, env._ts):
                            et_due = True
                        consumed += 1
                        if timed:
                            t0 = self._call_begins(slot, env)
                        calling = True
                        if journal is not None:
                            mark = len(journal)
                        if _type_of(<PyObject *>env.message) == <PyObject *>_BAD_INPUT:
                            raise (<object>env.message).error
                        _call_process(pfunc, pself, env, collector, coord)
                        calling = False  # (its call is counted done by run_done)
                        if self._after_call(slot, env, coord, t0, timed):
                            break
                        completed = consumed
                        if coord._requests or et_due:
                            break
                    more = False
                except Exception as e:
                    if not calling:
                        raise
                    calling = False
                    if timed:
                        self._call_ends()
                    verdict, e = self._bad(slot, env, e, coord, journal, mark, True)
                    if verdict == V_FAIL:
                        coord._requests = 0
                        slot.failed += 1
                        self._post(self._failure(slot, env, e))
                        if (journal is not None or not slot.plan.stores) and slot.plan.held is None:
                            # its store writes undone (or it has none): handed back untaken,
                            # so the final commit passes everything before it (rule 40); not
                            # with exactly-once outputs, whose held sends cannot be parted
                            # from the failed message's own (rule 41: nothing past the last
                            # commit is published after a failure)
                            if journal is not None:
                                self._jundo(journal, mark)
                            if not items[consumed - 1] & 1:
                                Py_INCREF(env)  # the ring's pin again (_take_item stole it)
                            consumed -= 1
                        break
                    if verdict == V_IGNORED:
                        slot.ignored += 1
                    if self._after_call(slot, env, coord, t0, timed):
                        break
                    completed = consumed
                    more = consumed < n and not coord._requests and not et_due
            if coord._requests and completed == consumed:
                req = coord._requests
                coord._requests = 0
        finally:
            if journal is not None:
                self._jbind(None)
                journal.clear()
            # also on a BaseException: the items taken are ours, the failed one
            # (taken, not completed) halts the task in C
            st = capi.tr_loop_run_done(self._loop, t, consumed, completed, <uint32_t>req)
            if st != capi.TR_OK:
                check(st, f"run of {slot.name}")
        return 0

    cdef int _run_async(self, _TaskSlot slot, uint32_t t, const uint64_t *items,
                        uint32_t n) except -1:
        """A RUN op of an async task: go on while each callback completes during its call.

        A callback completed (on any thread) before process_async returned
        needs no sequence number: in order with nothing outstanding, it is
        released by run_done. The first one still pending escapes: run_escape
        gives it a sequence number and it completes through the C loop like
        any other. The run also ends after a failure or a message with requests.
        """
        cdef uint32_t consumed = 0
        cdef uint32_t completed = 0
        cdef int req = 0
        cdef bint escaped = False
        cdef uint64_t seq = 0
        cdef int64_t invoked_ns = 0
        cdef Envelope env
        cdef capi.tr_status st
        cdef Callback cb
        cdef bint et_due = False
        process = slot.process
        collector = slot.collector
        try:
            while consumed < n and not et_due:
                if capi.tr_loop_run_yield(self._loop):
                    break  # as in _run_sync
                env = _take_item(items[consumed], slot)
                consumed += 1
                if slot.et_track and self._seen(slot, t, env):
                    et_due = True
                cb = self._new_callback(env, t)
                cb._rstate = RUN_PENDING
                if self._cb_timeout_s > 0:
                    cb._late_after = _time.monotonic() + self._cb_timeout_s
                    invoked_ns = self._loop_now()
                try:
                    if _type_of(<PyObject *>env.message) == <PyObject *>_BAD_INPUT:
                        raise (<object>env.message).error
                    process(env, collector, cb._coordinator, cb)
                except Exception as e:
                    verdict, e = self._bad(slot, env, e, None, None, 0, False)
                    if verdict == V_FAIL:
                        if cb._rstate == RUN_PENDING:
                            cb._rstate = RUN_FAILED  # a later complete() is a second resolution
                        slot.failed += 1
                        self._post(self._failure(slot, env, e))
                        break
                    # skipped or dead-lettered: completed; a later resolution is dropped
                    cb._rstate = RUN_ABANDONED
                    cb._coordinator._requests = 0
                finally:
                    cb._late_after = 0
                if cb._rstate == RUN_ABANDONED:
                    completed = consumed
                    continue
                if cb._rstate == RUN_DONE:
                    completed = consumed
                    # with a request made after complete() in the same call (rule 14)
                    req = cb._rreq | cb._coordinator._requests
                    cb._coordinator._requests = 0
                    if req:
                        break
                elif cb._rstate == RUN_FAILED:
                    break  # _resolve posted the error
                else:
                    # no GIL release from here to the end of this block: no
                    # other thread can resolve cb while it changes hands
                    check(capi.tr_loop_run_escape(self._loop, t, consumed, &seq), "run")
                    if self._cb_timeout_s > 0:  # its callback timeout counts from its call (rule 16)
                        capi.tr_loop_invoked_at(self._loop, t, seq, invoked_ns)
                    escaped = True
                    cb._seq = seq
                    cb._rstate = 0
                    break
        finally:
            if not escaped:
                st = capi.tr_loop_run_done(self._loop, t, consumed, completed, <uint32_t>req)
                if st != capi.TR_OK:
                    check(st, f"run of {slot.name}")
        return 0

    cdef tuple _bad(self, _TaskSlot slot, Envelope env, object e, Coordinator coord, object journal,
                    Py_ssize_t mark, bint sync):
        """A message failed with ``e``: what task.error.policy makes of it, ``(verdict, error)``
        (tailrace.engine.policy; V_FAIL without a policy). A sync call can be retried
        (``coord``) and its store writes since ``mark`` of ``journal`` undone."""
        if slot.policy is None:
            return (V_FAIL, e)
        retry = undo = None
        if sync and coord is not None:
            retry = _functools.partial(_retry_sync, slot.process, env, slot.collector, coord)
        if journal is not None:
            undo = _functools.partial(self._jundo, journal, mark)
        try:
            return slot.policy.handle(env, e, retry, undo, sync)
        except Exception as e2:  # noqa: B036 - a dead letter not sent: the message fails with it
            return (V_FAIL, e2)

    cdef object _failure(self, _TaskSlot slot, Envelope env, object e):
        """The error a failed message stops the loop with: a bad input's own error (it names
        the source, partition and offset), else a TaskError naming task, partition, offset."""
        if type(env.message) is _BAD_INPUT and e is (<object>env.message).error:
            return e
        return _TaskError(slot.name, env.ssp, env.offset, e)

    cdef inline uint32_t _part_of(self, _TaskSlot slot, Envelope env) except? 0xffffffff:
        if len(slot.parts) == 1:
            return 0
        return <uint32_t>slot.part_index[(env.stream, env.partition)]

    cdef int _seen(self, _TaskSlot slot, uint32_t t, Envelope env) except -1:
        """The message is handed to the task (TR_TASK_EVENT_TRACK), before its call: the
        task's watermark counts it (rule 33). 1 when the watermark now reaches the task's
        event-time timer, so the run ends after this message (rules 35, 38)."""
        return capi.tr_loop_event_seen(self._loop, t, self._part_of(slot, env), env._ts)

    cdef int _done(self, _TaskSlot slot, uint32_t t, Envelope env) except -1:
        """The task's call with the message returned (TR_TASK_EVENT_TRACK): a partition at
        its end counts as +infinity only once its last message was processed (rule 37); 1
        as for _seen."""
        return capi.tr_loop_event_done(self._loop, t, self._part_of(slot, env))

    cdef double _call_begins(self, _TaskSlot slot, Envelope env):
        """A sync call on the loop thread starts: its start time, or 0 with timeouts off."""
        cdef double t0
        if self._cb_timeout_s <= 0:
            return 0
        t0 = _time.monotonic()
        if self.watch is not None:
            self.watch.begin(slot.name, env.ssp, env.offset, t0)
        return t0

    cdef inline bint _after_call(self, _TaskSlot slot, Envelope env, Coordinator coord, double t0,
                                 bint timed) except -1:
        """After a message's process call returned (or raised an ignored exception): True
        when it returned past task.callback.timeout.ms, consumed and not completed: the task
        halts there (rule 18)."""
        if not timed:
            return False
        self._call_ends()
        return self._returned_late(slot, env, coord, t0)

    cdef inline void _call_ends(self):
        if self._cb_timeout_s > 0 and self.watch is not None:
            self.watch.end()

    cdef bint _returned_late(self, _TaskSlot slot, Envelope env, Coordinator coord,
                             double t0) except -1:
        """Rules 3, 16 on the loop thread: a call that returned after task.callback.timeout.ms
        fails the container with CallbackTimeoutError, as the pool's timeout does."""
        cdef double took = _time.monotonic() - t0
        if took <= self._cb_timeout_s:
            return False
        coord._requests = 0
        slot.failed += 1
        ms = int(self._cb_timeout_s * 1000 + 0.5)
        self._post(_CallbackTimeoutError(
            slot.name, env.ssp, env.offset,
            TimeoutError(f"process returned after {took * 1000:.0f} ms, "
                         f"past task.callback.timeout.ms={ms}")))
        return True

    cdef bint _sync_error(self, _TaskSlot slot, uint32_t t, uint64_t seq, Envelope env, object e,
                          Coordinator coord, bint local) except -1:
        """A sync process raised: True when ignored (complete normally), else fail and post."""
        cdef capi.tr_status st
        verdict, e = self._bad(slot, env, e, coord, slot.journal, 0, True)
        if verdict != V_FAIL:
            if verdict == V_IGNORED:
                slot.ignored += 1
            return True
        coord._requests = 0
        slot.failed += 1
        st = capi.tr_loop_fail(self._loop, t, seq)
        self._post(self._failure(slot, env, e))
        if st != capi.TR_OK:  # the task's error is posted first: it is the one reported
            check(st, f"failure of {slot.name} at {env.ssp} offset {env.offset!r}")
        return False

    cdef int _run_pool_batch(self, uint32_t worker) except -1:
        """Pool worker `worker` (GIL held once): run ops until the C side ends the batch."""
        cdef capi.tr_status st
        cdef object journal
        cdef int verdict
        cdef capi.tr_op op
        cdef capi.tr_loop *loop = self._loop
        cdef _TaskSlot slot
        cdef Envelope env
        cdef Coordinator coord
        cdef int req
        while capi.tr_loop_pool_next(loop, worker, &op):
            slot = <_TaskSlot>self._slotv[op.task]
            if op.flags & capi.TR_OPF_DISCARD:
                if not op.item & 1:  # the loop stopped: only the pin is dropped
                    Py_DECREF(<object><PyObject *>op.item)
                continue
            env = _take_item(op.item, slot)
            if slot.et_track:
                self._seen(slot, op.task, env)  # the loop thread checks the watermark
            coord = Coordinator.__new__(Coordinator) if slot.pooled_concurrent else slot.coordinator
            journal = None
            if slot.journal is not None:  # each pool thread records its own invocation
                journal = self._journal_type()
                self._jbind(journal)
            try:
                if _type_of(<PyObject *>env.message) == <PyObject *>_BAD_INPUT:
                    raise (<object>env.message).error
                slot.process(env, slot.collector, coord)
            except Exception as e:
                verdict, e = self._bad(slot, env, e, coord, journal, 0, True)
                if verdict == V_FAIL:
                    coord._requests = 0
                    slot.failed += 1
                    st = capi.tr_loop_pool_failed(loop, worker, &op)
                    self._post(self._failure(slot, env, e))
                    if st != capi.TR_OK:
                        check(st, f"failure of {slot.name} at {env.ssp} offset {env.offset!r}")
                    continue
                if verdict == V_IGNORED:
                    slot.ignored += 1
            finally:
                if journal is not None:
                    self._jbind(None)
            if slot.et_track:  # the loop thread checks the watermark
                self._done(slot, op.task, env)
            req = coord._requests
            coord._requests = 0
            # a rejected completion would freeze the task: it stops the container instead
            st = capi.tr_loop_pool_done(loop, worker, &op, <uint32_t>req)
            if st != capi.TR_OK:  # the message only when raising: it formats the offset
                check(st, f"completion of {slot.name} at {env.ssp} offset {env.offset!r}")
        return 0

    cdef int _refill(self, _TaskSlot slot, uint32_t t, uint32_t p, Py_ssize_t free_slots) except -1:
        cdef _PartState ps = <_PartState>slot.parts[p]
        cdef capi.tr_mark mark
        cdef Py_ssize_t n, i, j, m
        cdef uint64_t items[256]
        cdef uint64_t handles[256]
        cdef uint64_t hashes[256]
        cdef Envelope env
        cdef capi.tr_status st
        if ps.pinned and capi.tr_loop_watermark(self._loop, t, p, &mark) == capi.TR_OK:
            ps.purge_below(mark.handle)
        if ps.poll_range is not None:
            return self._refill_range(slot, ps, t, p, free_slots)
        batch = ps.reader.poll(free_slots)
        if type(batch) is not list:
            batch = list(batch)
        n = len(<list>batch)
        if n == 0:
            if ps.reader.at_end():
                capi.tr_loop_partition_state(self._loop, t, p, capi.TR_PART_ENDED)
            else:
                capi.tr_loop_partition_state(self._loop, t, p, capi.TR_PART_IDLE)
            return 0
        if n > free_slots:
            raise RuntimeError(f"reader of {ps.ssp} returned {n} messages, asked for at most {free_slots}")
        stamp_envelopes(<list>batch, slot.timestamps, wall_ms(self._clock))  # rule 32
        cdef int64_t newest = TS_UNSET  # the largest timestamp read (rule 33)
        i = 0
        while i < n:
            m = n - i if n - i < 256 else 256
            for j in range(m):
                env = <Envelope?>(<list>batch)[i + j]
                items[j] = <uint64_t><PyObject *>env  # borrowed from batch until the pin below
                handles[j] = ps.handle_of(env)
                if env._ts > newest:
                    newest = env._ts
            if self._keyed:
                _hash_envelope_keys(items, hashes, <size_t>m, slot, ps.ssp, batch)
                st = capi.tr_loop_push_inputs_keyed(self._loop, t, p, items, handles, hashes, <size_t>m)
            else:
                st = capi.tr_loop_push_inputs(self._loop, t, p, items, handles, <size_t>m)
            if st != capi.TR_OK:  # the message only when raising: it formats the partition
                check(st, f"input ring of {ps.ssp}")
            for j in range(m):
                Py_INCREF(<object><PyObject *>items[j])  # the ring's pin: see _take_item, _drain
            i += m
        check(capi.tr_loop_event_time_read(self._loop, t, p, newest, <uint64_t>n), "event time")
        ps.read_n += n
        ps.newest_read = envelope_offset(<Envelope>batch[n - 1])
        return 0

    cdef int _refill_range(self, _TaskSlot slot, _PartState ps, uint32_t t, uint32_t p,
                           Py_ssize_t free_slots) except -1:
        """_refill for a reader with _tailrace_poll_range (docs/native-fast-paths.md).

        While the reader keeps returning the lists it returned first, the ring
        gets lazy items (offset << 21 | partition index << 1 | 1) and no
        envelope: _take_item builds it at dispatch. Otherwise envelopes are
        built straight into the ring.
        """
        cdef uint64_t items[256]
        cdef uint64_t handles[256]
        cdef uint64_t hashes[256]
        cdef Py_ssize_t start, end, i, j, k, m
        cdef Envelope env
        cdef capi.tr_status st
        cdef TimestampReader stamper = slot.timestamps
        cdef int64_t newest = TS_UNSET  # the largest timestamp read (rule 33)
        messages, keys, start, end = ps.poll_range(free_slots)
        if end <= start:
            capi.tr_loop_partition_state(
                self._loop, t, p, capi.TR_PART_ENDED if ps.reader.at_end() else capi.TR_PART_IDLE)
            return 0
        if end - start > free_slots or start < 0 or <uint64_t>end >= capi.TR_HANDLE_LIMIT:
            raise RuntimeError(f"reader of {ps.ssp} returned offsets {start}..{end - 1}, "
                               f"asked for at most {free_slots}")
        if ps.range_messages is None and type(messages) is list and (keys is None or type(keys) is list):
            ps.range_messages = messages
            ps.range_keys = keys
            ps.range_keyed = keys is not None
            # a lazy item is 16 bytes in the ring and no object: buffer a whole input buffer
            check(capi.tr_loop_partition_fill(self._loop, t, p, self._input_buffer), "partition fill")
        ps.read_ms = wall_ms(self._clock)  # rule 32: ingestion time
        if stamper is None:
            newest = ps.read_ms  # every envelope's timestamp, unless its system gave one
        # lazy items with a TimestampReader only for a tracking task: its timestamps are read at
        # dispatch (_take_item), where its watermark is moved (the refill tells only the count)
        if ((stamper is None or slot.et_track) and messages is ps.range_messages and (keys is ps.range_keys)
                and capi.tr_lazy_item(<uint64_t>end, p, &items[0])
                and len(<list>messages) >= end and (keys is None or len(<list>keys) >= end)):
            # lazy items: the envelopes are built at dispatch (_take_item)
            i = start
            while i < end:
                m = end - i if end - i < 256 else 256
                if self._keyed and _hash_listed_keys(keys, i, hashes, <size_t>m):
                    break  # a key without identity: the rest as envelopes (below)
                for j in range(m):
                    # fit: the largest offset and p passed tr_lazy_item above, and end < TR_HANDLE_LIMIT
                    capi.tr_lazy_item(<uint64_t>(i + j), p, &items[j])
                    capi.tr_handle_int(<uint64_t>(i + j), &handles[j])
                if self._keyed:
                    st = capi.tr_loop_push_inputs_keyed(self._loop, t, p, items, handles, hashes, <size_t>m)
                else:
                    st = capi.tr_loop_push_inputs(self._loop, t, p, items, handles, <size_t>m)
                if st != capi.TR_OK:  # the message only when raising: it formats the partition
                    check(st, f"input ring of {ps.ssp}")
                i += m
            if i >= end:
                check(capi.tr_loop_event_time_read(self._loop, t, p, newest, <uint64_t>(end - start)),
                      "event time")
                ps.read_n += end - start
                ps.newest_read = end - 1
                return 0
        else:
            i = start
        # eager envelopes (from i on): the module indexes without bounds checks, so the
        # lengths the lazy path's test rejected must be refused here, not read past
        if len(messages) < end or (keys is not None and len(keys) < end):
            raise RuntimeError(
                f"reader of {ps.ssp} (partition {ps.partition}) returned offsets {start}..{end - 1} "
                f"but only {len(messages)} messages"
                + ("" if keys is None else f" and {len(keys)} keys"))
        while i < end:
            m = end - i if end - i < 256 else 256
            j = 0
            try:
                while j < m:
                    env = new_envelope_at(ps.system, ps.stream, ps.partition, i + j,
                                          None if keys is None else keys[i + j], messages[i + j])
                    if stamper is None:
                        env._ts = ps.read_ms
                    else:
                        env = stamper.stamp(env)  # or a bad message in its place (rule 39)
                    if env._ts > newest:
                        newest = env._ts
                    Py_INCREF(env)  # the ring's pin: see _take_item, _drain
                    items[j] = <uint64_t><PyObject *>env
                    capi.tr_handle_int(<uint64_t>(i + j), &handles[j])  # fits: end < TR_HANDLE_LIMIT
                    j += 1
                if self._keyed:
                    _hash_envelope_keys(items, hashes, <size_t>m, slot, ps.ssp, None)
            except BaseException:
                for k in range(j):  # the pins taken for this chunk: nothing leaks
                    Py_DECREF(<object><PyObject *>items[k])
                raise
            if self._keyed:
                st = capi.tr_loop_push_inputs_keyed(self._loop, t, p, items, handles, hashes,
                                                    <size_t>m)
            else:
                st = capi.tr_loop_push_inputs(self._loop, t, p, items, handles, <size_t>m)
            if st != capi.TR_OK:
                for j in range(m):
                    Py_DECREF(<object><PyObject *>items[j])
                check(st, f"input ring of {ps.ssp}")
            i += m
        check(capi.tr_loop_event_time_read(self._loop, t, p, newest, <uint64_t>(end - start)),
              "event time")
        ps.read_n += end - start
        ps.newest_read = end - 1
        return 0

    cdef int _control(self, uint32_t kind, uint32_t t, uint32_t flags, uint64_t handle) except -1:
        cdef int req = 0
        h = self._handler
        if kind == capi.TR_OP_COMMIT:
            req = h.on_commit(t, bool(flags & capi.TR_OPF_FINAL))
        elif kind == capi.TR_OP_WINDOW:
            req = h.on_window(t)
        elif kind == capi.TR_OP_TIMER:  # (with a window due: the timers due before it)
            req = h.on_timer(t, None if handle == <uint64_t>0x7fffffffffffffff else <int64_t>handle)
        elif kind == capi.TR_OP_END_OF_STREAM:
            req = h.on_end_of_stream(t)
        capi.tr_loop_control_done(self._loop, t, <uint32_t>req)
        return 0

    cdef void _fatal(self, object e):
        """An exception escaped the batch executor (a bug, or KeyboardInterrupt)."""
        if self._fatal_error is None:
            self._fatal_error = e

    cdef void _drain(self):
        """Release the pins of envelopes the loop still holds (GIL held, loop not running)."""
        cdef uint64_t items[64]
        cdef size_t n, i
        if self._loop is NULL or self._running:
            return
        while True:
            n = capi.tr_loop_drain_items(self._loop, items, 64)
            if n == 0:
                break
            for i in range(n):
                if not items[i] & 1:  # lazy items pin nothing
                    Py_DECREF(<object><PyObject *>items[i])

    # -- any thread -----------------------------------------------------------
    cdef _resolve(self, Callback cb, object exc):
        cdef capi.tr_status st
        cdef int req = cb._coordinator._requests
        cdef _TaskSlot slot = <_TaskSlot>self._slotv[cb._task]
        cdef double late
        cdef object error = None
        cb._coordinator._requests = 0
        if cb._rstate == RUN_ABANDONED:
            return  # its message was skipped or dead-lettered when process_async raised
        if exc is not None and slot.policy is not None:
            # rule 39: a failed callback is a bad message; the policy may complete it
            verdict, exc = self._bad(slot, cb._env, exc, None, None, 0, False)
            if verdict != V_FAIL:
                exc = None
                req = 0
        if exc is None and cb._late_after:
            late = _time.monotonic() - cb._late_after
            if late > 0:
                # rules 3, 16: completed during its own process_async call, which held
                # the loop thread past the deadline (nothing could time it out meanwhile):
                # it fails, as a sync call that returns late does
                cb._late_after = 0
                ms = int(self._cb_timeout_s * 1000 + 0.5)
                exc = TimeoutError(f"callback completed after {(late + self._cb_timeout_s) * 1000:.0f} ms, "
                                   f"past task.callback.timeout.ms={ms}")
                error = _CallbackTimeoutError(slot.name, cb._env.ssp, cb._env.offset, exc)
        if exc is not None and error is None:
            error = _TaskError(slot.name, cb._env.ssp, cb._env.offset, exc)
        if cb._rstate:  # a callback of a run, not sequenced (see _run_async)
            what = "completed" if exc is None else "failed"
            if cb._rstate != RUN_PENDING:
                self._post(_CallbackError(slot.name, cb._env.ssp, cb._env.offset, exc,
                                          detail=f"callback {what} a second time (rule 17)"))
            elif exc is None:
                cb._rstate = RUN_DONE
                cb._rreq = req
            else:
                cb._rstate = RUN_FAILED
                slot.failed += 1
                self._post(error)
            return
        if cb._held:  # completed during this same call already
            cb._coordinator._requests = req  # (the held completion's)
            what = "completed" if exc is None else "failed"
            self._post(_CallbackError(slot.name, cb._env.ssp, cb._env.offset, exc,
                                      detail=f"callback {what} a second time (rule 17)"))
            return
        if exc is None:
            if self._in_batch and PyThread_get_thread_ident() == self._loop_thread:
                if cb is self._calling:
                    # during its own process_async call: sequenced when the call returns,
                    # with the requests made until then (rule 14)
                    cb._held = True
                    cb._coordinator._requests = req
                    return
                st = capi.tr_loop_complete_local(self._loop, cb._task, cb._seq, <uint32_t>req)
                cb._inline = st == capi.TR_OK
            else:
                st = capi.tr_loop_complete(self._loop, cb._task, cb._seq, <uint32_t>req)
            if st == capi.TR_OK:
                return
            what = "completed"
        else:
            st = capi.tr_loop_fail(self._loop, cb._task, cb._seq)
            if st == capi.TR_OK:
                if self._running:  # after the run, nothing counts it (as the reference engine)
                    slot.failed += 1
                self._post(error)
                return
            what = "failed"
        if st == capi.TR_EALREADY:
            self._post(_CallbackError(slot.name, cb._env.ssp, cb._env.offset, exc,
                                      detail=f"callback {what} a second time (rule 17)"))
            return
        check(st, "callback")

    cdef void _post(self, object err):
        """Hand an error to the loop (the first one wins and stops it)."""
        Py_INCREF(err)  # the loop's pin: released by take_error or __dealloc__
        if capi.tr_loop_post_error(self._loop, <uint64_t><PyObject *>err) != capi.TR_OK:
            Py_DECREF(err)  # an earlier error won; this one is dropped

    def post_error(self, err):
        """Stop the loop with ``err`` unless an error is already recorded (any thread)."""
        self._post(err)

    def take_error(self):
        """The error that stopped the loop (exceptions raised in the executor first), or None."""
        cdef uint64_t w = capi.tr_loop_take_error(self._loop)
        err = None
        if w:
            err = <object><PyObject *>w  # new reference ...
            Py_DECREF(err)  # ... drop the pin taken in _post
        fatal = self._fatal_error
        self._fatal_error = None
        return fatal if fatal is not None else err

    def stop(self):
        """Request a graceful stop; wakes a parked loop (any thread, signal handlers)."""
        capi.tr_loop_stop(self._loop)

    def clock_moved(self, int64_t ns):
        """A manual clock moved to ``ns``: the loop reads it and runs what became due (any thread)."""
        capi.tr_manual_clock_set(&self._manual_clock, ns)
        capi.tr_loop_clock_moved(self._loop)

    def event_watermark(self, uint32_t task):
        """The task's event-time watermark in ms (rule 33): -2**63 for none yet, 2**63 - 1
        once every input ended (tailrace/event_time.h). Any thread."""
        return capi.tr_loop_event_watermark(self._loop, task)

    def set_event_timer(self, uint32_t task, int64_t at_ms):
        """The task's earliest event-time timer (ms; 2**63 - 1: none): its timer barrier falls
        due when its watermark reaches it (rule 38). Any thread."""
        capi.tr_loop_set_event_timer(self._loop, task, at_ms)

    def event_floor(self, uint32_t task, int64_t floor):
        """The task's event-time watermark is at least ``floor`` (its committed value, rule
        33). Before run, or on the loop thread."""
        capi.tr_loop_event_floor(self._loop, task, floor)

    def idle(self):
        """True when the loop is parked with nothing queued for it (any thread)."""
        return capi.tr_loop_idle(self._loop) != 0

    def waker(self, uint32_t task, uint32_t partition):
        """A callable for PartitionReader.start: new input may be ready (any thread)."""
        return _Waker(self, task, partition)

    cdef inline int64_t _loop_now(self):
        """The loop's clock (ns): the run's manual clock, or CLOCK_MONOTONIC."""
        if self._clock is not None:
            return capi.tr_manual_clock_read(&self._manual_clock)
        return capi.tr_now_ns()

    def clock_time_of(self, int64_t ns):
        """The run's time (``clock.time()``, epoch seconds) when the loop's clock read ``ns``:
        on virtual time exactly what ``time()`` returned then."""
        if self._clock is not None:
            return self._clock.time_at(ns)
        return _time.time() - <double>(capi.tr_now_ns() - ns) / 1e9

    def set_user_timer(self, uint32_t task, when, int64_t not_before=0):
        """Wake the loop for ``task``'s timers at ``when`` (time.time() seconds; None: no timer),
        not before the loop's clock reads ``not_before`` (ns)."""
        cdef int64_t ns = 0x7fffffffffffffff  # no timer (and the clock never reaches it)
        cdef int64_t now
        cdef double ahead
        if when is not None:
            # a timer at inf, or centuries ahead, is "never" to the loop (the reference
            # engine agrees: it never fires; a NaN one neither)
            if self._clock is not None:  # virtual time: the run's clock, to the nanosecond
                now = capi.tr_manual_clock_read(&self._manual_clock)
                ahead = (<double>when - <double>self._clock.time()) * 1e9
                if ahead < 1e18:  # (within about 30 years: not "never")
                    ahead = <double>(self._clock.reading_at(when) - now)
            else:
                ahead = (<double>when - _time.time()) * 1e9
                now = capi.tr_now_ns()
            if ahead <= 0:
                ns = now
            elif ahead < <double>(0x7fffffffffffffff - now):
                ns = now + <int64_t>ahead
            if ns < not_before:
                ns = not_before
        capi.tr_loop_set_user_timer(self._loop, task, ns)

    # -- loop thread, in control ops or after run --------------------------------
    def watermark(self, uint32_t task, uint32_t partition):
        """(released count, offset) of a partition's low watermark, or None."""
        cdef capi.tr_mark m
        if capi.tr_loop_watermark(self._loop, task, partition, &m) != capi.TR_OK:
            return None
        ps = <_PartState>(<_TaskSlot>self._slotv[task]).parts[partition]
        return (m.position + 1, ps.offset_of(m.handle))

    def timeout_info(self):
        """(task, partition, offset) of the callback that timed out."""
        cdef uint32_t t, p
        cdef uint64_t seq, handle
        capi.tr_loop_timeout_info(self._loop, &t, &p, &seq, &handle)
        ps = <_PartState>(<_TaskSlot>self._slotv[t]).parts[p]
        return (t, ps.ssp, ps.offset_of(handle))

    # -- metrics (any thread) ---------------------------------------------------
    def task_stats(self, uint32_t task):
        """(processed, completed, outstanding, windows, timers) of a task."""
        cdef capi.tr_task_stats s
        capi.tr_loop_task_stats(self._loop, task, &s)
        return (s.processed, s.completed, s.outstanding, s.windows, s.timers)

    def settled(self, uint32_t task):
        """Loop thread, in a commit: True when the task's state holds exactly its released
        messages (tr_loop_task_settled; a keyed task that took messages ahead starts
        catching up, and a commit falls due again once it has)."""
        return capi.tr_loop_task_settled(self._loop, task) != 0

    def key_stats(self, uint32_t task):
        """(keys in flight, ms since the oldest unreleased message was dispatched):
        task.ordering = key only; (0, 0.0) otherwise or with nothing outstanding."""
        cdef capi.tr_task_stats s
        cdef int64_t now
        capi.tr_loop_task_stats(self._loop, task, &s)
        if s.oldest_ns == 0x7FFFFFFFFFFFFFFF:
            return (s.keys_in_flight, 0.0)
        if self._clock is not None:
            now = capi.tr_manual_clock_read(&self._manual_clock)
        else:
            now = capi.tr_now_ns()
        return (s.keys_in_flight, max(0.0, (now - s.oldest_ns) / 1e6))

    def stats(self):
        """(envelopes_chosen, idle_wakeups, loop_iterations, batches)."""
        cdef capi.tr_loop_stats s
        capi.tr_loop_get_stats(self._loop, &s)
        return (s.envelopes_chosen, s.idle_wakeups, s.loop_iterations, s.batches)


@cython.final
cdef class _Waker:
    """Reader wakeup: any thread, cheap (an atomic flag and at most one queue push)."""

    cdef LoopRunner _runner  # keeps the C loop alive while a reader holds this
    cdef uint32_t _task
    cdef uint32_t _part

    def __cinit__(self, LoopRunner runner, uint32_t task, uint32_t part):
        self._runner = runner
        self._task = task
        self._part = part

    def __call__(self):
        capi.tr_loop_wake_partition(self._runner._loop, self._task, self._part)
