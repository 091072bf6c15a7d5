# The first step of an ``async def process`` (tailrace.aio), done in C: the one
# per-message piece of the asyncio adapter whose Python version cost more than the
# 1.5 us/msg budget of an inline coroutine (issue 6). Included by _core.pyx.
#
# PyIter_Send tells "returned" from "yielded" without raising StopIteration, and
# PyContext_Enter/Exit replace Context.run; the rest is the same calls aio.py
# would make (asyncio's own _set_running_loop / _enter_task / _leave_task).

from cpython.contextvars cimport PyContext_CopyCurrent, PyContext_Enter, PyContext_Exit
from cpython.ref cimport Py_REFCNT


cdef extern from "Python.h":
    # PYGEN_RETURN = 0, PYGEN_ERROR = -1 (exception set), PYGEN_NEXT = 1
    int PyIter_Send(object iterator, object arg, PyObject **presult) except -1


cdef object _aio_get_running_loop = None
cdef object _aio_set_running_loop = None
cdef object _aio_enter_task = None
cdef object _aio_leave_task = None


cdef int _aio_bind() except -1:
    global _aio_get_running_loop, _aio_set_running_loop, _aio_enter_task, _aio_leave_task
    import asyncio.events
    import asyncio.tasks
    _aio_get_running_loop = asyncio.events._get_running_loop
    _aio_set_running_loop = asyncio.events._set_running_loop
    _aio_enter_task = asyncio.tasks._enter_task
    _aio_leave_task = asyncio.tasks._leave_task
    return 0


def aio_first_step(fn, envelope, collector, coordinator, loop, task):
    """Call ``fn(envelope, collector, coordinator)`` and take the first step of the
    coroutine it returns, in a copy of the current context, with ``loop`` as this
    thread's running loop (restored after) and ``task`` as its current task.

    Returns None when the coroutine returned, ``(coroutine, yielded, context)``
    when it suspended; raises what it raised. The caller owns ``loop`` meanwhile.
    """
    return _aio_first_step(fn, envelope, collector, coordinator, loop, task)


cdef object _aio_first_step(fn, envelope, collector, coordinator, loop, task):
    cdef PyObject *res = NULL
    cdef int r
    cdef bint swap
    if _aio_set_running_loop is None:
        _aio_bind()
    ctx = PyContext_CopyCurrent()
    outer = _aio_get_running_loop()
    swap = outer is not loop
    if swap:
        _aio_set_running_loop(loop)
    try:
        PyContext_Enter(ctx)
        try:
            coro = fn(envelope, collector, coordinator)
            _aio_enter_task(loop, task)
            try:
                r = PyIter_Send(coro, None, &res)
            finally:
                _aio_leave_task(loop, task)
        finally:
            PyContext_Exit(ctx)
    finally:
        if swap:
            _aio_set_running_loop(outer)
    value = <object>res  # a new reference ...
    Py_DECREF(value)  # ... so drop the one PyIter_Send handed over
    if r == 0:
        return None
    return (coro, value, ctx)


cdef extern from "pythread.h":
    ctypedef void *PyThread_type_lock
    PyThread_type_lock PyThread_allocate_lock()
    void PyThread_free_lock(PyThread_type_lock)
    int PyThread_acquire_lock(PyThread_type_lock, int waitflag) nogil
    int PyThread_acquire_lock_timed(PyThread_type_lock, long long microseconds, int intr_flag) nogil
    void PyThread_release_lock(PyThread_type_lock) nogil


