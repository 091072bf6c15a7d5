"""``async def`` tasks: one asyncio event loop per container, on its own thread.

The engines know only callback-style tasks (``process_async(envelope, collector,
coordinator, callback)``). :class:`AsyncioTask` wraps a task whose ``process`` is a
coroutine function and presents that interface, so every rule of SEMANTICS.md is
enforced by the engine exactly as for any async task (in-order invocation,
``task.max.concurrency``, barriers, low watermark, timeouts, shutdown).

How an invocation travels (the hot path):

* engine thread: ``process_async`` appends the invocation to the runner's deque and,
  only when no drain is already scheduled, wakes the loop once
  (``call_soon_threadsafe``: one self-pipe write per burst, not per message);
* loop thread: the drain pops invocations in order and steps each new coroutine
  directly with ``coro.send(None)``. A coroutine that finishes without suspending
  completes its callback at once and never costs an ``asyncio.Task``; one that
  suspends is continued by a Task that resumes the already-started coroutine.

During that first step ``asyncio.current_task()`` returns a stand-in that forwards
``cancel``/``uncancel``/``cancelling`` to the Task created if the coroutine
suspends, so ``asyncio.timeout()``, ``TaskGroup`` and client libraries that need a
current task work from the first line of ``process``.

Callbacks are resolved exactly once (rule 17): a coroutine that the adapter
cancelled (callback timeout or shutdown) never resolves its callback; the engine
reports the timeout (CallbackTimeoutError) or has stopped waiting for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import importlib
import inspect
import logging
import selectors
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

from ._core import AsyncioStepper
from ._core import aio_first_step as _first_step
from .api import AsyncStreamTask, Callback, Collector, Coordinator, Envelope, TaskContext, TimerService
from .config import Config
from .errors import ConfigError

log = logging.getLogger("tailrace.aio")

T = TypeVar("T")

__all__ = ["AsyncioRunner", "AsyncioTask", "new_event_loop"]

# Which loop AsyncioRunner makes when not told: None = uvloop when it imports,
# True = uvloop (error when missing), False = asyncio's default loop.
USE_UVLOOP: bool | None = None

# How long close() waits for cancelled coroutines to unwind before it gives up on
# them (a coroutine that swallows CancelledError and keeps awaiting).
CANCEL_GRACE_S = 5.0
# coroutines that ignored their cancellation for CANCEL_GRACE_S: abandoned, never waited again
_ABANDONED: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()

# How long a loop other than our own selector loop (uvloop) is lent at a time to
# the dispatch thread for inline steps, while no coroutine of ours is suspended:
# the longest its other work (another library's timer, a call_soon_threadsafe)
# may wait meanwhile.
PARK_SLICE_S = 0.005


def _uvloop(required: bool) -> Any:
    """The uvloop module, or None when it does not import; ConfigError saying how to
    install it when ``required`` (``USE_UVLOOP`` or ``use_uvloop`` is True)."""
    try:
        return importlib.import_module("uvloop")  # optional extra: tailrace[uvloop]
    except ImportError as e:
        if required:
            raise ConfigError(
                f"tailrace.aio.USE_UVLOOP (or use_uvloop) is True, but uvloop does not import ({e}): "
                "pip install 'tailrace[uvloop]', or set it to None (uvloop when installed) or "
                "False (asyncio's loop)"
            ) from e
        return None


def new_event_loop(use_uvloop: bool | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when ``uvloop`` imports (or ``use_uvloop`` is True:
    ConfigError when it does not), else asyncio's default. ``use_uvloop=False`` forces
    the default loop."""
    if use_uvloop is not False:
        uvloop = _uvloop(bool(use_uvloop))
        if uvloop is not None:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


class _OwnedSelector(selectors.BaseSelector):
    """The selector of the runner's own asyncio loop, wrapped so that the loop thread
    owns the loop (``AsyncioStepper.own``) at all times except while it waits in
    ``select``.

    Whoever holds the stepper's lock knows the loop runs no callback until it lets go: the
    dispatch thread uses that to step a coroutine itself (the inline fast path of
    :class:`AsyncioRunner`) without racing the loop thread over the loop's state.
    """

    def __init__(self, stepper: AsyncioStepper) -> None:
        self._inner = selectors.DefaultSelector()
        self._stepper = stepper

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        stepper = self._stepper
        stepper.disown()
        try:
            return self._inner.select(timeout)
        finally:
            stepper.own()

    def close(self) -> None:
        self._inner.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Any:
        return self._inner.get_map()


