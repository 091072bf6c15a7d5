"""Kafka topics as a tailrace system (confluent-kafka, i.e. librdkafka).

Offsets are Kafka offsets (ints). A committed offset is the last processed
message (the low watermark, rule 12), so a partition resumes at ``offset + 1``;
the checkpoint store is authoritative for where a partition resumes, and the
same watermark is also committed to the Kafka consumer group as ``offset + 1``
(the Kafka convention) so that lag tools (``kafka-consumer-groups``, Burrow,
exporters) see the job's progress.

Reading: one consumer and one fetch thread per system. The thread calls
``consume(batch)`` and distributes the messages into bounded per-partition
buffers (rule 6: nothing is dropped, the broker keeps what is not read). A full
buffer (no room for another batch) is not paused at once: librdkafka purges a
paused partition's prefetched messages and fetches them again on resume, so a
pause at every burst costs a broker round trip. While every partition that can be
read is full, the thread waits for the engine to drain one (``poll`` wakes it; it
still consumes once a second; a group member never waits: ``consume`` serves its
rebalances, so it pauses past twice the buffer instead); what a consumed batch
brings for a full partition is buffered beyond its ``buffer``. A partition past
twice its buffer holds reading back while every other one still has a batch for
the engine (a starving one reads on); one that reaches four times its buffer is
paused at the broker (``Consumer.pause``) until the engine drained it below
``buffer`` again: memory stays bounded, at some 4 x ``buffer`` per partition. A
bounded reader's end (the high watermark) is queried on a thread of its own, so
reading starts at once. A reader's ``start(after)`` positions
its partition at ``after + 1`` (or at ``auto.offset.reset`` when it never
committed) on the fetch thread, between two ``consume`` calls, so no message
fetched for an older position is ever buffered.

Two ways to own partitions:

- a plain :class:`~tailrace.container.Container` assigns its inputs itself
  (``Consumer.incremental_assign``, no group membership: task N owns partition N);
- :mod:`tailrace.kafka.membership` subscribes to the topics and lets the group
  protocol decide (cooperative-sticky by default), running a container over what
  the group assigned.

Writing: one confluent-kafka ``Producer`` per system. ``send`` never drops: a
full local queue (``BufferError``) is served with ``poll`` and retried
(backpressure, rule 24). ``flush`` waits until every message sent so far is
acknowledged (``acks=all`` by default) and raises :class:`KafkaDeliveryError`
naming the topic and partition of the first message that was not, so no
checkpoint is written past undelivered output.

Headers: the :class:`~tailrace.Envelope` has no headers field (it is a compiled
type shared by every backend). With ``headers=True`` the envelope's ``message``
is a :class:`KafkaRecord` (``value``, ``headers``, ``timestamp``) instead of the
decoded value; ``key`` is the decoded key either way.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from .._core import Envelope, kafka_envelopes, kafka_split
from .._stopping import StopDeadline
from ..buffered import BufferedPartition
from ..config import options_checked
from ..errors import ConfigError, InputError, TailraceError
from ..interfaces import CheckpointStore, HeldProducer, PartitionCounts, PartitionReader, Producer, System
from ..serdes import Serde, SerdeError, serde
from ..types import BadInput, Offset, SystemStreamPartition

log = logging.getLogger("tailrace.kafka")


def _kafka() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "the kafka system needs confluent-kafka: pip install 'tailrace[kafka]'", key="type"
        ) from e
    return confluent_kafka


# How the compiled envelope builder decodes a key or value (_kafkain.pxi): the bytes as
# they are, UTF-8 text, or a call of the serde's decode
_CALL = 2
_DECODE_KINDS = {"bytes": 0, "str": 1}


class KafkaRecord(NamedTuple):
    """The message of an envelope read with ``headers=True``."""

    value: Any
    """The decoded value (None for a tombstone)."""
    headers: list[tuple[str, bytes | None]]
    """The record's headers in order (a name may repeat); [] when it has none."""
    timestamp: int | None
    """Milliseconds since the epoch (create or log-append time), None when unavailable."""


class KafkaDeliveryError(TailraceError):
    """A produced message was not acknowledged by Kafka; names topic and partition."""

    def __init__(self, message: str, *, topic: str, partition: int) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition


class _Positioning(NamedTuple):
    topic: str
    partition: int
    offset: int  # next offset to read; a librdkafka logical offset (OFFSET_STORED, ...) when < 0


class _Commit:
    """A group commit: queued by any thread, sent by the fetch thread (asynchronously),
    answered by ``on_commit`` (inside a later ``consume``), matched by its offsets."""

    def __init__(self, tps: list[Any], *, wait: bool) -> None:
        self.tps = tps
        self.key = frozenset((tp.topic, tp.partition, tp.offset) for tp in tps)
        self.wait = wait  # someone waits for the answer (else: fire and forget)
        self.done = threading.Event()
        self.error: BaseException | None = None


class _RepeatFilter(logging.Filter):
    """Lets each message through once per ``every`` seconds. While a broker is down
    librdkafka reports every failed reconnect of every client, several a second: a
    repeat within the window is counted, and the next one let through says how many
    like it were left out. Messages that differ only in numbers (ports, milliseconds)
    count as the same."""

    def __init__(self, every: float = 30.0) -> None:
        super().__init__()
        self.every = every
        self._lock = threading.Lock()
        self._seen: dict[tuple[int, str], list[float]] = {}  # -> [last let through, left out since]

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        key = (record.levelno, _NUMBERS.sub("#", text))
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.every:
                seen[1] += 1
                return False
            left_out = int(seen[1]) if seen is not None else 0
            if len(self._seen) >= 1000:  # bounded: a flood of distinct messages forgets the old ones
                self._seen.clear()
            self._seen[key] = [now, 0]
        if left_out:
            record.msg = f"{text} ({left_out} more like it in the last {self.every:.0f} s were not logged)"
            record.args = ()
        return True


_NUMBERS = re.compile(r"\d+")
client_log = logging.getLogger("tailrace.kafka.client")
"""librdkafka's own log lines and client errors (``logger`` and ``error_cb`` of every
client), repeats thinned out by :class:`_RepeatFilter`."""
client_log.addFilter(_RepeatFilter())