@cython.final
cdef class AsyncioStepper:
    """The inline fast path of ``tailrace.aio`` (one per AsyncioRunner).

    Owns the lock that the runner's loop thread holds whenever the loop may run
    anything. ``try_step`` runs on the engine's dispatch thread: when that lock is
    free and nothing is queued for the loop, it takes the first step of ``process``
    right there (see AsyncioTask.process_async). The loop thread lets go of it:

    * own selector loop (``selector`` mode): while it waits in select
      (``disown``/``own`` around it); a step that scheduled anything on the loop
      wakes it (once per select);
    * any other loop (uvloop): while it is parked in ``park`` (lent to the dispatch
      thread for a bounded slice, with nothing of ours suspended); a step that
      suspends ends the park at once, so its Task runs without delay.
    """

    cdef PyThread_type_lock _owner
    cdef PyThread_type_lock _unpark  # released to end a park early
    cdef public object loop  # set while the loop thread runs; None: never step inline
    cdef public object standin  # current_task() of the next inline step
    cdef public bint selector  # the loop is our own selector loop (else: parking)
    cdef public long long steps  # inline steps so far
    cdef bint _woken  # selector mode: the loop was woken since it entered select
    cdef bint _parked
    cdef bint _signalled
    cdef bint _suspended
    cdef object _queue  # the runner's deque of invocations for the loop thread
    cdef object _new_standin  # loop -> a fresh stand-in

    def __cinit__(self, queue, new_standin):
        self._owner = PyThread_allocate_lock()
        self._unpark = PyThread_allocate_lock()
        if self._owner == NULL or self._unpark == NULL:
            raise MemoryError("cannot allocate the asyncio loop's locks")
        PyThread_acquire_lock(self._unpark, 1)  # held: park() waits on it
        self._queue = queue
        self._new_standin = new_standin

    def __dealloc__(self):
        if self._owner != NULL:
            PyThread_free_lock(self._owner)
        if self._unpark != NULL:
            PyThread_release_lock(self._unpark)
            PyThread_free_lock(self._unpark)

    def own(self):
        """Loop thread: take the loop back (waits, GIL released, for an inline step)."""
        with nogil:
            PyThread_acquire_lock(self._owner, 1)

    def disown(self):
        """Loop thread: let the dispatch thread step coroutines (before select)."""
        self._woken = False
        PyThread_release_lock(self._owner)

    def park(self, double seconds):
        """Loop thread, inside a loop callback: lend the loop to the dispatch thread
        for at most ``seconds`` (less when a step suspends or ``unpark`` is called).
        True when it stepped something and nothing suspended (worth lending again)."""
        cdef long long steps = self.steps
        cdef long long us = <long long>(seconds * 1e6)
        cdef int got
        self._parked = True
        self._signalled = False
        self._suspended = False
        PyThread_release_lock(self._owner)
        with nogil:
            got = PyThread_acquire_lock_timed(self._unpark, us, 0)
            PyThread_acquire_lock(self._owner, 1)
        self._parked = False
        if self._signalled and not got:
            PyThread_acquire_lock(self._unpark, 1)  # released after the timeout: take it back
        return self.steps != steps and not self._suspended

    def unpark(self):
        """Any thread: end a park now (the loop has work: close, a hook to run)."""
        self._signal()

    cdef void _signal(self):
        if self._parked and not self._signalled:
            self._signalled = True
            PyThread_release_lock(self._unpark)

    def try_step(self, adapter, envelope, collector, coordinator, callback, double deadline):
        """Step ``adapter``'s process inline if the loop is free: True when done
        here (resolved, handed to a Task, or dropped), False to queue it instead."""
        cdef object loop
        cdef Py_ssize_t n_scheduled = 0
        cdef Py_ssize_t refs
        cdef object exc = None
        cdef object suspended = None
        cdef object scheduled = None
        if self.loop is None or len(self._queue) or not PyThread_acquire_lock(self._owner, 0):
            return False
        try:
            loop = self.loop  # None once the loop thread has ended
            if loop is None or len(self._queue):
                return False
            if loop._debug if self.selector else loop.get_debug():
                return False  # debug mode checks the calling thread
            if adapter._closing:
                return True  # never started: close() came first; the engine stopped waiting
            if self.selector:
                scheduled = loop._scheduled
                n_scheduled = len(scheduled)
            standin = self.standin
            refs = Py_REFCNT(standin)
            self.steps += 1
            try:
                suspended = _aio_first_step(adapter._process, envelope, collector, coordinator, loop, standin)
            except BaseException as e:
                exc = e
            if suspended is not None:
                adapter._suspended(*suspended, callback, envelope, deadline, standin)
                self._suspended = True
                self._signal()  # parked: its Task must run now
            # a stand-in nobody kept and that saw no cancel() serves the next step too;
            # a kept one of a finished step says so (done())
            if suspended is not None or Py_REFCNT(standin) != refs or standin._cancel_msgs:
                if suspended is None:
                    standin._finished = True
                self.standin = self._new_standin(loop)
            if self.selector and not self._woken and (loop._ready or len(scheduled) != n_scheduled):
                self._woken = True
                loop._write_to_self()  # it may wait in select with a stale timeout
        finally:
            PyThread_release_lock(self._owner)
        if suspended is None:
            if exc is None:
                callback.complete()
            else:
                callback.fail(exc)
        return True