# An invocation as queued by the engine thread:
# (adapter, envelope, collector, coordinator, callback, deadline or 0.0).
_Invocation = tuple["AsyncioTask", Envelope, Collector, Coordinator, Callback, float]


class AsyncioRunner:
    """One asyncio event loop running on its own daemon thread, shared by the
    ``async def`` tasks of one container.

    The loop and thread start on first use (:meth:`start`). :meth:`run` runs a
    coroutine on the loop and waits for it from another thread; :meth:`close`
    stops the loop, finalises async generators and joins the thread (idempotent,
    safe from any thread but the loop's own).
    """

    def __init__(self, *, use_uvloop: bool | None = None, name: str = "tailrace-asyncio") -> None:
        self._use_uvloop = USE_UVLOOP if use_uvloop is None else use_uvloop
        if self._use_uvloop:
            _uvloop(True)  # missing: refused now, while the container plans, not in a task's first step
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._pending: deque[_Invocation] = deque()
        self._drain_scheduled = False
        self._park_scheduled = False
        self._adapters: list[AsyncioTask] = []
        # Its lock is held by the loop thread except while it waits in select
        # (_OwnedSelector); the dispatch thread takes it to step a coroutine inline.
        self._stepper = AsyncioStepper(self._pending, _TaskStandIn)

    # -- lifecycle --------------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop (started on first access)."""
        loop = self._loop
        if loop is None:
            return self.start()
        return loop

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> asyncio.AbstractEventLoop:
        """Create the loop and start its thread (once); returns the loop."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the asyncio runner is closed")
            if self._loop is not None:
                return self._loop
            loop, owned = self._new_loop()
            started = threading.Event()
            thread = threading.Thread(
                target=self._main,
                args=(loop, started, self._stepper, owned),
                name=self._name,
                daemon=True,
            )
            thread.start()
            started.wait()
            self._thread = thread
            self._loop = loop
            log.debug("asyncio runner started (%s) on thread %s", type(loop).__module__, thread.name)
            return loop

    def _new_loop(self) -> tuple[asyncio.AbstractEventLoop, bool]:
        """uvloop's loop (as ``new_event_loop`` chooses), else asyncio's selector loop
        over an :class:`_OwnedSelector`; True when it is the latter."""
        if self._use_uvloop is not False:
            loop = new_event_loop(self._use_uvloop)
            if type(loop).__module__.startswith("uvloop"):
                return loop, False
            loop.close()
        return asyncio.SelectorEventLoop(_OwnedSelector(self._stepper)), True

    @staticmethod
    def _main(
        loop: asyncio.AbstractEventLoop, started: threading.Event, stepper: AsyncioStepper, selector: bool
    ) -> None:
        stepper.own()  # let go only in select / while parked (and at the end)
        stepper.selector = selector
        stepper.standin = _TaskStandIn(loop)
        stepper.loop = loop  # from now on process_async may step inline
        try:
            AsyncioRunner._serve(loop, started)
        finally:
            stepper.loop = None  # closed: no more inline steps
            stepper.disown()

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        try:
            loop.run_forever()
        finally:
            try:
                leftovers = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in leftovers:
                    t.cancel()
                # coroutines that already ignored a cancellation for CANCEL_GRACE_S (an
                # adapter's close) are not waited for a second time
                leftovers = [t for t in leftovers if t not in _ABANDONED]
                if leftovers:
                    loop.run_until_complete(asyncio.wait(leftovers, timeout=CANCEL_GRACE_S))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            except Exception:
                log.exception("error while shutting down the asyncio loop")
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def close(self) -> None:
        """Cancel what still runs, stop the loop and join its thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if threading.current_thread() is thread:
            raise RuntimeError("AsyncioRunner.close() called from its own loop thread")
        for adapter in list(self._adapters):
            adapter._abandon()
        try:
            loop.call_soon_threadsafe(loop.stop)
            self._stepper.unpark()
        except RuntimeError:  # loop already closed
            pass
        thread.join()
        log.debug("asyncio runner stopped")

    # -- calls from other threads ----------------------------------------------
    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (re-raises its exception).

        Must not be called from the loop thread (it would wait on itself).
        """
        loop = self.loop
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("AsyncioRunner.run() called from the loop thread: await the coroutine instead")
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        self._stepper.unpark()
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the loop thread and wait for its result."""
        if self.in_loop_thread():
            return fn(*args)

        async def _call() -> T:
            return fn(*args)

        return self.run(_call())

    # -- the hot path -----------------------------------------------------------
    def submit(self, inv: _Invocation) -> None:
        """Engine thread: queue one invocation; wake the loop once per burst."""
        self._pending.append(inv)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            loop = self._loop
            if loop is None:
                raise RuntimeError("the asyncio runner is not started (was init() skipped?)")
            loop.call_soon_threadsafe(self._drain)
            self._stepper.unpark()

    def _drain(self) -> None:
        """Loop thread: start every queued invocation, in queue order.

        The flag is cleared before the first pop: an append that saw the flag still
        set happened before this clear, so its item is popped below (a stale True
        read costs nothing; a False read schedules one more, maybe empty, drain).
        """
        self._drain_scheduled = False
        pending = self._pending
        popleft = pending.popleft
        loop = self._loop
        assert loop is not None
        standin = _TaskStandIn(loop)
        while pending:
            adapter, envelope, collector, coordinator, callback, deadline = popleft()
            if adapter._closing:
                continue  # never started: close() came first; the engine stopped waiting
            refs = sys.getrefcount(standin)
            try:
                suspended = _first_step(adapter._process, envelope, collector, coordinator, loop, standin)
            except BaseException as exc:  # noqa: BLE001 - any failure belongs to this message (rule 16)
                suspended = None
                _resolve(callback, exc, envelope)
            else:
                if suspended is None:
                    _resolve(callback, None, envelope)
                else:
                    adapter._suspended(*suspended, callback, envelope, deadline, standin)
            # as AsyncioStepper.try_step: a stand-in nobody kept and that saw no cancel()
            # serves the next message too; one kept stands for this message alone
            if suspended is not None or sys.getrefcount(standin) != refs or standin._cancel_msgs:
                if suspended is None:
                    standin._finished = True  # its message is done: done() says so
                standin = _TaskStandIn(loop)
        if not self._stepper.selector and not self._park_scheduled:
            self._park_scheduled = True
            loop.call_soon(self._park)

    def _park(self) -> None:
        """Loop thread (a loop without our selector hook: uvloop): lend the loop to
        the dispatch thread for inline steps, a slice at a time, while nothing of
        ours is suspended and the dispatch thread keeps stepping."""
        self._park_scheduled = False
        if self._pending or self._closed or any(a._inflight for a in self._adapters):
            return
        if self._stepper.park(PARK_SLICE_S):
            self._park_scheduled = True
            loop = self._loop
            assert loop is not None
            loop.call_soon(self._park)  # after one turn of the loop (its I/O, its timers)