class _HeldLog:
    """A client's ``logger`` for one query: its lines are held until the query ends, then
    passed on to ``client_log`` (at DEBUG when the query's error already says it all)."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str, tuple[Any, ...]]] = []

    def log(self, level: int, msg: str, *args: Any) -> None:
        self.lines.append((level, msg, args))

    def release(self, level: int | None = None) -> None:
        for own, msg, args in self.lines:
            client_log.log(own if level is None else level, msg, *args)
        self.lines.clear()


class _BrokerErrors:
    """A client's ``error_cb`` for one query: why each broker's connection failed, and
    whether librdkafka found every broker down."""

    def __init__(self) -> None:
        self.all_down = False
        self.failures: dict[str, str] = {}  # broker (host:port, or '' when unnamed) -> its last error

    def __call__(self, err: Any) -> None:
        if err.code() == _kafka().KafkaError._ALL_BROKERS_DOWN:
            self.all_down = True
            return
        # "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused
        # (after 0ms in state CONNECT)"
        text = _AFTER.sub("", err.str())
        m = _BROKER_ERROR.match(text)
        broker, why = (m.group(1), m.group(2)) if m else ("", text)
        self.failures[broker] = _CONNECT_FAILED.sub("", why)

    def text(self) -> str:
        return "; ".join(f"{b}: {why}" if b else why for b, why in self.failures.items())


_AFTER = re.compile(r" \(after \d+ms in state [^)]*\)$")
_BROKER_ERROR = re.compile(r"^(\S+?)/\w+: (.*)$")
_CONNECT_FAILED = re.compile(r"^Connect to \S+ failed: ")


class _Fetcher:
    """The system's consumer and the thread that reads it (see the module docstring).

    Thread contract: the consumer is called from the fetch thread only (``consume``,
    ``pause``/``resume``, ``incremental_assign``, ``seek``, and ``commit``: other threads
    queue their commits, ``serve_commits``); bounded readers' ends come from the
    system's admin client on a thread of their own (``_query_ends``), applied by the
    fetch thread. Readers and the fetch thread share ``cond``. A reader's state
    (``_next``, its buffer) changes on the fetch thread, or under ``cond`` on the loop
    thread.
    """

    KEEP_POLLING_S = 1.0  # while every readable partition is full: consume at least this often
    CLOSE_PAST_DEADLINE_S = 1.0  # how long a close may take once the stop's deadline passed

    def __init__(self, system: KafkaSystem) -> None:
        self.system = system
        self.cond = threading.Condition()
        self.readers: dict[tuple[str, int], _KafkaReader] = {}
        self._pending: list[_Positioning] = []  # positions the fetch thread applies next
        self._commits: list[_Commit] = []  # group commits the fetch thread sends next
        self._inflight: list[_Commit] = []  # sent, waiting for their on_commit (fetch thread)
        self._paused: set[tuple[str, int]] = set()
        self._assigned: set[tuple[str, int]] = set()  # partitions in the consumer's assignment
        self._unpositioned: set[tuple[str, int]] = (
            set()
        )  # no position applied yet (group-assigned, or a reader waiting): paused, fed nothing
        self._ends: list[tuple[_KafkaReader, int, int]] = []  # (reader, low, high) to apply
        self._thread: threading.Thread | None = None
        self._stop = False
        self.error: BaseException | None = None
        self.consumer: Any = None
        self.subscription: (
            tuple[list[str], Callable[..., None], Callable[..., None], Callable[..., None]] | None
        ) = None

    # -- any thread ------------------------------------------------------------------
    def ensure_started(self) -> None:
        with self.cond:
            if self._thread is not None:
                return
            self.consumer = _kafka().Consumer(
                {**self.system.consumer_config(), "on_commit": self._on_commit, "logger": client_log}
            )
            if self.subscription is not None:
                topics, on_assign, on_revoke, on_lost = self.subscription
                self.consumer.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
            self._thread = threading.Thread(
                target=self._run, name=f"tailrace-kafka-read {self.system.name}", daemon=True
            )
            self._thread.start()

    def position(self, reader: _KafkaReader, offset: int) -> None:
        with self.cond:
            key = (reader.ssp.stream, reader.ssp.partition)
            self.readers[key] = reader
            self._unpositioned.add(key)  # fed nothing until the fetch thread applies the position
            self._pending.append(_Positioning(key[0], key[1], offset))
            self.cond.notify_all()

    def remove(self, reader: _KafkaReader) -> None:
        with self.cond:
            key = (reader.ssp.stream, reader.ssp.partition)
            if self.readers.get(key) is reader:
                del self.readers[key]
            self.cond.notify_all()

    def commit(self, tps: list[Any], *, wait: bool) -> None:
        """Commit ``tps`` to the group on the fetch thread (confluent-kafka serialises calls
        on one consumer, so a commit from another thread would wait for ``consume``).

        ``wait``: until the coordinator answers, raising its refusal (KafkaException);
        at most ``metadata_timeout_s + 30`` s, and no longer than the system's stop
        deadline once that is due (TimeoutError either way). The commit itself is
        asynchronous, so a coordinator that is gone never blocks the fetch thread:
        it goes on consuming, and so serves the group's callbacks (a lost partition)."""
        req = _Commit(tps, wait=wait)
        with self.cond:
            if self._thread is None or self._stop:
                return
            self._commits.append(req)
            self.cond.notify_all()
        if not wait:
            return
        limit = self.system.metadata_timeout_s + 30
        give_up = time.monotonic() + limit
        deadline = self.system.stop_deadline
        while not req.done.wait(0.05):
            if deadline is not None and deadline.due():
                raise TimeoutError(
                    f"the Kafka group did not answer the commit of {_tps_text(tps)} before the stop's "
                    f"deadline (task.shutdown.ms)"
                )
            if time.monotonic() > give_up:
                raise TimeoutError(
                    f"the Kafka group did not answer the commit of {_tps_text(tps)} within {limit:g} s"
                )
        if req.error is not None:
            raise req.error

    def serve_commits(self, *, in_callback: bool = False) -> None:
        """Send queued group commits (fetch thread: its loop, and rebalance callbacks).

        Asynchronous: the answer comes to ``_on_commit`` inside a later ``consume``.
        ``in_callback`` (a revoke callback that waits for the container's final commit):
        no ``consume`` can run until the callback returns, so each commit counts as
        answered at once, and so does every commit sent before the callback began. That
        fences nothing away: the partitions are this member's until the callback returns;
        a refusal that comes later is logged."""
        with self.cond:
            todo, self._commits = self._commits, []
            if in_callback:  # sent before the callback began: their answers cannot come until it returns
                answered, self._inflight = self._inflight, []
            else:
                answered = []
        for req in answered:
            req.done.set()
        for req in todo:
            try:
                self.consumer.commit(offsets=req.tps, asynchronous=True)
            except Exception as e:  # noqa: BLE001 - handed to the committer
                req.error = e
                req.done.set()
                log.debug("group commit of %s failed: %r", _tps_text(req.tps), e)
                continue
            if req.wait and not in_callback:
                with self.cond:
                    self._inflight.append(req)
            else:
                req.done.set()

    def _on_commit(self, err: Any, partitions: Sequence[Any] | None) -> None:
        """The coordinator's answer to a commit (inside ``consume`` or ``close``, on the
        thread that calls it): hand it to the request with the same offsets."""
        ck = _kafka()
        parts = list(partitions or ())
        error: BaseException | None = None
        if err is not None:
            error = ck.KafkaException(err)
        else:
            failed = next((tp.error for tp in parts if tp.error is not None), None)
            if failed is not None:
                error = ck.KafkaException(failed)
        key = frozenset((tp.topic, tp.partition, tp.offset) for tp in parts)
        with self.cond:
            req = next((r for r in self._inflight if r.key == key), None)
            if req is None and error is not None and not parts and self._inflight:
                req = self._inflight[0]  # an error without offsets: the oldest commit's
            if req is not None:
                self._inflight.remove(req)
        if req is None:
            if error is not None:  # a commit nobody waits for (a plain container's, a revoke's)
                log.warning("committing %s to the Kafka group failed: %s", _tps_text(parts), error)
            return
        req.error = error
        req.done.set()

    def _fail_commits(self, error: BaseException) -> None:
        """Answer every queued and unanswered commit with ``error``."""
        with self.cond:
            reqs, self._commits, self._inflight = self._commits + self._inflight, [], []
        for req in reqs:
            req.error = error
            req.done.set()

    def stop(self) -> None:
        with self.cond:
            self._stop = True
            t = self._thread
            self.cond.notify_all()
        if t is not None and t is not threading.current_thread():
            t.join(timeout=30)
        if self.consumer is not None:
            deadline = self.system.stop_deadline
            if deadline is None or not deadline.due():
                self._close()
            else:
                # librdkafka's close waits for every commit the coordinator has not answered,
                # and a coordinator that is gone answers none until the session times out:
                # past the stop's deadline the close gets a moment, then is left behind
                closer = threading.Thread(target=self._close, name="tailrace-kafka-close", daemon=True)
                closer.start()
                closer.join(self.CLOSE_PAST_DEADLINE_S)
                if closer.is_alive():
                    log.warning(
                        "the Kafka consumer of %s did not close within %g s of the stop's deadline (its "
                        "group coordinator does not answer); left behind, the group drops it when its "
                        "session times out",
                        self.system.name,
                        self.CLOSE_PAST_DEADLINE_S,
                    )
            self.consumer = None
        self._fail_commits(TimeoutError("the Kafka consumer closed before the group answered the commit"))

    def _close(self) -> None:
        try:
            self.consumer.close()  # leaves the group (a graceful leave, no session timeout)
        except Exception as e:  # noqa: BLE001 - closing is best effort
            log.warning("closing the Kafka consumer of %s failed: %r", self.system.name, e)

    # -- group callbacks (run on the fetch thread, inside consume) -------------------
    def group_assigned(self, partitions: Sequence[Any]) -> None:
        """Add group-assigned partitions, paused until a reader positions them."""
        if not partitions:
            return
        self.consumer.incremental_assign(list(partitions))
        self.consumer.pause(list(partitions))
        with self.cond:
            for tp in partitions:
                key = (tp.topic, tp.partition)
                self._assigned.add(key)
                self._unpositioned.add(key)
                self._paused.add(key)

    def group_revoked(self, partitions: Sequence[Any]) -> None:
        """Drop revoked partitions and whatever was buffered for them."""
        with self.cond:
            for tp in partitions:
                key = (tp.topic, tp.partition)
                self._assigned.discard(key)
                self._unpositioned.discard(key)
                self._paused.discard(key)
                self._pending = [p for p in self._pending if (p.topic, p.partition) != key]
                r = self.readers.pop(key, None)
                if r is not None:
                    r.drop_buffer()
        consumer = self.consumer  # (None once a close left behind past the stop's deadline goes on)
        if partitions and consumer is not None and consumer.assignment():
            consumer.incremental_unassign(list(partitions))

    # -- the fetch thread ------------------------------------------------------------
    def _apply_positions(self) -> None:
        ck = _kafka()
        with self.cond:
            todo, self._pending = self._pending, []
        ends: list[tuple[_KafkaReader, Any]] = []
        for p in todo:
            key = (p.topic, p.partition)
            with self.cond:
                reader = self.readers.get(key)
                if reader is not None:
                    reader.drop_buffer()  # anything buffered was read for an older position
            tp = ck.TopicPartition(p.topic, p.partition, p.offset)
            if key in self._assigned:
                # a fresh assignment at the offset (seek would need the fetcher started)
                self.consumer.incremental_unassign([ck.TopicPartition(p.topic, p.partition)])
            self.consumer.incremental_assign([tp])
            self.consumer.resume([ck.TopicPartition(p.topic, p.partition)])  # paused while unpositioned
            if self.system.bounded and reader is not None:
                ends.append((reader, ck.TopicPartition(p.topic, p.partition)))
            with self.cond:
                self._assigned.add(key)
                self._unpositioned.discard(key)
                self._paused.discard(key)
        if ends:  # broker round trips: off this thread (which reads on meanwhile), all at once
            threading.Thread(
                target=self._query_ends, args=(ends,), name="tailrace-kafka-ends", daemon=True
            ).start()

    def _query_ends(self, ends: list[tuple[_KafkaReader, Any]]) -> None:
        """Bounded readers' ends, by the system's admin client (a consumer's calls wait for
        each other): handed to the fetch thread to apply."""
        try:
            marks = self.system.watermarks([tp for _, tp in ends])
        except BaseException as e:  # noqa: BLE001 - the readers report it
            with self.cond:
                if self.error is None:
                    self.error = e
            for reader, _ in ends:
                reader.wake()
            return
        with self.cond:
            for reader, tp in ends:
                low, high = marks[tp.topic, tp.partition]
                self._ends.append((reader, low, high))
            self.cond.notify_all()

    def _apply_ends(self) -> None:
        with self.cond:
            todo, self._ends = self._ends, []
            todo = [t for t in todo if self.readers.get((t[0].ssp.stream, t[0].ssp.partition)) is t[0]]
        for reader, low, high in todo:
            reader._next = max(reader._next, low)  # (offsets before low were deleted)
            if reader._from_end:  # start = "latest": it starts at that end, with nothing to read
                reader._next = max(reader._next, high)
            reader.deliver([], ended_at=high)

    def _flow_control(self, consume_due: bool) -> bool:
        """Pause and resume partitions (see the module docstring); True when this round
        should not consume: every readable partition is full, or one is past twice its
        buffer while every other still has a batch to work on (a pause would purge what
        librdkafka prefetched for it; a starving partition reads on, and the full one is
        paused at four times its buffer). ``consume_due`` (the group must see a poll):
        pause what is past twice its buffer and consume."""
        ck = _kafka()
        pause: list[Any] = []
        resume: list[Any] = []
        over: list[tuple[str, int]] = []
        readable = 0
        room = starving = False
        with self.cond:
            for key in self._assigned:
                reader = self.readers.get(key)
                if key in self._paused:
                    if key not in self._unpositioned and reader is not None and reader.has_room():
                        self._paused.discard(key)
                        resume.append(ck.TopicPartition(*key))
                        readable += 1
                        room = True
                        starving = starving or reader.starving()
                    continue
                if key in self._unpositioned or reader is None or reader.at_limit():
                    self._paused.add(key)
                    pause.append(ck.TopicPartition(*key))
                    continue
                if reader.over_limit():
                    over.append(key)
                    continue
                readable += 1
                room = room or reader.has_room()
                starving = starving or reader.starving()
            if over and consume_due:
                for key in over:
                    self._paused.add(key)
                    pause.append(ck.TopicPartition(*key))
                over = []
        if pause:
            self.consumer.pause(pause)
        if resume:
            self.consumer.resume(resume)
        return not consume_due and ((bool(over) and not starving) or (readable > 0 and not room))

    def deliver(self, by_key: Mapping[tuple[str, int], list[Any]]) -> None:
        """Hand each partition's messages of a consumed batch to its reader (fetch thread).

        A partition without a reader (revoked), or whose reader's position is not applied
        yet, keeps nothing: it is read again from that position. Decided under the lock
        that ``position`` takes, so a reader registered meanwhile gets nothing of a batch
        fetched from the partition's previous position (which would leave a gap)."""
        with self.cond:
            targets = [
                (r, ms)
                for k, ms in by_key.items()
                if (r := self.readers.get(k)) is not None and k not in self._unpositioned
            ]
        for reader, ms in targets:
            reader.deliver(ms)

    def _run(self) -> None:
        system = self.system
        ck = _kafka()
        eof = ck.KafkaError._PARTITION_EOF
        timeout = system.poll_ms / 1000
        consumed_at = time.monotonic()
        try:
            while True:
                with self.cond:
                    if self._stop:
                        return
                if self._commits:
                    self.serve_commits()
                if self._pending:
                    self._apply_positions()
                if self._ends:
                    self._apply_ends()
                # a group member consumes every round: consume serves the group's rebalance
                # callbacks, and a member that held back would slow every rebalance down
                due = self.subscription is not None or time.monotonic() - consumed_at >= self.KEEP_POLLING_S
                hold = self._flow_control(due)
                if not self._assigned and self.subscription is None:
                    with self.cond:
                        if not self._pending and not self._stop:
                            self.cond.wait(timeout)
                    continue
                if hold:
                    with self.cond:  # a reader's poll wakes this (room again, or starving)
                        if not (self._stop or self._pending or self._commits or self._ends):
                            self.cond.wait(timeout)
                    continue
                consumed_at = time.monotonic()
                messages = self.consumer.consume(system.batch, timeout)
                if not messages:
                    continue
                by_key, errors = kafka_split(messages)  # compiled (_kafkain.pxi)
                for m in errors:
                    err = m.error()
                    if err.code() == eof:
                        continue
                    if err.fatal():
                        raise ck.KafkaException(err)
                    # librdkafka recovers from the rest itself (a group rebalance in
                    # progress, a broker gone for a while): reported, never fatal here
                    log.warning("%s: %s", system.name, err)
                self.deliver(by_key)
        except BaseException as e:  # noqa: BLE001 - handed to every reader's poll()
            log.error("reading from Kafka (%s) failed: %r", system.name, e)
            with self.cond:
                self.error = e
                failed = list(self.readers.values())
            self._fail_commits(e)
            for r in failed:
                r.wake()


