"""The interfaces every backend implements: systems (where input comes from and
output goes) and checkpoint stores (where committed offsets are kept). This module is
their one home; each backend is a package of its own that implements them, a
``system`` module for its system and a ``checkpoint`` module for its store
(``tailrace.files``, ``tailrace.memory``, ``tailrace.sqlite``, ``tailrace.redis``,
``tailrace.kafka``).

A :class:`System` has a name and streams; each input stream has a fixed number of
partitions. The engine owns a bounded buffer per partition (rule 6) and asks a
:class:`PartitionReader` for at most as many messages as the buffer has room
for; a reader never drops anything, it simply stops being asked while the
buffer is full (backpressure). Producers may block in ``send`` while their own
output buffer is full (rule 24).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ._core import Envelope
from .types import Offset, Offsets, SystemStreamPartition


class PartitionReader(ABC):
    """Reads one partition in offset order.

    ``start`` and ``poll`` and ``at_end`` are called on the loop thread (with the
    GIL); ``wakeup`` may be called by the reader from any thread whenever new
    messages or the end of the stream become available after a ``poll`` that
    returned nothing.
    """

    def __init__(self, ssp: SystemStreamPartition) -> None:
        self.ssp = ssp

    @abstractmethod
    def start(self, after: Offset | None, wakeup: Callable[[], None]) -> None:
        """Position after ``after`` (the committed offset), or at the start when None."""

    @abstractmethod
    def poll(self, max_messages: int) -> list[Envelope]:
        """Up to ``max_messages`` envelopes, in order; ``[]`` when none is ready now. Never blocks.

        A message that cannot be read (its bytes do not decode, its key cannot be read) is
        an envelope in its place whose ``message`` is a :class:`tailrace.types.BadInput`
        (rule 39), not an exception: the messages around it go on as usual (rule 40)."""

    @abstractmethod
    def at_end(self) -> bool:
        """True once the partition is exhausted (bounded sources) and ``poll`` returned everything."""

    def skipped(self) -> int:
        """Messages skipped as bad input (when the config asks for skipping), for metrics."""
        return 0

    def raw(self, offset: Offset) -> bytes | None:
        """The original bytes of the message at ``offset``, or None where the reader keeps
        none (a dead letter then holds the decoded value: rule 39). Error path only: it may
        read the source again (the file system reads the line back)."""
        return None

    def committed(self, offset: Offset) -> None:
        """A checkpoint with committed offset ``offset`` of this partition was just written
        (loop thread). A reader may record what it needs to check on restart that its input
        is still the one checkpointed (the file system fingerprints the line). Never raises
        for its own bookkeeping: the checkpoint is already durable."""

    def close(self) -> None:
        """Release resources (threads, files, connections). Idempotent."""


class PartitionCounts(dict[str, int]):
    """Partition counts of output streams, each asked of ``lookup`` once (a producer's
    ``partitions``: the count is fixed while a job runs)."""

    def __init__(self, lookup: Callable[[str], int]) -> None:
        super().__init__()
        self._lookup = lookup

    def __missing__(self, stream: str) -> int:
        n = self[stream] = self._lookup(stream)
        return n


class Producer(ABC):
    """Writes output messages of one system."""

    @abstractmethod
    def partitions(self, stream: str) -> int:
        """Partition count of an output stream (used to place keyed messages)."""

    @abstractmethod
    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        """Append one message; may block while the output is full (rule 24). Thread-safe."""

    def flush(self) -> None:
        """Make everything sent so far durable (called before a checkpoint is written)."""

    def flush_begin(self) -> Callable[[], None] | None:
        """The first half of ``flush`` for a commit written off the loop thread: hand
        everything sent so far to the system now (loop thread), and return what makes it
        durable, called from the commit writer's thread before the checkpoint is written
        (None: nothing left to wait for). The default flushes whole, here."""
        self.flush()
        return None

    def hold(self, task_name: str, store: CheckpointStore) -> HeldProducer:
        """Task ``task_name``'s producer under ``task.output.guarantee = exactly-once`` (rule
        41): its sends are held until the task's commit and published by it, in one atomic
        step with the offsets and state that ``store`` writes. Called at start-up, once per
        task; a system that cannot give the guarantee (the default), or not with this store,
        raises (NotImplementedError: the container names the system; ConfigError: a
        reason of the system's own)."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release resources. Idempotent."""


class CommitOutputs:
    """What a task's commit carries of its held outputs into the checkpoint store's atomic
    ``write`` (rule 41): ``marks``, file outputs' committed lengths (path -> bytes), and
    ``records``, entries the store itself appends in that write (Redis: each held batch's
    stream keys and encoded arguments, ``tailrace.redis._resp.Batch.take_body``)."""

    __slots__ = ("marks", "records")

    def __init__(self) -> None:
        self.marks: dict[str, int] = {}
        self.records: list[Any] = []

    def __bool__(self) -> bool:
        return bool(self.marks or self.records)


Write = Callable[[CommitOutputs], None]
"""A commit's atomic write of offsets and state, with the outputs it is given."""


class HandedRecords:
    """A held producer's publication (``HeldProducer.take``) that does nothing but hand its
    records to the checkpoint store's write: ``outputs.records`` gets ``records``, then
    ``write`` runs, with nothing before or after it. A commit writer may therefore write
    several tasks' commits made only of such publications in one ``write_many`` call of a
    store that ``groups_writes`` (tailrace.container.CommitWriter)."""

    __slots__ = ("records",)

    def __init__(self, records: Any) -> None:
        self.records = records

    def __call__(self, write: Write, outputs: CommitOutputs) -> None:
        outputs.records.append(self.records)
        write(outputs)


StoreWrite = tuple[str, Offsets, "StateChanges | None", "CommitOutputs | None"]
"""One task's commit as ``CheckpointStore.write`` takes it: (task name, offsets, state,
outputs), for ``CheckpointStore.write_many``."""


class HeldProducer(Producer):
    """One task's producer of one system under exactly-once outputs (rule 41).

    ``send`` (any thread, as ``Producer.send``) holds the record; nothing is visible to
    readers until the task's commit. ``take`` (loop thread, at the commit's snapshot, nothing
    outstanding) takes what was held and returns its publication: a function that, given
    the commit's write, makes the records durable and visible together with it (``None``:
    nothing held); a ``HandedRecords`` where the store's write itself appends them. The
    publication runs on the commit writer's thread. Once the held
    records pass the system's bound, ``on_full`` is called (once per commit): the engine
    makes the task's commit fall due (an early commit, docs/outputs.md)."""

    on_full: Callable[[], None] | None = None

    @abstractmethod
    def pending(self) -> bool:
        """True when records are held (the next commit must run to publish them)."""

    @abstractmethod
    def take(self) -> Callable[[Write, CommitOutputs], None] | None:
        """What was sent since the last ``take``, as its publication (see the class)."""

    def partitions(self, stream: str) -> int:  # pragma: no cover - every held producer has its own
        raise NotImplementedError

    def flush(self) -> None:
        """Nothing: held records become visible only through ``take`` (the commit)."""

    def flush_begin(self) -> Callable[[], None] | None:
        return None


class System(ABC):
    """A named source and sink of partitioned streams."""

    def __init__(self, name: str) -> None:
        if not name or "." in name:
            raise ValueError(f"system name {name!r} must be non-empty and contain no '.'")
        self.name = name

    @abstractmethod
    def partitions(self, stream: str) -> int:
        """Partition count of input stream ``stream``; raises InputError when unknown."""

    @abstractmethod
    def reader(self, ssp: SystemStreamPartition) -> PartitionReader:
        """A new reader for one input partition."""

    @abstractmethod
    def producer(self) -> Producer:
        """The system's producer (one per container)."""

    def close(self) -> None:
        """Release system-wide resources. Idempotent."""


StateChanges = Mapping[str, Mapping[bytes, "bytes | None"]]
"""A task's store changes at one commit: store name -> encoded key -> encoded
value, or None to delete the key (rule 26)."""


class EncodedRows(Mapping[bytes, "bytes | None"]):
    """One store's changes at a commit, encoded straight into the rows a table takes:
    ``puts`` a flat list ``[key, value, key, value, ...]`` and ``deletes`` the deleted keys,
    every one a bytearray. The commit writer hands a store's changes so to a checkpoint
    store that ``takes_rows`` (one pass over the dirty keys, no dict of encoded keys
    between: tailrace._stores.encode_rows). As a Mapping (encoded key -> encoded value,
    None: deleted, a later row of one key winning) it is what any other reader expects,
    made on first use."""

    __slots__ = ("_map", "deletes", "puts")

    def __init__(self, puts: list[bytearray], deletes: list[bytearray]) -> None:
        self.puts = puts
        self.deletes = deletes
        self._map: dict[bytes, bytes | None] | None = None

    def _mapping(self) -> dict[bytes, bytes | None]:
        m = self._map
        if m is None:
            puts = self.puts
            m = {bytes(puts[i]): bytes(puts[i + 1]) for i in range(0, len(puts), 2)}
            for key in self.deletes:
                m[bytes(key)] = None
            self._map = m
        return m

    def __getitem__(self, key: bytes) -> bytes | None:
        return self._mapping()[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self.puts) // 2 + len(self.deletes)

    def __repr__(self) -> str:
        return f"EncodedRows({len(self.puts) // 2} puts, {len(self.deletes)} deletes)"


class CheckpointStore(ABC):
    """Durable committed offsets and state of one job.

    A checkpoint is, per task, the committed offset of each of its partitions
    (the low watermark at the time of the commit, rules 12, 13) together with the
    contents of the task's key-value stores at that point (rules 25-29). ``write``
    stores both in **one atomic write**: after a crash either the whole new
    checkpoint of that task (offsets and state) or the whole previous one is read
    back, never a mix.

    ``open``, ``load``, ``write``, ``reset`` and ``close`` are called from the
    loop thread only (one container at a time per job and store: ``open``
    refuses a second one with CheckpointError), except that a store whose
    ``background_writes`` is True has its commits' ``write`` (and ``write_many``)
    called from the job's commit writer thread instead, one call at a time, while the
    loop goes on (``load``
    and ``open`` happen before it starts, ``close`` after it stopped).
    ``state_get`` and ``state_scan`` read committed state and are safe from any
    thread (a task's stores read through on a cache miss from pool threads,
    callbacks and coroutines).
    """

    #: Commits are written by the job's commit writer thread, off the loop (see
    #: ``tailrace.container.CommitWriter``): for a store whose writes wait on a disk.
    background_writes: bool = False
    #: With ``background_writes``: the interpreter's switch interval (seconds) while the
    #: commit writer runs, at most; None leaves it as it is. For a store whose writes are
    #: round trips with a little Python between them, so that the writer gets the GIL back
    #: from a busy loop thread at once (``tailrace.container.CommitWriter``); not for one
    #: whose writes hold the GIL in long compiled stretches (encoding, binding), which a
    #: shorter interval would let interrupt the loop more often.
    writer_switch_interval_s: float | None = None
    #: With ``background_writes``: the commit writer hands this store several tasks'
    #: commits at once (``write_many``) when they queue up; for a store that can write them
    #: in one round trip. Only commits whose publications are all ``HandedRecords`` are
    #: grouped, at most one of each task.
    groups_writes: bool = False
    #: ``write`` is handed each store's changes as ``EncodedRows`` by the commit writer (any
    #: other Mapping may still come from elsewhere): for a store that writes them as table
    #: rows, so that they are encoded once, straight into its statements' parameters.
    takes_rows: bool = False

    @abstractmethod
    def open(self, job_name: str) -> None:
        """Claim the store for ``job_name``; CheckpointError if locked by another
        container, corrupt or unreachable."""

    @abstractmethod
    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        """The last committed offsets of a task ({} if it never committed)."""

    @abstractmethod
    def write(
        self,
        task_name: str,
        offsets: Offsets,
        state: StateChanges | None = None,
        outputs: CommitOutputs | None = None,
    ) -> None:
        """Atomically record committed offsets of a task (partitions not named keep
        theirs), apply its state changes (keys not named keep their values) and, under
        exactly-once outputs (rule 41), what ``outputs`` carries (file lengths, entries to
        append); ``outputs`` is only ever passed when not empty, and a store that cannot take
        what it carries raises. Raises (CheckpointError, FencedError, ...) with nothing
        applied on failure."""

    def write_many(self, writes: Sequence[StoreWrite]) -> list[BaseException | None]:
        """Several tasks' commits, one of each task, each as ``write`` would make it (atomic
        on its own: one may fail and another be applied); a store that ``groups_writes``
        makes them in one round trip. Returns, for each, None (written) or the error that
        ``write`` would have raised (nothing of it applied). Raises only when none of them
        could be written. The default writes them one after the other."""
        errors: list[BaseException | None] = []
        for task_name, offsets, state, outputs in writes:
            try:
                self.write(task_name, offsets, state, outputs=outputs or None)
            except Exception as e:  # noqa: BLE001 - handed back, one per write
                errors.append(e)
            else:
                errors.append(None)
        return errors

    def state_get(self, task_name: str, store: str, key: bytes) -> bytes | None:
        """The committed value of ``key`` in ``store`` of a task, or None. Any thread."""
        raise NotImplementedError(f"{type(self).__name__} keeps no state")

    def state_scan(
        self, task_name: str, store: str, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Committed entries of ``store`` with ``start <= key < end`` (None: unbounded),
        in ascending order of the key bytes. Any thread; the iterator may fetch in
        batches and need not see commits made after it started."""
        raise NotImplementedError(f"{type(self).__name__} keeps no state")

    def output_marks(self, paths: Iterable[str] | None = None) -> dict[str, int]:
        """Committed lengths of the job's exactly-once file outputs (rule 41): of ``paths``,
        or of every one (None); a path never committed is absent. A store that keeps none
        raises NotImplementedError (exactly-once file outputs are refused with it). Called
        at start-up and by the commit's publication (the writer's thread)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the claim. Idempotent."""