def _resolve(callback: Callback, exc: BaseException | None, envelope: Envelope) -> None:
    """Complete or fail ``callback``; an error from the engine's side is logged,
    never allowed to stop the drain (the other queued messages still need it)."""
    try:
        if exc is None:
            callback.complete()
        else:
            callback.fail(exc)
    except Exception:
        log.exception("resolving the callback of %r failed", envelope)


class _TaskStandIn:
    """``asyncio.current_task()`` during a coroutine's first, direct step.

    Cancellation requests made before the coroutine suspends are recorded and
    replayed on the Task that continues it; afterwards they are forwarded. Other
    Task methods are forwarded once that Task exists.
    """

    __slots__ = ("_cancel_msgs", "_finished", "_loop", "_task", "_uncancels")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None
        self._cancel_msgs: list[Any] = []
        self._uncancels = 0
        self._finished = False  # its coroutine ended in its first step

    def _bind(self, task: asyncio.Task[Any]) -> None:
        """The Task continuing the coroutine exists: replay the cancellations asked
        for meanwhile. The Task has not taken its first step yet; _Continuation
        delivers a cancellation that arrives now to the coroutine's await, as
        asyncio does for a Task waiting on a future."""
        self._task = task
        for msg in self._cancel_msgs:
            task.cancel(msg)
        for _ in range(self._uncancels):
            task.uncancel()
        self._cancel_msgs.clear()

    def cancel(self, msg: Any = None) -> bool:
        if self._task is not None:
            return self._task.cancel(msg)
        self._cancel_msgs.append(msg)
        return True

    def uncancel(self) -> int:
        if self._task is not None:
            return self._task.uncancel()
        if len(self._cancel_msgs) > self._uncancels:
            self._uncancels += 1
        return len(self._cancel_msgs) - self._uncancels

    def cancelling(self) -> int:
        if self._task is not None:
            return self._task.cancelling()
        return len(self._cancel_msgs) - self._uncancels

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._finished if self._task is None else self._task.done()

    def cancelled(self) -> bool:
        return False if self._task is None else self._task.cancelled()

    def __getattr__(self, name: str) -> Any:
        task = self._task
        if task is None:
            raise AttributeError(
                f"{name!r} is not available before the coroutine's first suspension "
                "(tailrace steps process() directly until it awaits something pending)"
            )
        return getattr(task, name)

    def __repr__(self) -> str:
        return f"<tailrace task stand-in for {self._task!r}>"