class _KafkaReader(BufferedPartition):
    """One partition's bounded buffer, filled by its system's fetch thread (chunks: lists of
    envelopes, as delivered)."""

    def __init__(self, system: KafkaSystem, ssp: SystemStreamPartition, fetcher: _Fetcher) -> None:
        super().__init__(ssp, fetcher.cond, system.buffer, system.batch)
        self._system = system
        self._fetcher = fetcher
        self._ended_at: int | None = None  # with ``bounded``: the partition's end when positioned
        self._from_end = False  # positioned at the partition's end (start = "latest", no checkpoint)
        self._next = 0  # offset the next delivered message must have at least
        self._decode_key: Callable[[bytes], Any] = system.key_serde.decode
        self._decode_value: Callable[[bytes], Any] = system.value_serde.decode
        self._key_kind = _DECODE_KINDS.get(system.key_serde.name, _CALL)
        self._value_kind = _DECODE_KINDS.get(system.value_serde.name, _CALL)

    def start(self, after: Offset | None, wakeup: Callable[[], None]) -> None:
        ck = _kafka()
        if after is None:
            offset = ck.OFFSET_BEGINNING if self._system.start == "earliest" else ck.OFFSET_END
        else:
            if not isinstance(after, int) or isinstance(after, bool) or after < 0:
                raise InputError(f"committed offset {after!r} is not a Kafka offset", source=str(self.ssp))
            offset = after + 1
        self._next = max(offset, 0)
        self._from_end = offset == ck.OFFSET_END
        self._wakeup = wakeup
        self._fetcher.ensure_started()
        self._fetcher.position(self, offset)

    # -- fetch thread ------------------------------------------------------------------
    def has_room(self) -> bool:
        """Room for another whole batch (lock held)."""
        return self._capacity - self._count >= self._batch

    def over_limit(self) -> bool:
        """No room for another whole batch within twice the buffer (lock held)."""
        return 2 * self._capacity - self._count < self._batch

    def at_limit(self) -> bool:
        """No room for another whole batch within four times the buffer: pause whatever the
        other partitions need (lock held)."""
        return 4 * self._capacity - self._count < self._batch

    def starving(self) -> bool:
        """Less than a batch left for the engine (lock held)."""
        return self._count < self._batch

    def drop_buffer(self) -> None:
        """Forget what is buffered (lock held): the partition is being repositioned or revoked."""
        self._chunks.clear()
        self._head = 0
        self._count = 0
        self._ended_at = None

    def wake(self) -> None:
        self._wakeup()

    def deliver(self, messages: list[Any], ended_at: int | None = None) -> None:
        """Buffer the envelopes of a consumed batch of this partition (fetch thread). A
        record whose key or value cannot be decoded keeps its place as an envelope whose
        message is a BadInput (rule 39); decoding goes on with the next records."""
        s = self.ssp
        out: list[Envelope] = []
        headers = self._system.headers
        dk = self._decode_key
        dv = self._decode_value
        if not headers:  # compiled: decode and build every envelope of the batch (_kafkain.pxi)
            self._next = kafka_envelopes(
                messages,
                self._next,
                self._key_kind,
                dk,
                self._value_kind,
                dv,
                s.system,
                s.stream,
                s.partition,
                out,
                self._bad_record,
            )
        else:
            for m in messages:
                off = m.offset()
                if off < self._next:
                    continue  # fetched before a reposition (librdkafka filters these too)
                k = m.key()
                v = m.value()
                field = "key"
                try:
                    key = None if k is None else dk(k)
                    field = "value"
                    value = None if v is None else dv(v)
                except (ValueError, TypeError, RecursionError) as e:  # SerdeError included
                    bad = self._bad_record(off, field, e, v)
                    out.append(Envelope(s.system, s.stream, s.partition, off, None, bad))
                    self._next = off + 1
                    continue
                ts_type, ts = m.timestamp()
                stamp = ts if ts_type and ts >= 0 else None  # the record's time (rule 32)
                value = KafkaRecord(value, list(m.headers() or ()), stamp)
                out.append(Envelope(s.system, s.stream, s.partition, off, key, value, stamp))
                self._next = off + 1
        with self._cond:
            if out:
                self._append(out, len(out))
            if ended_at is not None:
                self._ended_at = ended_at
            wake = self._arrived(bool(out) or ended_at is not None)
        if wake:
            self._wakeup()

    def _bad_record(self, offset: int, field: str, cause: BaseException, value: bytes | None) -> BadInput:
        """The message of a record whose key or value cannot be decoded: a BadInput naming
        partition, offset and serdes, holding the record's value bytes."""
        system = self._system
        error = InputError(
            f"offset {offset} cannot be decoded (key serde {system.key_serde.name!r}, value serde "
            f"{system.value_serde.name!r}): its {field}: {cause}; set task.error.policy to skip or "
            "dead-letter to go on past records that cannot be read",
            source=str(self.ssp),
        )
        error.__cause__ = cause
        return BadInput(error, value if isinstance(value, bytes) else None)

    # -- poll's steps (loop thread, BufferedPartition.poll) ---------------------------
    def _raise_failure(self) -> None:
        if self._fetcher.error is not None:
            err = self._fetcher.error
            raise InputError(f"reading from Kafka failed: {err!r}", source=str(self.ssp)) from err

    def _take_out(self, max_messages: int) -> list[Envelope]:
        chunks = self._chunks
        if self._head == 0 and len(chunks[0]) <= max_messages:
            out = chunks.popleft()  # the common case: hand over a whole batch as it is
        else:
            out = []
            taken, _ = self._take(max_messages, len)
            for chunk, first, end in taken:
                out += chunk[first:end]
        # a fetch thread holding back may read on (room again, or this reader starving)
        self._took(len(out), notify_starving=True)
        return out

    def _envelopes(self, taken: list[Envelope]) -> list[Any]:
        return taken

    def at_end(self) -> bool:
        with self._cond:
            return self._ended_at is not None and self._next >= self._ended_at and self._count == 0

    def close(self) -> None:
        self._fetcher.remove(self)


