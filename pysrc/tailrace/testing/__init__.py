"""Test a task without sleeping: :class:`TestDriver` runs it on virtual time.

In the spirit of Kafka Streams' ``TopologyTestDriver``: give the driver a task class, its config
and its input streams; send messages, move the clock with :meth:`TestDriver.advance` (windows,
commits and ``context.schedule`` timers fire exactly when they are due, in order, and nothing
waits for real time), complete the callbacks of an asynchronous task in any order, and read the
outputs, committed offsets, metrics and store contents. Every call returns once the run loop has
nothing left to do at the current virtual time, so what a test asserts next is deterministic.

The pytest fixture ``tailrace_driver`` (registered as a pytest plugin when tailrace is installed)
makes one in a line and closes it after the test; see docs/testing.md.

Determinism needs every piece of the task's work under the driver's control: sync tasks run on
the loop thread (``job.container.thread.pool.size`` must stay 0), callback tasks
(``AsyncStreamTask``) hand their callbacks to the test (:attr:`TestDriver.pending`), and
``async def`` tasks run on an asyncio loop of the driver's virtual time (``asyncio.sleep`` ends
when the test advances past it).
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api import task_kind
from ..clock import ManualClock
from ..config import Config, parse_config
from ..container import Container, EngineName, check_task_factory
from ..errors import ConfigError, TailraceError
from ..interfaces import CheckpointStore
from ..memory import MemoryCheckpointStore, MemorySystem, decode_state, partition_lists
from ..metrics import ContainerMetrics, RunResult, TaskMetrics
from ..types import Offset, SystemStreamPartition

if TYPE_CHECKING:
    from ._asyncio import VirtualTimeRunner

__all__ = ["ManualClock", "Pending", "TestDriver"]

SETTLE_TIMEOUT_S = 30.0  # real seconds a step may take before the driver reports a stuck run


@dataclass
class Pending:
    """One envelope an asynchronous task has been given and not yet resolved.

    ``complete()`` / ``fail(exc)`` resolve it (once, as the task's own code would) and return
    after the run loop has acted on it (released, committed, dispatched the next messages).
    ``callback`` is the callback the task received; ``resolved`` turns true once anyone resolved
    it (the test, or the task itself, inline or later from any thread).
    """

    envelope: Any
    callback: Any
    driver: TestDriver = field(repr=False)
    resolved: bool = False

    @property
    def message(self) -> Any:
        return self.envelope.message

    @property
    def offset(self) -> Offset:
        return self.envelope.offset

    def complete(self) -> None:
        self.resolved = True
        self.callback.complete()
        self.driver.settle()

    def fail(self, error: BaseException) -> None:
        self.resolved = True
        self.callback.fail(error)
        self.driver.settle()


class _TrackedCallback:
    """The engine's callback as an async task receives it under the driver.

    ``complete()`` / ``fail(exc)`` mark its :class:`Pending` entry resolved, then go to the
    engine's callback unchanged: the engine still sees every resolution, from any thread, and
    reports a second one (rule 17) as it would. Other attributes are the engine callback's.
    """

    __slots__ = ("_tr_callback", "_tr_entry")

    def __init__(self, callback: Any, entry: Pending) -> None:
        object.__setattr__(self, "_tr_callback", callback)
        object.__setattr__(self, "_tr_entry", entry)

    def complete(self) -> None:
        # marked first: once the engine has it, the loop may run on (another thread's
        # completion), and pending must not offer it to the test meanwhile
        self._tr_entry.resolved = True
        self._tr_callback.complete()

    def fail(self, exc: BaseException) -> None:
        self._tr_entry.resolved = True
        self._tr_callback.fail(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tr_callback, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tr_callback, name, value)

    def __repr__(self) -> str:
        return repr(self._tr_callback)


class TestDriver:
    """Runs one task class over in-memory input streams on a :class:`~tailrace.clock.ManualClock`.

    ``task``: a task class (or a factory returning task instances), as for ``Container``.
    ``inputs``: input streams and their partition counts, ``{"words": 2}``, or the messages each
    partition holds at the start, ``{"words": [["a", "b"], ["c"]]}`` (a restarted job skips what its
    checkpoint covers); the test feeds them with :meth:`send`. Outputs go to streams of the same
    in-memory system (``system``, default ``"mem"``: ``collector.send("mem.counts", ...)``), read
    with :meth:`outputs`.
    ``config``: Samza keys as for ``Container``. ``engine``: ``"python"`` (the reference engine)
    or ``"c"`` (the C loop); both take every deadline from the driver's clock.
    ``checkpoints``: a checkpoint store (default in memory; pass the same store to a second
    driver to test a restart). ``stores``: state stores, passed to ``Container`` when it takes
    them. ``start``: the virtual epoch time the run starts at.

    Not thread-safe: drive it from the test's thread. Use it as a context manager (or call
    :meth:`close`) so the run loop stops.
    """

    __test__ = False  # a class named Test* is not a pytest test class

    def __init__(
        self,
        task: type | Callable[[], Any],
        *,
        inputs: Mapping[str, int | Sequence[Sequence[Any]]],
        config: Mapping[str, Any] | Config | None = None,
        engine: EngineName = "python",
        checkpoints: CheckpointStore | None = None,
        stores: Any = None,
        system: str = "mem",
        output_partitions: int = 1,
        start: float = 1_700_000_000.0,
        default_output_system: str | None = None,
    ) -> None:
        check_task_factory(task)  # an instance: refused here, not by the factory that calls it
        if not inputs:
            raise ConfigError("a test driver needs at least one input stream", key="inputs")
        parsed = parse_config(config)
        if parsed.thread_pool_size:
            raise ConfigError(
                "the test driver runs process on the loop thread, deterministically; "
                f"got {parsed.thread_pool_size}",
                key="job.container.thread.pool.size",
                allowed="0",
            )
        self.clock = ManualClock(start)
        self.system = MemorySystem(system, output_partitions=output_partitions)
        self._streams = list(inputs)
        self._shutdown_s = parsed.shutdown_ms / 1000
        for stream, spec in inputs.items():
            initial = [[]] * spec if isinstance(spec, int) else partition_lists(stream, spec)
            self.system.add_live_stream(stream, len(initial))
            for partition, messages in enumerate(initial):
                for message in messages:
                    self.system.append(stream, partition, message)
        self.checkpoints = checkpoints if checkpoints is not None else MemoryCheckpointStore()
        self._pending: list[Pending] = []
        self._pending_lock = threading.Lock()
        self._prune_at = 64  # _pending's length at which resolved entries are dropped
        self.tasks: list[Any] = []  # the task instances, in creation order
        self._config = parsed
        self._asyncio: VirtualTimeRunner | None = None  # the loop of `async def` tasks, if any
        options: dict[str, Any] = {}
        if stores is not None:
            if "stores" not in inspect.signature(Container).parameters:
                raise TypeError("this tailrace's Container takes no state stores (stores=)")
            options["stores"] = stores
        self.container = Container(
            self._factory(task),
            inputs=[f"{system}.{stream}" for stream in inputs],
            systems=[self.system],
            config=parsed,
            checkpoints=self.checkpoints,
            engine=engine,
            clock=self.clock,
            default_output_system=default_output_system,
            **options,
        )
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._error_reported = False
        self._thread: threading.Thread | None = None
        self._closed = False

    @classmethod
    def from_job(
        cls,
        job: str | os.PathLike[str],
        *,
        inputs: Mapping[str, int | Sequence[Sequence[Any]]] | None = None,
        overrides: Mapping[str, Any] | None = None,
        engine: EngineName | None = None,
        checkpoints: CheckpointStore | None = None,
    ) -> TestDriver:
        """A driver for the task and config of a job file (``tailrace run``'s TOML or .py).

        The job's inputs must all be streams of one system; the driver replaces that system by
        an in-memory one of the same name, so ``collector.send("files.counts", ...)`` lands in
        :meth:`outputs`. ``inputs`` defaults to each input stream with the partition count the
        job's system reports. ``overrides`` are ``--config`` pairs (``{"task.window.ms": 100}``);
        ``engine`` wins over the job's. Checkpoints stay in memory unless ``checkpoints`` is given.
        """
        from ..jobfile import load_job
        from ..types import parse_system_stream

        spec = load_job(Path(job), overrides, engine)
        streams = [parse_system_stream(name) for name in spec.inputs]
        systems = {ss.system for ss in streams}
        if len(systems) != 1:
            raise ConfigError(
                f"the test driver feeds the inputs of one system; {spec.source} reads from {sorted(systems)}",
                key="job.inputs",
                source=str(spec.source),
            )
        (system,) = systems
        if inputs is None:
            inputs = {ss.stream: spec.systems[system].partitions(ss.stream) for ss in streams}
        for s in spec.systems.values():
            s.close()
        return cls(
            spec.load_task(),
            inputs=inputs,
            config=spec.config,
            engine=spec.engine,
            checkpoints=checkpoints,
            system=system,
            default_output_system=spec.default_output,
        )

    # -- the task ---------------------------------------------------------------
    def _factory(self, task: type | Callable[[], Any]) -> Callable[[], Any]:
        def make() -> Any:
            instance = task()
            kind = task_kind(instance)
            if kind == "asyncio":
                # as the container does, on a loop of the driver's clock: its coroutines
                # resolve their own callbacks, so none is pending for the test
                from ..aio import AsyncioTask
                from ._asyncio import VirtualTimeRunner

                if self._asyncio is None:
                    self._asyncio = VirtualTimeRunner(self.clock)
                self.tasks.append(instance)
                return AsyncioTask(instance, self._asyncio, self._config)
            if kind == "async":
                process_async = instance.process_async

                def captured(envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
                    entry = Pending(envelope, None, self)
                    entry.callback = tracked = _TrackedCallback(callback, entry)
                    try:
                        process_async(envelope, collector, coordinator, tracked)
                    except BaseException:
                        entry.resolved = True  # the message failed (rule 16): nothing to complete
                        raise
                    if entry.resolved:
                        return  # resolved inline: never pending
                    # listed once its call returned (calls are sequential on the loop thread, so
                    # in invocation order); a thread that resolves it from here on marks it
                    with self._pending_lock:
                        if len(self._pending) >= self._prune_at:  # drop what threads resolved
                            self._pending = [p for p in self._pending if not p.resolved]
                            self._prune_at = max(64, 2 * len(self._pending))
                        self._pending.append(entry)

                instance.process_async = captured
            self.tasks.append(instance)
            return instance

        return make

    # -- running ----------------------------------------------------------------
    def start(self) -> TestDriver:
        """Start the run loop (``init`` hooks run) and wait until it is idle. Idempotent.
        Raises ValueError once the driver is closed (as every call that feeds the run or
        moves its clock does)."""
        if self._closed:
            raise ValueError(
                "the driver is closed: a closed driver takes no input and moves no time "
                "(its outputs, committed offsets, metrics and result stay readable)"
            )
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tailrace-test-driver", daemon=True)
            self._thread.start()
            self.settle()
        return self

    def _run(self) -> None:
        try:
            self._result = self.container.run()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread by settle()
            self._error = e

    def settle(self) -> None:
        """Wait (real time, briefly) until the run loop has nothing left to do at the current
        virtual time: no input it can dispatch, no barrier due, no completion to apply.
        Raises the run's error once it stopped with one."""
        thread = self._thread
        if thread is None:
            self.start()
            return
        if not self.clock.wait_settled(SETTLE_TIMEOUT_S, thread.is_alive):
            raise TimeoutError(
                f"the run loop did not become idle within {SETTLE_TIMEOUT_S}s of real time "
                "(a task blocking the loop thread?)"
            )
        if not thread.is_alive():
            thread.join()
        if self._error is not None and not self._error_reported:
            self._error_reported = True
            raise self._error

    @property
    def running(self) -> bool:
        """True while the run loop runs (not stopped by end of stream, shutdown or an error)."""
        return self._thread is not None and self._thread.is_alive()

    # -- input and time -----------------------------------------------------------
    def send(
        self, stream: str, message: Any, *, key: Any = None, partition: int = 0, timestamp: int | None = None
    ) -> Offset:
        """Append one message to an input partition and let the loop process it; its offset.

        ``timestamp`` (ms since the epoch) is its event time as the input system gives it
        (rule 32), unless the task reads its own (``task.timestamp.field``, a ``timestamp``
        method); without it, a message's time is when the loop read it: the virtual clock.
        Event time moves only by timestamps, wall time only by ``advance``."""
        self.start()
        offset = self.system.append(stream, partition, message, key=key, timestamp=timestamp)
        self.settle()
        return offset

    def send_all(
        self,
        stream: str,
        messages: Sequence[Any],
        *,
        partition: int = 0,
        timestamps: Sequence[int] | None = None,
    ) -> list[Offset]:
        """Append several messages to one partition (``timestamps``: one per message, as for
        ``send``), then let the loop process them."""
        if timestamps is not None and len(timestamps) != len(messages):
            raise ValueError(f"{len(messages)} messages and {len(timestamps)} timestamps")
        self.start()
        stamps: Sequence[int | None] = timestamps if timestamps is not None else [None] * len(messages)
        offsets: list[Offset] = [
            self.system.append(stream, partition, m, timestamp=ts) for m, ts in zip(messages, stamps)
        ]
        self.settle()
        return offsets

    def watermark(self, task: str = "Partition 0") -> int | float:
        """The event-time watermark of ``task`` (rule 33: ms since the epoch; ``-math.inf``
        before there is one, ``math.inf`` once its inputs ended), as ``context.watermark()``."""
        tasks, _ = self.metrics()
        if task not in tasks:
            raise KeyError(f"no task {task!r}; tasks: {', '.join(sorted(tasks))}")
        return tasks[task].event_time_watermark

    def end_input(self, stream: str | None = None) -> RunResult | None:
        """Mark the end of one input stream (or of all): tasks whose inputs all ended run
        ``end_of_stream``, and the run stops once every task has. Returns the run's result
        once it stopped (as :attr:`result`), None while it goes on."""
        self.start()
        for name in [stream] if stream is not None else self._streams:
            self.system.end(name)
        self.settle()
        return self._result

    def advance(self, ms: float) -> None:
        """Move virtual time forward by ``ms`` milliseconds and run what became due: commits,
        then windows and ``context.schedule`` timers in time order (rules 8, 9, 23).

        One step fires a periodic window at most once (windows coalesce, rule 8): advance one
        period at a time to see every window of a span.
        """
        if isinstance(ms, bool) or not isinstance(ms, (int, float)):
            raise TypeError(f"advance takes milliseconds as a number, got {ms!r}")
        if not ms >= 0:  # (NaN too)
            raise ValueError(f"a clock never goes back: advance({ms!r}) (milliseconds, >= 0)")
        self.start()
        self.clock.advance(ms / 1000)
        self.settle()

    @property
    def now(self) -> float:
        """The virtual time in epoch seconds (what ``context.now()`` returns in the task)."""
        return self.clock.time()

    # -- what the test reads ------------------------------------------------------
    @property
    def pending(self) -> list[Pending]:
        """Envelopes handed to an async task and not yet resolved, in invocation order: one
        the task resolved itself (inline, or from another thread) is not listed, nor one whose
        ``process_async`` raised. A resolution racing with this read may land just after it."""
        with self._pending_lock:
            self._pending = [p for p in self._pending if not p.resolved]
            return list(self._pending)

    def outputs(self, stream: str, partition: int | None = None) -> list[Any]:
        """Messages sent to ``system.stream`` (one partition, or all in partition order)."""
        return self.system.messages(stream, partition)

    def records(self, stream: str, partition: int | None = None) -> list[tuple[Any, Any]]:
        """(key, message) pairs sent to ``system.stream``."""
        return self.system.records(stream, partition)

    def committed(self) -> dict[SystemStreamPartition, Offset]:
        """The offsets committed so far, by the metrics of the run (every task)."""
        snapshot = self.container.metrics()
        if snapshot is None:
            return {} if self._result is None else dict(self._result.committed)
        return {ssp: off for m in snapshot[0].values() for ssp, off in m.committed.items()}

    def committed_offset(self, stream: str, partition: int = 0) -> Offset | None:
        """The committed offset of one input partition (None: nothing committed yet)."""
        return self.committed().get(SystemStreamPartition(self.system.name, stream, partition))

    def metrics(self) -> tuple[dict[str, TaskMetrics], ContainerMetrics]:
        """Task metrics by task name, and the container's."""
        snapshot = self.container.metrics()
        if snapshot is None:
            if self._result is None:
                raise TailraceError("the run has not started")
            return self._result.tasks, self._result.container
        return snapshot

    def store(self, task: str, name: str, *, raw: bool = False) -> dict[Any, Any]:
        """The committed contents of state store ``name`` of ``task``, as the checkpoint store
        holds them, in the order of the encoded keys: keys and values decoded by the store's
        serdes (``{"ann": 2}``, as the task put them), or with ``raw=True`` the encoded bytes
        (``{b'"ann"': b"2"}``). KeyError naming an unknown task or store, and the known ones."""
        # tasks group partitions by number (GroupByPartition): "Partition N" for each N of an input
        count = max(self.system.partitions(stream) for stream in self._streams)
        tasks = [f"Partition {p}" for p in range(count)]
        if task not in tasks:
            raise KeyError(f"no task {task!r}: the tasks are {', '.join(map(repr, tasks))}")
        specs = self.container.config.stores
        if name not in specs:
            known = "the job has no stores"
            if specs:
                known = f"the tasks' stores are {', '.join(map(repr, sorted(specs)))}"
            raise KeyError(f"no state store {name!r}: {known}")
        state = getattr(self.checkpoints, "state", None)
        if state is None:
            raise TypeError(f"{type(self.checkpoints).__name__} does not expose store contents")
        # by the job's name: once the run ended the store is closed and knows no open job
        entries: dict[bytes, bytes] = state(task, name, self.container.config.job_name, raw=True)
        if raw:
            return entries
        spec = specs[name]
        return decode_state(entries, spec.key_serde, spec.value_serde)

    # -- the end ------------------------------------------------------------------
    def close(self) -> RunResult | None:
        """Stop the run gracefully (final commit, ``close()`` hooks) and return its result;
        raises the run's error if it stopped with one not yet raised. Idempotent. Afterwards
        ``start``, ``send``, ``send_all``, ``end_input`` and ``advance`` raise ValueError."""
        self._closed = True
        thread = self._thread
        if thread is None:
            return None
        if thread.is_alive():
            self.container.stop()
            self.clock.wait_settled(SETTLE_TIMEOUT_S, thread.is_alive)
            if thread.is_alive():  # draining: callbacks left pending wait task.shutdown.ms (virtual)
                self.clock.advance(self._shutdown_s)
            thread.join(SETTLE_TIMEOUT_S)
            if thread.is_alive():
                raise TimeoutError(f"the run loop did not stop within {SETTLE_TIMEOUT_S}s of real time")
        if self._asyncio is not None:
            self._asyncio.close()  # (closed already unless the engine skipped close() after an error)
        if self._error is not None and not self._error_reported:
            self._error_reported = True
            raise self._error
        return self._result

    @property
    def result(self) -> RunResult | None:
        """The run's result once it stopped (end of stream, shutdown, :meth:`close`)."""
        return self._result

    def __enter__(self) -> TestDriver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