class _Continuation(Coroutine[Any, Any, None]):
    """What the Task that continues a suspended ``process`` coroutine runs.

    It forwards what the Task sends or throws to that coroutine, which has already
    started: its first ``send`` hands the Task the future the coroutine suspended on.
    A cancellation that reaches the Task before its first step (one replayed from the
    stand-in, or asyncio.timeout(0) expiring first) is thrown in at the coroutine's
    await, as asyncio does for a Task waiting on a future; a coroutine function would
    die of it unstarted and leave its message unresolved for ever. When the coroutine
    ends, it resolves the message's callback; the Task itself ends with None.
    """

    __slots__ = ("_adapter", "_coro", "_first", "_inf")

    def __init__(
        self, adapter: AsyncioTask, inf: _Inflight, coro: Coroutine[Any, Any, Any], first: Any
    ) -> None:
        self._adapter = adapter
        self._inf = inf
        self._coro = coro
        self._first = first

    def send(self, value: Any) -> Any:
        first = self._first
        if first is not None:
            self._first = None
            return first
        return self._step(self._coro.send, value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        exc = typ if isinstance(typ, BaseException) else (val if isinstance(val, BaseException) else typ())
        first = self._first
        if first is not None:  # never waited on by the Task: cancel it as the Task would have
            self._first = None
            if isinstance(exc, asyncio.CancelledError) and isinstance(first, asyncio.Future):
                first.cancel()
        return self._step(self._coro.throw, exc)

    def close(self) -> None:
        self._first = None
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:
        return self  # its own iterator, as a Task drives it

    def __iter__(self) -> _Continuation:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def _step(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        try:
            return fn(arg)
        except StopIteration:
            self._end(None)
        except BaseException as e:  # noqa: BLE001 - handed to the engine through the callback
            self._end(e)
        raise StopIteration

    def _end(self, exc: BaseException | None) -> None:
        inf = self._inf
        self._adapter._inflight.discard(inf)
        if inf.handle is not None:
            inf.handle.cancel()
        if inf.cancelled:
            if exc is not None and not isinstance(exc, asyncio.CancelledError):
                log.debug("cancelled coroutine for %r ended with %r", inf.envelope, exc)
            return  # the engine timed it out or stopped waiting: never resolve twice (rule 17)
        _resolve(inf.callback, exc, inf.envelope)

    @property
    def __name__(self) -> str:  # asyncio's Task repr: the user's coroutine
        return str(getattr(self._coro, "__qualname__", "process"))

    def __repr__(self) -> str:
        return f"<tailrace continuation of {self._coro!r}>"


class _Inflight:
    """A suspended invocation: its callback, the Task continuing it, its deadline
    timer, and whether the adapter cancelled it (then it never resolves)."""

    __slots__ = ("callback", "cancelled", "envelope", "handle", "task")

    def __init__(self, callback: Callback, envelope: Envelope) -> None:
        self.callback = callback
        self.envelope = envelope
        self.cancelled = False
        self.task: asyncio.Task[None] | None = None
        self.handle: asyncio.TimerHandle | None = None


class _LoopTimers:
    """Wraps the engine's TimerService so a timer function may be a coroutine
    function: its coroutine runs on the loop and the engine waits for it (a timer
    is a barrier like window, rule 23)."""

    def __init__(self, inner: TimerService, runner: AsyncioRunner) -> None:
        self._inner = inner
        self._runner = runner

    def schedule(self, key: Any, when: float, fn: Callable[[Any, Collector, Coordinator], Any]) -> None:
        runner = self._runner

        def fire(k: Any, collector: Collector, coordinator: Coordinator) -> Any:
            return _finish(runner, fn(k, collector, coordinator))

        self._inner.schedule(key, when, fire)

    def cancel(self, key: Any) -> bool:
        return self._inner.cancel(key)

    def now(self) -> float:
        return self._inner.now()

    def schedule_event_time(self, key: Any, when_ms: int | float, fn: Callable[..., Any] | None) -> None:
        if fn is None:  # the task's on_event_time (the container made it wait for a coroutine)
            self._inner.schedule_event_time(key, when_ms, None)
            return
        self._inner.schedule_event_time(key, when_ms, sync_hook(self._runner, fn))

    def cancel_event_time(self, key: Any) -> bool:
        return bool(self._inner.cancel_event_time(key))


def sync_hook(runner: AsyncioRunner, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a plain function for an engine thread: a coroutine it returns runs to its end
    on the loop while the engine waits (a timer is a barrier, rule 23)."""

    def call(*args: Any) -> Any:
        return _finish(runner, fn(*args))

    return call


def _finish(runner: AsyncioRunner, result: Any) -> Any:
    """A hook's result: a coroutine (or other awaitable) is run to completion on
    the loop while the calling engine thread waits; anything else is returned."""
    if inspect.isawaitable(result):
        return runner.run(_await(result))
    return result


async def _await(aw: Awaitable[T]) -> T:
    return await aw


class AsyncioTask(AsyncStreamTask):
    """Adapts a task with ``async def process(envelope, collector, coordinator)`` to
    the callback interface the engines run.

    ``process`` runs on the container's asyncio loop thread; ``init``, ``window``,
    ``end_of_stream`` and ``close`` may be plain functions (run on the calling
    engine thread) or coroutine functions (run on the loop while the engine waits).
    ``context.loop`` is the loop. The wrapped task is ``self.task``.
    """

    def __init__(self, task: Any, runner: AsyncioRunner, config: Config) -> None:
        self.task = task
        self.runner = runner
        self._process: Callable[[Envelope, Collector, Coordinator], Coroutine[Any, Any, Any]] = task.process
        self.policy: Any = None  # its ErrorPolicy (the container sets it): counts the retries
        if config.error_retries > 0:
            self._process = self._retrying(
                task.process, config.error_retries, config.error_retry_backoff_ms / 1000
            )
        self._timeout_s = config.callback_timeout_ms / 1000.0 if config.callback_timeout_ms > 0 else 0.0
        self._closing = False
        self._closed = False
        self._inflight: set[_Inflight] = set()
        self._submit = runner.submit
        self._try_step = runner._stepper.try_step
        # Expose only the hooks the task defines: engines look them up by name and
        # a window/end_of_stream that exists is run (and counted).
        for name in ("window", "end_of_stream"):
            user = getattr(task, name, None)
            if callable(user):
                setattr(self, name, self._hook(user))
        runner._adapters.append(self)

    def _retrying(
        self, process: Callable[..., Coroutine[Any, Any, Any]], retries: int, backoff_s: float
    ) -> Callable[..., Coroutine[Any, Any, Any]]:
        """``process`` attempted up to ``retries`` more times, ``backoff_s`` doubled between
        attempts (task.error.retries; rule 39): the last failure goes to task.error.policy.
        The store writes of a failed attempt stay (docs/bad-messages.md)."""

        async def process_with_retries(
            envelope: Envelope, collector: Collector, coordinator: Coordinator
        ) -> Any:
            for attempt in range(retries + 1):
                try:
                    return await process(envelope, collector, coordinator)
                except Exception:
                    if attempt == retries:
                        raise
                if self.policy is not None:
                    self.policy.note_retry()
                await asyncio.sleep(min(backoff_s * (2**attempt), 60.0))
            return None

        return process_with_retries

    def _hook(self, user: Callable[..., Any]) -> Callable[..., Any]:
        runner = self.runner

        def run_hook(collector: Collector, coordinator: Coordinator) -> Any:
            return _finish(runner, user(collector, coordinator))

        run_hook.__name__ = getattr(user, "__name__", "hook")
        run_hook.__qualname__ = getattr(user, "__qualname__", run_hook.__name__)
        return run_hook

    def __repr__(self) -> str:
        return f"AsyncioTask({self.task!r})"

    # -- engine interface ---------------------------------------------------------
    def init(self, context: TaskContext) -> None:
        """Start the loop, expose it as ``context.loop``, run the task's ``init``."""
        runner = self.runner
        loop = runner.start()
        context.loop = loop
        context._timers = _LoopTimers(context._timers, self.runner)
        user = getattr(self.task, "init", None)
        if callable(user):
            _finish(self.runner, user(context))

    def process_async(
        self,
        envelope: Envelope,
        collector: Collector,
        coordinator: Coordinator,
        callback: Callback,
    ) -> None:
        """Start ``process`` (in call order; rule 1): its first step right here when
        the loop is idle, else queued for the loop thread.

        The loop is idle when its thread waits in select and nothing is queued for
        it: then this thread takes the loop (``AsyncioStepper.try_step``), which runs nothing until
        it is let go, so the coroutine may use the loop exactly as if it ran on the
        loop thread (``get_running_loop()`` returns it; the timers, futures and
        tasks it makes belong to it) while only one thread at a time touches the
        loop. A coroutine that finishes resolves its callback on this thread (the
        engine's cheap, local completion); one that suspends gets its Task here and
        the loop is woken to run it; anything else the step scheduled on the loop (a
        timer, a background task) wakes it too.
        """
        timeout = self._timeout_s
        deadline = time.monotonic() + timeout if timeout else 0.0
        if not self._try_step(self, envelope, collector, coordinator, callback, deadline):
            self._submit((self, envelope, collector, coordinator, callback, deadline))

    def close(self) -> None:
        """Cancel coroutines still running (the engine has stopped waiting for them:
        task.shutdown.ms passed, or the run failed), wait for them to unwind, run
        the task's ``close``; the last adapter to close stops the loop."""
        if self._closed:
            return
        self._closed = True
        runner = self.runner
        try:
            if runner.running:
                left = runner.run(self._cancel_all())
                if left:
                    log.warning(
                        "%d in-flight coroutine(s) ignored cancellation for %.0f s (closing %r); "
                        "abandoning them",
                        left,
                        CANCEL_GRACE_S,
                        self.task,
                    )
            user = getattr(self.task, "close", None)
            if callable(user):
                _finish(runner, user())
        finally:
            if self in runner._adapters:
                runner._adapters.remove(self)
            if not runner._adapters:
                runner.close()

    # -- loop thread ----------------------------------------------------------------
    def _suspended(
        self,
        coro: Coroutine[Any, Any, Any],
        fut: Any,
        ctx: contextvars.Context,
        callback: Callback,
        envelope: Envelope,
        deadline: float,
        standin: _TaskStandIn,
    ) -> None:
        """The coroutine awaited something pending: continue it in a Task."""
        inf = _Inflight(callback, envelope)
        loop = self.runner._loop
        assert loop is not None
        task: asyncio.Task[None] = loop.create_task(_Continuation(self, inf, coro, fut), context=ctx)
        inf.task = task
        standin._bind(task)
        self._inflight.add(inf)
        if deadline:
            inf.handle = loop.call_at(deadline - time.monotonic() + loop.time(), self._expire, inf)

    def _expire(self, inf: _Inflight) -> None:
        """Deadline reached (task.callback.timeout.ms): cancel the coroutine. The
        engine fails the container with CallbackTimeoutError for this callback."""
        inf.handle = None
        if inf.task is None or inf.task.done():
            return
        log.debug("callback for %r timed out: cancelling its coroutine", inf.envelope)
        inf.cancelled = True
        inf.task.cancel(f"tailrace: task.callback.timeout.ms expired for {inf.envelope!r}")

    async def _cancel_all(self) -> int:
        """Cancel every coroutine still in flight and wait (bounded) for them to unwind;
        returns how many did not finish. The engine closes its tasks one after another:
        the first to close cancels the coroutines of every task of the runner, so those
        that ignore cancellation cost one CANCEL_GRACE_S in all, not one per task."""
        tasks = []
        for adapter in (self, *(a for a in self.runner._adapters if a is not self and not a._closed)):
            adapter._closing = True
            for inf in list(adapter._inflight):
                inf.cancelled = True
                if inf.handle is not None:
                    inf.handle.cancel()
                    inf.handle = None
                if inf.task is not None and not inf.task.done() and inf.task not in _ABANDONED:
                    inf.task.cancel("tailrace: task closed while this message was in flight")
                    tasks.append(inf.task)
        if not tasks:
            return 0
        log.debug("cancelled %d in-flight coroutine(s) closing %r", len(tasks), self.task)
        _, pending = await asyncio.wait(tasks, timeout=CANCEL_GRACE_S)
        _ABANDONED.update(pending)
        return len(pending)

    def _abandon(self) -> None:
        """The runner is closing without this adapter having been closed (the
        engine skipped close after an error): never resolve what is in flight."""
        self._closing = True
        for inf in list(self._inflight):
            inf.cancelled = True