class _KafkaProducer(Producer):
    """The system's producer: ``send`` is thread-safe (confluent-kafka's producer is)."""

    POLL_EVERY = 1000  # sends between two poll(0) calls serving delivery reports

    def __init__(self, system: KafkaSystem) -> None:
        self._system = system
        self._producer: Any = _kafka().Producer(
            {**system.producer_config(), "error_cb": self._on_error, "logger": client_log}
        )
        self._encode_key = system.key_serde.encode
        self._encode_value = system.value_serde.encode
        self._partitions = PartitionCounts(system.topic_partitions)
        self._failed: KafkaDeliveryError | None = None
        self._lock = threading.Lock()
        self._sends = 0
        self.delivered = 0

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self.delivered += 1
            return
        with self._lock:
            if self._failed is None:
                self._failed = KafkaDeliveryError(
                    f"delivery to {msg.topic()}[{msg.partition()}] failed: {err}",
                    topic=msg.topic(),
                    partition=msg.partition(),
                )
                log.error("%s", self._failed)

    def _on_error(self, err: Any) -> None:
        if not err.fatal():
            client_log.warning("%s producer: %s", self._system.name, err)
            return
        with self._lock:  # a fatal error (say, idempotence broken by the broker): nothing more is delivered
            if self._failed is None:
                self._failed = KafkaDeliveryError(
                    f"the producer of {self._system.name} failed: {err}", topic="", partition=-1
                )
                log.error("%s", self._failed)

    def partitions(self, stream: str) -> int:
        return self._partitions[stream]

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        value = None if message is None else self._encode_value(message)
        k = None if key is None else self._encode_key(key)
        self.send_encoded(stream, partition, k, value)

    def send_encoded(self, stream: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        """``send`` of a key and value already encoded (``tailrace replay``: a dead letter's
        original bytes go to Kafka as they were read)."""
        if self._failed is not None:
            raise self._failed
        produce = self._producer.produce
        while True:
            try:
                produce(stream, value, key, partition, on_delivery=self._on_delivery)
                break
            except BufferError:
                # the local queue is full (queue.buffering.max.messages/kbytes): serve
                # delivery reports until there is room (rule 24: wait, never drop)
                self._producer.poll(0.05)
                if self._failed is not None:
                    raise self._failed from None
                self._check_deadline()
            except _kafka().KafkaException as e:  # refused at once: too large, unknown partition, ...
                raise KafkaDeliveryError(
                    f"producing to {stream}[{partition}] failed: {e.args[0] if e.args else e}",
                    topic=stream,
                    partition=partition,
                ) from e
        self._sends += 1
        if self._sends % self.POLL_EVERY == 0:
            self._producer.poll(0)

    def hold(self, task_name: str, store: CheckpointStore) -> HeldProducer:
        """Refused (rule 41): exactly-once Kafka outputs need a transactional producer whose
        transaction commits the job's offsets with it (``send_offsets_to_transaction``),
        which tailrace does not drive; see docs/outputs.md."""
        raise ConfigError(
            f"Kafka system {self._system.name!r} cannot give exactly-once outputs: that needs a "
            "transactional producer whose transaction also commits the job's offsets (Kafka "
            "transactions with send_offsets_to_transaction), which tailrace does not implement; "
            "use at-least-once (readers dedupe by key), or write exactly-once outputs to files or "
            "a standalone Redis",
            key="task.output.guarantee",
            allowed="at-least-once with a Kafka system in the job",
        )

    def flush(self) -> None:
        """Wait until Kafka acknowledged everything sent so far (rule 21); raise the first
        failed delivery, or, once the system's stop deadline is due, give up."""
        while self._failed is None and self._producer.flush(0.1) > 0:
            self._check_deadline()
        if self._failed is not None:
            raise self._failed

    def pending(self) -> int:
        """Messages sent and not acknowledged by Kafka yet."""
        return len(self._producer)

    def _check_deadline(self) -> None:
        deadline = self._system.stop_deadline
        if deadline is not None and deadline.due():
            n = self.pending()
            raise KafkaDeliveryError(
                f"{n} message{'s' if n != 1 else ''} sent to Kafka by {self._system.name} not "
                "acknowledged before the stop's deadline (task.shutdown.ms)",
                topic="",
                partition=-1,
            )

    def close(self) -> None:
        try:
            deadline = self._system.stop_deadline
            if deadline is not None and deadline.due():  # the final commit gave up already (and said so)
                self._system.unsent_at_close += self.pending()
                return
            self.flush()
        finally:
            producers = self._system._producers
            if self in producers:
                producers.remove(self)


class KafkaSystem(System):
    """Kafka topics as partitioned inputs and outputs.

    ``bootstrap_servers``: the brokers (``host:port,...``). ``config``: librdkafka
    settings for both clients (``security.protocol``, ``sasl.*``, ...);
    ``consumer`` and ``producer``: settings for one of them only (they win over
    ``config``). ``key_serde`` / ``value_serde``: names from :mod:`tailrace.serdes`
    (``json``, ``str``, ``bytes``, ``int``, ``msgpack``, ``pickle``). ``headers``:
    envelopes carry a :class:`KafkaRecord` (see the module docstring). ``start``:
    where a partition that never committed starts, ``earliest`` (default) or
    ``latest``. ``bounded``: a partition ends (rule 11) at the end it had when the
    reader started (its high watermark then: batch jobs, tests, benchmarks). ``group_id``: the consumer
    group (default: the job name when run by a member, else ``tailrace``).
    ``batch``: messages per ``consume`` call; ``buffer``: messages read ahead per
    partition (a burst may take up to four times it before the partition is paused,
    see the module docstring); ``poll_ms``: longest ``consume`` wait.

    The keyword arguments are also the options of a job file's ``[systems.NAME]``
    table with ``type = "kafka"``.
    """

    @options_checked
    def __init__(
        self,
        name: str = "kafka",
        bootstrap_servers: str = "localhost:9092",
        *,
        config: Mapping[str, Any] | None = None,
        consumer: Mapping[str, Any] | None = None,
        producer: Mapping[str, Any] | None = None,
        key_serde: str = "str",
        value_serde: str = "json",
        headers: bool = False,
        start: str = "earliest",
        bounded: bool = False,
        group_id: str | None = None,
        batch: int = 500,
        buffer: int = 4000,
        poll_ms: int = 100,
        metadata_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(name)
        _kafka()
        for key, value in (("batch", batch), ("buffer", buffer), ("poll_ms", poll_ms)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"expected an integer >= 1, got {value!r}", key=key)
        if start not in ("earliest", "latest"):
            raise ConfigError(f"unknown start {start!r}", key="start", allowed="earliest, latest")
        for key, flag in (("headers", headers), ("bounded", bounded)):
            if not isinstance(flag, bool):
                raise ConfigError(f"expected true or false, got {flag!r}", key=key)
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
            raise ConfigError(
                f"expected host:port[,host:port...], got {bootstrap_servers!r}", key="bootstrap_servers"
            )
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ConfigError(f"expected a group name, got {group_id!r}", key="group_id")
        if (
            not isinstance(metadata_timeout_s, (int, float))
            or isinstance(metadata_timeout_s, bool)
            or not metadata_timeout_s > 0
        ):
            raise ConfigError(
                f"expected a number of seconds > 0, got {metadata_timeout_s!r}", key="metadata_timeout_s"
            )
        for key, table in (("config", config), ("consumer", consumer), ("producer", producer)):
            if table is not None and not isinstance(table, Mapping):
                raise ConfigError(f"expected a table of librdkafka settings, got {table!r}", key=key)
        self.key_serde: Serde = _serde(key_serde, "key_serde")
        self.value_serde: Serde = _serde(value_serde, "value_serde")
        self.bootstrap_servers = bootstrap_servers
        self.config = dict(config or {})
        self.consumer_settings = dict(consumer or {})
        self.producer_settings = dict(producer or {})
        self.headers = headers
        self.start = start
        self.bounded = bounded
        self.group_id = group_id
        self.batch = batch
        self.buffer = max(buffer, batch)
        self.poll_ms = poll_ms
        self.metadata_timeout_s = metadata_timeout_s
        self.keep_open = False  # a member keeps the consumer across its containers
        self.stop_deadline: StopDeadline | None = None
        self._producers: list[_KafkaProducer] = []  # open ones
        self.unsent_at_close = 0  # messages producers closed with, unacknowledged (a stop gave up)
        self._fetcher = _Fetcher(self)
        self._partitions: dict[str, int] = {}
        self._check_client_settings()

    # -- client settings -----------------------------------------------------------
    def consumer_config(self) -> dict[str, Any]:
        """The consumer's librdkafka settings: defaults, then ``config``, then ``consumer``."""
        cfg: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id or "tailrace",
            "enable.auto.commit": False,  # commits follow the low watermark only
            "enable.auto.offset.store": False,
            "auto.offset.reset": self.start,
            "partition.assignment.strategy": "cooperative-sticky",
        }
        cfg.update(self.config)
        cfg.update(self.consumer_settings)
        if not _is_false(cfg["enable.auto.commit"]):
            raise ConfigError(
                "tailrace commits the low watermark itself; auto commit would commit unfinished work",
                key=self._setting_key("enable.auto.commit", consumer=True),
                allowed="false",
            )
        return cfg

    def _setting_source(self, name: str, *, consumer: bool) -> str | None:
        """Which of the system's tables set librdkafka setting ``name``: ``"consumer"``
        (or ``"producer"``), ``"config"``, or None when none did."""
        table = "consumer" if consumer else "producer"
        if name in (self.consumer_settings if consumer else self.producer_settings):
            return table
        return "config" if name in self.config else None

    def _setting_key(self, name: str, *, consumer: bool) -> str:
        """The table a librdkafka setting came from, as a config key: ``consumer.NAME``,
        ``producer.NAME`` or ``systems.SYSTEM.config.NAME`` (in full: a bare ``config.NAME``
        would read as the job's [config] table); the client's table alone when none has it
        (librdkafka names an alias by its canonical name: linger.ms as queue.buffering.max.ms)."""
        source = self._setting_source(name, consumer=consumer)
        if source is None:
            return "consumer" if consumer else "producer"
        return f"systems.{self.name}.config.{name}" if source == "config" else f"{source}.{name}"

    def setting_table(self, name: str, *, consumer: bool) -> str | None:
        """The job-file table that set librdkafka setting ``name`` (``systems.SYSTEM.consumer``,
        ``systems.SYSTEM.producer`` or ``systems.SYSTEM.config``), or None when none did."""
        source = self._setting_source(name, consumer=consumer)
        return None if source is None else f"systems.{self.name}.{source}"

    def _check_client_settings(self) -> None:
        """librdkafka's verdict on the settings, now rather than when a client first starts
        (a producer starts only once a container runs): a client of each kind is made and
        dropped at once (a few ms), and a setting it refuses is a ConfigError naming it and its
        table. Their log lines go to DEBUG: a consumer starts connecting at once, and its close
        may log that the connection failed, about a client that was never meant to connect."""
        ck = _kafka()
        held = _HeldLog()
        for consumer in (True, False):
            cfg = {**(self.consumer_config() if consumer else self.producer_config()), "logger": held}
            try:
                client = ck.Consumer(cfg) if consumer else ck.Producer(cfg)
            except ck.KafkaException as e:
                text = e.args[0].str() if e.args and isinstance(e.args[0], ck.KafkaError) else str(e)
                m = re.search(r'"([\w.]+)"', text)  # the setting, quoted in librdkafka's message
                key = (
                    self._setting_key(m.group(1), consumer=consumer)
                    if m
                    else ("consumer" if consumer else "producer")
                )
                raise ConfigError(f"librdkafka refuses it: {text}", key=key) from None
            if consumer:
                client.close()
        held.release(logging.DEBUG)

    def producer_config(self) -> dict[str, Any]:
        """The producer's librdkafka settings: defaults, then ``config``, then ``producer``."""
        cfg: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
        cfg.update(self.config)
        cfg.update(self.producer_settings)
        return cfg

    # -- metadata ------------------------------------------------------------------
    @contextlib.contextmanager
    def _admin_client(self, logger: Any = client_log, **callbacks: Any) -> Iterator[Any]:
        """A fresh admin client for one metadata query (they are rare: a topic's partition
        count once, a bounded reader's end when it starts), dropped after it: one kept
        idle would go on reconnecting to a broker that is down for as long as it is. Its
        log lines reach ``logger`` (and its errors an ``error_cb`` in ``callbacks``) only
        through ``poll``, called once it is done."""
        base = {k: v for k, v in self.producer_config().items() if k not in _PRODUCER_ONLY}
        admin = _kafka().admin.AdminClient({**base, "logger": logger, **callbacks})
        try:
            yield admin
        finally:
            admin.poll(0)

    def watermarks(self, tps: Sequence[Any]) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, partition) -> (low, high) watermark offsets of ``tps``, in two requests."""
        ck = _kafka()
        timeout = self.metadata_timeout_s
        specs = {"low": ck.admin.OffsetSpec.earliest(), "high": ck.admin.OffsetSpec.latest()}
        found: dict[str, dict[tuple[str, int], int]] = {}
        with self._admin_client() as admin:
            for which, spec in specs.items():
                plain = [ck.TopicPartition(tp.topic, tp.partition) for tp in tps]
                futures = admin.list_offsets({tp: spec for tp in plain}, request_timeout=timeout)
                found[which] = {
                    (t.topic, t.partition): f.result(timeout + 5).offset for t, f in futures.items()
                }
        return {key: (found["low"][key], found["high"][key]) for key in found["high"]}

    def topic_partitions(self, topic: str) -> int:
        """Partition count of ``topic`` from the cluster's metadata (InputError when unknown)."""
        n = self._partitions.get(topic)
        if n is not None:
            return n
        ck = _kafka()
        held, brokers = _HeldLog(), _BrokerErrors()
        try:
            with self._admin_client(held, error_cb=brokers) as admin:
                md = self._metadata(admin, topic, brokers)
        except ck.KafkaException as e:
            held.release(logging.DEBUG)  # the error's one line says what they say, once
            raise InputError(self._no_metadata(e, brokers), source=f"{self.name}.{topic}") from e
        held.release()
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            why = t.error if t is not None else "not in the metadata"
            raise InputError(
                f"Kafka at {self.bootstrap_servers} has no topic {topic!r} ({why})",
                source=f"{self.name}.{topic}",
            )
        self._partitions[topic] = len(t.partitions)
        return len(t.partitions)

    def _metadata(self, admin: Any, topic: str, brokers: _BrokerErrors) -> Any:
        """``admin.list_topics(topic)``, given up as soon as librdkafka finds every broker
        down (its ``error_cb``, served by ``poll`` between tries of growing length) rather
        than at ``metadata_timeout_s``: a refused connection or a name that does not resolve
        is known within a fraction of a second. Raises the last try's KafkaException."""
        ck = _kafka()
        retry = (ck.KafkaError._TRANSPORT, ck.KafkaError._TIMED_OUT)
        deadline = time.monotonic() + self.metadata_timeout_s
        step = 0.05
        while True:
            try:
                return admin.list_topics(topic, timeout=max(min(step, deadline - time.monotonic()), 0.001))
            except ck.KafkaException as e:
                admin.poll(0)
                code = e.args[0].code() if e.args and isinstance(e.args[0], ck.KafkaError) else None
                if brokers.all_down or code not in retry or time.monotonic() >= deadline:
                    raise
            step = min(step * 2, 1.0)

    def _no_metadata(self, e: Any, brokers: _BrokerErrors) -> str:
        """One line for a metadata query that failed: the brokers, why, what to check."""
        ck = _kafka()
        check = (
            f"check that the brokers run and this machine reaches them, and that "
            f"systems.{self.name}.bootstrap_servers names their host:port"
        )
        why = brokers.text()
        if brokers.all_down:
            return f"Kafka at {self.bootstrap_servers} is unreachable ({why}); {check}"
        error = e.args[0].str() if e.args and isinstance(e.args[0], ck.KafkaError) else str(e)
        why = f"{error}; {why}" if why else error
        within = f"within {self.metadata_timeout_s} s"
        return f"no metadata from Kafka at {self.bootstrap_servers} {within} ({why}); {check}"

    # -- tailrace interface ----------------------------------------------------------
    def partitions(self, stream: str) -> int:
        return self.topic_partitions(stream)

    def reader(self, ssp: SystemStreamPartition) -> PartitionReader:
        n = self.partitions(ssp.stream)
        if not 0 <= ssp.partition < n:
            raise InputError(f"topic has {n} partitions, no partition {ssp.partition}", source=str(ssp))
        return _KafkaReader(self, ssp, self._fetcher)

    def producer(self) -> Producer:
        p = _KafkaProducer(self)
        self._producers.append(p)
        return p

    def use_stop_deadline(self, deadline: StopDeadline) -> None:
        """Bound a graceful stop (a member's ``task.shutdown.ms``): once ``deadline`` is
        due, a producer's flush and a group commit that still wait for Kafka give up."""
        self.stop_deadline = deadline

    def unacknowledged(self) -> int:
        """Messages its producers sent that Kafka has not acknowledged yet."""
        return self.unsent_at_close + sum(p.pending() for p in self._producers)

    @property
    def fetcher(self) -> _Fetcher:
        return self._fetcher

    def commit_group(self, offsets: Mapping[SystemStreamPartition, Offset]) -> None:
        """Commit low watermarks to the Kafka group as ``offset + 1``.

        Raises KafkaException on failure (ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID when
        this consumer is no longer a member of the current generation)."""
        consumer = self._fetcher.consumer
        if consumer is None:
            return
        ck = _kafka()
        tps = [
            ck.TopicPartition(s.stream, s.partition, int(o) + 1)
            for s, o in offsets.items()
            if s.system == self.name
        ]
        if tps:
            # a member waits for the coordinator's answer (it fences a stale member); a plain
            # container is no group member, so its commit only feeds lag tools: fire and forget
            self._fetcher.commit(tps, wait=self._fetcher.subscription is not None)

    def close(self) -> None:
        if self.keep_open:
            return
        self.shutdown()

    def shutdown(self) -> None:
        """Close the consumer (leaving the group) and release everything. Idempotent."""
        self._fetcher.stop()
        self._fetcher = _Fetcher(self)


_PRODUCER_ONLY = ("acks", "enable.idempotence", "linger.ms")


def _serde(name: str, key: str) -> Serde:
    try:
        return serde(name)
    except SerdeError as e:
        raise ConfigError(str(e), key=key) from None


def _is_false(value: Any) -> bool:
    """A librdkafka boolean that reads as false (librdkafka takes true, t, 1, yes, y, on, any case)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value == 0
    return isinstance(value, str) and value.strip().lower() in ("false", "f", "0", "no", "n", "off")


def _tps_text(tps: Sequence[Any]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in tps)


__all__ = ["KafkaDeliveryError", "KafkaRecord", "KafkaSystem"]
