"""Redis Streams as a tailrace system: one Redis stream per partition.

Partition ``p`` of stream ``s`` is the Redis stream ``PREFIX:{s:p}:s`` (see
``tailrace.redis._io`` for the whole key layout); offsets are entry ids
(``"1700000000000-0"``), compared as (ms, seq). An entry holds the message in
field ``m`` and the key, when there is one, in field ``k``, both encoded by the
system's codec (``json``, ``str``, ``bytes`` or ``msgpack``; json and msgpack by
tailrace.serdes). An entry with field ``eos``
marks the end of a partition: readers stop there and it is never processed.

Readers read ahead into bounded per-partition buffers: one thread per system
reads every partition with room for a batch in one ``XREAD COUNT batch BLOCK``
(on a cluster, one thread per partition). Producers buffer entries and append
them with one Lua script call (a loop of ``XADD``) per ``batch`` messages or on
``flush()``, covering every partition on a standalone server; ``flush()`` returns
only once Redis acknowledged every entry (durable on disk when the server runs
with ``appendfsync always``). While Redis is unreachable both retry with
backoff; nothing is lost or skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from .._core import entry_envelope
from .._stopping import StopDeadline
from ..buffered import BufferedPartition
from ..config import options_checked
from ..errors import ConfigError, InputError
from ..interfaces import (
    CheckpointStore,
    CommitOutputs,
    HandedRecords,
    HeldProducer,
    PartitionCounts,
    PartitionReader,
    Producer,
    System,
    Write,
)
from ..serdes import SerdeError, _json_encode, serde
from ..types import BadInput, Offset, SystemStreamPartition
from . import _resp
from ._io import (
    DEFAULT_URL,
    Keys,
    RespConnection,
    Scripts,
    abort_client,
    check,
    connect,
    connection_errors,
    entry_id,
    redact,
    retrying,
    text,
)
from ._io import _redis as _redis_module

log = logging.getLogger("tailrace.redis")

EOS_FIELD = b"eos"
CODECS = ("json", "str", "bytes", "msgpack")
# codec -> _resp kind; json and msgpack are tailrace.serdes' (json: its compiled codec)
_KINDS = {"json": _resp.CALL, "str": _resp.STR, "bytes": _resp.BYTES, "msgpack": _resp.CALL}

# One XREAD batch of one partition: (stream key, ids, keys, messages, end marker
# reached, (index, field) of each entry that cannot be decoded or None). Such an entry
# keeps its place: key None, message a BadInput of the decoder's exception and the bytes
# of its field m (the reader names the entry, partition and codec in it: deliver).
_Decoded = tuple[bytes, list[str], list[Any], list[Any], bool, "list[tuple[int, str]] | None"]
_DECODE_ERRORS = (ValueError, TypeError, RecursionError)  # SerdeError, UnicodeDecodeError included


def _encoder(codec: str) -> Callable[[Any], bytes | str]:
    if codec == "json":
        return _json_encode  # the raw function: a value JSON cannot take raises TypeError
    if codec == "msgpack":
        packer = serde(codec)

        def encode(v: Any) -> bytes:
            try:
                return packer.encode(v)
            except SerdeError as e:  # the producer's contract: an unencodable value is a TypeError
                raise TypeError(str(e)) from e

        return encode
    if codec == "str":
        return lambda v: v if isinstance(v, (str, bytes)) else str(v)
    return lambda v: v if isinstance(v, bytes) else str(v).encode()


def _decoder(codec: str) -> Callable[[bytes], Any]:
    if codec in ("json", "msgpack"):
        return serde(codec).decode
    if codec == "str":
        return lambda b: b.decode()
    return lambda b: b


def _decode_reply(reply: Any, decode: Callable[[bytes], Any]) -> list[_Decoded]:
    """An XREAD reply parsed by redis-py (a list in RESP2, a map in RESP3) decoded as
    ``_resp.Replies.xread`` decodes raw replies (the path without RespConnection)."""
    if not reply:
        return []
    out: list[_Decoded] = []
    for raw_key, entries in reply.items() if isinstance(reply, dict) else reply:
        key = raw_key if type(raw_key) is bytes else str(raw_key).encode()
        ids: list[str] = []
        keys: list[Any] = []
        messages: list[Any] = []
        eos = False
        bad: list[tuple[int, str]] | None = None
        for raw_id, fields in entries:
            eid = text(raw_id)
            f = fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2]))
            if EOS_FIELD in f:
                eos = True
                break
            raw_message = f.get(b"m")
            cause: BaseException | None = None
            field = "m"
            if raw_message is None or (not isinstance(fields, dict) and len(fields) % 2):
                cause = KeyError(b"m")
            else:
                try:
                    field = "k"
                    raw_key = f.get(b"k")
                    k = None if raw_key is None else decode(raw_key)
                    field = "m"
                    message = decode(raw_message)
                except _DECODE_ERRORS as e:
                    cause = e
            if cause is not None:  # the entry keeps its place (rule 39)
                k = None
                message = BadInput(cause, raw_message)
                if bad is None:
                    bad = []
                bad.append((len(ids), field))
            ids.append(eid)
            keys.append(k)
            messages.append(message)
        out.append((key, ids, keys, messages, eos, bad))
    return out


class _Fetcher:
    """Reads for a set of readers on one thread.

    Every round is one ``XREAD COUNT batch BLOCK block_ms STREAMS ...`` over each
    reader with room for a whole batch, so a container costs one reading thread per
    system, not one per partition. On a standalone server the fetcher holds its own
    connection (a ``RespConnection`` unless TLS or a credential provider needs
    redis-py's) and decodes the reply from the socket's bytes straight into the
    readers' lists (``tailrace.redis._resp``); on a cluster each reader gets its own
    fetcher (keys of different slots cannot share an XREAD). While some reader
    is left out because its buffer is full, the round blocks for at most 5 ms,
    so a reader that makes room is read again promptly. The readers share the
    fetcher's lock.
    """

    FULL_BLOCK_MS = 5

    def __init__(self, system: RedisSystem) -> None:
        self.system = system
        self.cond = threading.Condition()
        self.readers: dict[bytes, _RedisReader] = {}
        self._thread: threading.Thread | None = None
        self._raw = hasattr(system.client, "connection_pool")
        self._params = RespConnection.usable_for(system.client) if self._raw else None
        self._kind = _KINDS[system.codec]
        self._decode = _decoder(system.codec)
        self._conns: list[Any] = []  # the reading thread's own connection, made on first use

    def abort(self) -> None:
        """Fail a read blocked on an unresponsive Redis at once (any thread)."""
        for conn in list(self._conns):
            if isinstance(conn, RespConnection):
                conn.abort()
            else:
                conn.disconnect()

    def add(self, reader: _RedisReader) -> None:
        with self.cond:
            self.readers[reader.wire_key] = reader
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"tailrace-redis-read {self.system.name}", daemon=True
                )
                self._thread.start()
            self.cond.notify_all()

    def remove(self, reader: _RedisReader) -> None:
        with self.cond:
            if self.readers.get(reader.wire_key) is reader:
                del self.readers[reader.wire_key]
            t = self._thread
            self.cond.notify_all()
        if not self.readers and t is not None and t is not threading.current_thread():
            t.join(timeout=self.system.block_ms / 1000 + 5)

    def _xread(
        self, conns: list[Any], keys: list[bytes], ids: list[str], count: int, block_ms: int
    ) -> list[_Decoded]:
        if not self._raw:
            reply = self.system.client.xread(dict(zip(keys, ids)), count=count, block=block_ms)
            return _decode_reply(reply, self._decode)
        if not conns:
            if self._params is not None:
                conns.append(RespConnection(self._params))
            else:
                conns.append(self.system.client.connection_pool.make_connection())
        conn = conns[0]
        try:
            if self._params is not None:
                conn.send_packed_command(
                    _resp.pack(("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", *keys, *ids))
                )
                return conn.read_xread(self._kind, self._decode) or []
            conn.send_command("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", *keys, *ids)
            return _decode_reply(conn.read_response(), self._decode)
        except BaseException:
            conn.disconnect()  # a half-read reply must not be read as the next one
            raise

    def _run(self) -> None:
        system = self.system
        batch = system.batch
        conns = self._conns
        try:
            while True:
                with self.cond:
                    while True:
                        if not self.readers:
                            self._thread = None
                            return
                        ready = [r for r in self.readers.values() if r.wants_more()]
                        if ready:
                            break
                        self.cond.wait()
                    left_out = any(r.live() for r in self.readers.values() if r not in ready)
                keys = [r.wire_key for r in ready]
                ids = [r.last for r in ready]
                block = min(system.block_ms, self.FULL_BLOCK_MS) if left_out else system.block_ms
                reply = retrying(
                    lambda: self._xread(conns, keys, ids, batch, block),  # noqa: B023
                    f"reading {', '.join(str(r.ssp) for r in ready)}",
                    deadline_s=system.retry_s,
                    stop=lambda: not self.readers or system.giving_up(),
                )
                for key, got, got_keys, messages, eos, bad in reply:
                    reader = self.readers.get(key)
                    if reader is not None:
                        reader.deliver(got, got_keys, messages, eos, bad)
        except BaseException as e:  # noqa: BLE001 - handed to each reader's poll()
            with self.cond:
                failed = list(self.readers.values())
                self._thread = None
            if failed and system.giving_up():  # the member's error says what was not committed
                log.debug("reading %s stopped at the stop's deadline: %s", system.name, e)
            elif failed:
                log.error("reading %s failed: %s: %s", system.name, type(e).__name__, e)
            for r in failed:
                r.fail(e)
        finally:
            for conn in conns:
                conn.disconnect()
            conns.clear()


def _entries(chunk: tuple[list[str], list[Any], list[Any]]) -> int:
    """Entries in one buffered XREAD chunk (ids, keys, messages)."""
    return len(chunk[0])


class _RedisReader(BufferedPartition):
    """One partition's bounded buffer, filled by its system's fetcher thread.

    Buffered entries are chunks of parallel lists (ids, keys, messages): a few containers
    per XREAD instead of one envelope per entry, so what waits here is not traversed by
    every garbage collection; envelopes are made in poll()."""

    def __init__(self, system: RedisSystem, ssp: SystemStreamPartition, fetcher: _Fetcher) -> None:
        super().__init__(ssp, fetcher.cond, system.buffer, system.batch)
        self._system = system
        self._fetcher = fetcher
        self.key = system.keys.stream(ssp.stream, ssp.partition)
        self.wire_key = self.key.encode()
        self.last = "0-0"
        self._eos = False
        self._closed = False
        self._error: BaseException | None = None

    def start(self, after: Offset | None, wakeup: Callable[[], None]) -> None:
        if after is not None:
            try:
                entry_id(after, str(self.ssp))
            except ValueError as e:
                raise InputError(
                    f"committed offset {after!r} is not a Redis entry id", source=str(self.ssp)
                ) from e
            self.last = str(after)
        self._wakeup = wakeup
        self._fetcher.add(self)

    # -- fetcher side (called with or without the lock as noted) -----------------
    def live(self) -> bool:
        """Still to be read (lock held)."""
        return not (self._closed or self._eos or self._error is not None)

    def wants_more(self) -> bool:
        """Live with room for a whole batch (lock held)."""
        return self.live() and self._capacity - self._count >= self._batch

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            wake = not self._closed
        if wake:
            self._wakeup()

    def deliver(
        self,
        ids: list[str],
        keys: list[Any],
        messages: list[Any],
        eos: bool,
        bad: list[tuple[int, str]] | None,
    ) -> None:
        """Buffer one decoded XREAD batch of this partition (fetcher thread): the entries
        before the end marker. An entry that cannot be decoded is among them, its message
        a BadInput (``bad``: their indexes), whose error is made here an InputError naming
        the entry, the partition and the codec (rule 39); reading goes on after it."""
        if bad is not None:
            for i, field in bad:
                self._name_bad_entry(ids[i], messages[i], field)
        if ids:
            self.last = ids[-1]
        with self._cond:
            if ids:
                self._append((ids, keys, messages), len(ids))
            self._eos = eos
            wake = self._arrived(bool(ids) or eos)
        if wake:
            self._wakeup()

    def _name_bad_entry(self, eid: str, message: BadInput, field: str) -> None:
        cause = message.error
        codec = self._system.codec
        if isinstance(cause, KeyError):
            what = "has no message (field m)"
        else:
            part = "key (field k)" if field == "k" else "message (field m)"
            what = f"cannot be decoded with codec {codec!r}: its {part}: {cause}"
        error = InputError(
            f"entry {eid} {what}; set task.error.policy to skip or dead-letter to go on past "
            "entries that cannot be read",
            source=f"{self.ssp} ({self.key})",
        )
        error.__cause__ = cause
        message.error = error

    def raw(self, offset: Offset) -> bytes | None:
        """The bytes of the entry's field m at ``offset`` (an entry id), read back with
        XRANGE (error path only: a dead letter of a message ``process`` failed on)."""
        if not isinstance(offset, str):
            return None
        entries = self._system.client.xrange(self.key, min=offset, max=offset, count=1)
        if not entries:
            return None
        fields = entries[0][1]
        raw = fields.get(b"m") if isinstance(fields, dict) else None
        return raw if isinstance(raw, bytes) else None

    # -- poll's steps (loop thread, BufferedPartition.poll) ---------------------------
    def _raise_failure(self) -> None:
        err = self._error
        if err is not None:
            if isinstance(err, InputError):
                raise err
            raise InputError(f"reading from Redis failed: {err!r}", source=str(self.ssp)) from err

    def _take_out(self, max_messages: int) -> list[tuple[Any, int, int]]:
        taken, n = self._take(max_messages, _entries)
        self._took(n, notify_starving=False)  # the fetcher waits for room only
        return taken

    def _envelopes(self, taken: list[tuple[Any, int, int]]) -> list[Any]:
        s = self.ssp
        out: list[Any] = []
        for (ids, keys, messages), first, end in taken:
            _resp.envelopes(
                out, entry_envelope, s.system, s.stream, s.partition, ids, keys, messages, first, end
            )
        return out

    def at_end(self) -> bool:
        with self._cond:
            return self._eos and self._count == 0

    def close(self) -> None:
        with self._cond:
            self._closed = True
        self._fetcher.remove(self)


class _RedisProducer(Producer):
    """Buffers entries per partition and sends them with one XADD_BATCH script call
    when ``batch`` entries wait, and on flush().

    Standalone server: one call covers every partition, on the producer's own
    connection; entries are encoded into the call's bytes as they are sent
    (``tailrace.redis._resp.Batch``), and a full batch is written
    without waiting for its reply: the reply is read before the next call is written
    (at most one call in flight, so Redis appends batch k while the task produces
    batch k+1), and ``flush()`` returns only once every call was acknowledged.
    A call whose reply was lost is sent again (output is at least once); an error
    Redis returns for a call in flight is raised by the next ``send`` or ``flush``,
    and again by every later one (the call is kept), so no checkpoint passes it.
    Cluster: one call per partition, each awaited.
    """

    def __init__(self, system: RedisSystem) -> None:
        self._system = system
        self._encode = _encoder(system.codec)
        self._lock: Any = threading.Lock()
        self._pending: dict[tuple[str, int], list[Any]] = {}
        self._keys: dict[tuple[str, int], str] = {}
        self._count = 0
        self._partitions = PartitionCounts(system.output_partitions)
        self._script = Scripts(system.client).xadd_batch
        self._raw = hasattr(system.client, "connection_pool")
        self._params = RespConnection.usable_for(system.client) if self._raw else None
        self._sha = self._script.sha.encode()
        self._batch: _resp.Batch | None = None
        if self._raw:
            encode = self._encode if _KINDS[system.codec] == _resp.CALL else None
            full = partial(self._flush_locked, wait=False)
            batch = _resp.Batch(_KINDS[system.codec], encode, system.keys.stream, system.batch, full)
            self._batch = batch
            # send() as one compiled call: encode, append, and write a full batch,
            # under the batch's own lock (which is also the producer's lock)
            self._lock = batch
            self.send = batch.send  # type: ignore[method-assign]
        self._conn: Any = None
        self._inflight: tuple[bytes, int] | None = None  # (command, entries) not yet acknowledged
        self._resend = False  # the call in flight must be written again (its connection failed)
        self.sent = 0  # entries acknowledged by Redis

    def partitions(self, stream: str) -> int:
        return self._partitions[stream]

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        m = self._encode(message)  # (a standalone server's producer sends with Batch.send)
        k: Any = b"-" if key is None else b"=" + _as_bytes(self._encode(key))
        dest = (stream, partition)
        with self._lock:
            args = self._pending.get(dest)
            if args is None:
                args = self._pending[dest] = []
            args += (m, k)
            self._count += 1
            if self._count >= self._system.batch:
                self._flush_locked(wait=False)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked(wait=True)

    def hold(self, task_name: str, store: CheckpointStore) -> HeldProducer:
        """Exactly-once (rule 41): the task's entries are appended by its commit's fenced
        script, with its offsets and state (``_HeldRedisProducer``); refused unless the
        checkpoint store is this Redis's, and on a Redis Cluster."""
        from .checkpoint import RedisCheckpointStore  # (imports this module)

        system = self._system
        same = isinstance(store, RedisCheckpointStore) and (
            store.client is system.client or store.url == system.url
        )
        if not same:
            raise ConfigError(
                f"exactly-once outputs to Redis system {system.name!r} are appended by the commit's "
                f"fenced script, so they need the job's checkpoints in that same Redis ({system.where}); "
                f"the checkpoint store is {type(store).__name__}"
                + (f" at {store.where}" if isinstance(store, RedisCheckpointStore) else ""),
                key="task.output.guarantee",
                allowed="at-least-once with this store, or the redis checkpoint store of this system",
            )
        if system.cluster:
            k = system.keys
            raise ConfigError(
                f"Redis Cluster: a commit's script may only touch keys of one hash slot, but a task's "
                f"checkpoint keys ({k.checkpoint('STREAM', 0, 'JOB')}, ...) and its output streams "
                f"({k.stream('OUTPUT', 0)}, ...) each carry a hash tag of their own partition, so they "
                f"lie in different slots: exactly-once outputs to system {system.name!r} are refused",
                key="task.output.guarantee",
                allowed="at-least-once on a Redis Cluster (exactly-once needs a standalone Redis)",
            )
        # its commits carry the task's entries: written on the commit writer's thread while
        # the loop goes on (as SQLite's are), not on the loop thread
        store.background_writes = True
        store.writer_switch_interval_s = 0.0002  # (CheckpointStore.writer_switch_interval_s)
        store.groups_writes = True  # several tasks' commits in one MULTI/EXEC (write_many)
        return _HeldRedisProducer(self)

    def _key(self, dest: tuple[str, int]) -> str:
        skey = self._keys.get(dest)
        if skey is None:
            skey = self._keys[dest] = self._system.keys.stream(*dest)
        return skey

    def _flush_locked(self, *, wait: bool) -> None:
        # A script call is atomic: it ran entirely or not at all, so a retry after a
        # refused connection duplicates nothing; only a reply lost after the write can
        # duplicate a batch (output is at least once).
        if not self._raw:
            while self._pending:
                dest, args = next(iter(self._pending.items()))
                retrying(
                    partial(self._script, keys=[self._key(dest)], args=[len(args) // 2, *args]),
                    f"writing {len(args) // 2} entries to {self._system.name}",
                    deadline_s=self._system.retry_s,
                    stop=self._system.giving_up,
                )
                del self._pending[dest]
                self._count -= len(args) // 2
                self.sent += len(args) // 2
            return
        self._settle()
        assert self._batch is not None
        entries = self._batch.count
        cmd = self._batch.take(self._sha)
        if cmd is not None:
            conn = self._connection()
            self._inflight = (cmd, entries)
            try:
                conn.send_packed_command([cmd])  # a list: what redis-py's connections take
            except connection_errors():
                conn.disconnect()
                self._resend = True  # _settle writes it again, with retries
            except BaseException:
                conn.disconnect()  # the server drops a half-written command
                self._resend = True
                raise
            if wait:
                self._settle()

    def _connection(self) -> Any:
        if self._conn is None:
            if self._params is not None:
                self._conn = RespConnection(self._params)
            else:
                self._conn = self._system.client.connection_pool.make_connection()
        return self._conn

    def _settle(self) -> None:
        """Wait for the call in flight to be acknowledged (retrying while Redis is unreachable)."""
        if self._inflight is None:
            return
        retrying(
            self._settle_once,
            f"writing {self._inflight[1]} entries to {self._system.name}",
            deadline_s=self._system.retry_s,
            stop=self._system.giving_up,
        )

    def _settle_once(self) -> None:
        assert self._inflight is not None
        cmd, entries = self._inflight
        conn = self._connection()
        errors = _redis_module().exceptions
        try:
            if self._resend:
                conn.send_packed_command([cmd])  # a list: what redis-py's connections take
                self._resend = False
            try:
                conn.read_response()
            except errors.NoScriptError:  # the server lost its scripts (restart, SCRIPT FLUSH)
                conn.send_command("SCRIPT", "LOAD", self._script.script)
                conn.read_response()
                conn.send_packed_command([cmd])  # a list: what redis-py's connections take
                conn.read_response()
        except errors.ResponseError:
            # Refused by Redis (say WRONGTYPE): raised now, not retried in a loop, and
            # kept, so every later flush raises too and no checkpoint passes these entries.
            self._resend = True
            raise
        except BaseException:
            conn.disconnect()  # a half-read reply must not be read as the next one
            self._resend = True
            raise
        self._inflight = None
        self.sent += entries

    def unacknowledged(self) -> int:
        """Entries sent but not yet acknowledged by Redis (buffered or in flight)."""
        if self._batch is not None:
            return self._batch.count + (self._inflight[1] if self._inflight is not None else 0)
        return self._count

    def abort(self) -> None:
        """Fail a write blocked on an unresponsive Redis at once (any thread)."""
        conn = self._conn
        if isinstance(conn, RespConnection):
            conn.abort()
        elif conn is not None:
            conn.disconnect()

    def close(self) -> None:
        try:
            self.flush()
        except connection_errors():
            if not self._system.giving_up():
                raise
            # a stop that ran out of task.shutdown.ms: the member's error counts these
            # entries as not acknowledged (unacknowledged()), one line for the whole stop
            log.debug("closing a producer of %s after the stop's deadline", self._system.name, exc_info=True)
        finally:
            if self._conn is not None:
                self._conn.disconnect()
                self._conn = None


HELD_ENTRIES = 2_000
"""Entries a task's exactly-once Redis outputs hold before its commit falls due early (rule 41)."""


class _HeldRedisProducer(HeldProducer):
    """A task's Redis outputs under exactly-once (rule 41): encoded as they are sent into a
    batch of the task's own (``_resp.Batch``, compiled: an entry that cannot be encoded fails
    in ``send``, not at the commit) and held; the commit's publication hands the encoded
    entries to the checkpoint store, whose fenced MULTI/EXEC appends them with the offsets and
    state (``RedisCheckpointStore``, OUTPUT_COMMIT), so a container past its lease appends
    none of them (rule 28)."""

    def __init__(self, producer: _RedisProducer) -> None:
        system = producer._system
        self._producer = producer
        encode = producer._encode if _KINDS[system.codec] == _resp.CALL else None
        self._batch = _resp.Batch(_KINDS[system.codec], encode, system.keys.stream, HELD_ENTRIES, self._full)
        self._asked = False  # on_full called since the last take
        self.send = self._batch.send  # type: ignore[method-assign]

    def partitions(self, stream: str) -> int:
        return self._producer.partitions(stream)

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:  # (the batch's send)
        self._batch.send(stream, partition, key, message)

    def _full(self) -> None:
        if not self._asked and self.on_full is not None:
            self._asked = True
            self.on_full()

    def pending(self) -> bool:
        return self._batch.count > 0

    def take(self) -> Callable[[Write, CommitOutputs], None] | None:
        with self._batch:
            body = self._batch.take_body()
        self._asked = False
        if body is None:
            return None

        return HandedRecords(body)  # appended by the store's write (grouped: write_many)


def _as_bytes(v: bytes | str) -> bytes:
    return v if isinstance(v, bytes) else v.encode()


class RedisSystem(System):
    """Partitioned streams in Redis (standalone server or Redis Cluster).

    ``url``: ``redis://host:port/db`` or ``unix:///path?db=N``; ``cluster``: use
    ``redis.cluster.RedisCluster``. ``streams``: partition counts of input streams
    (otherwise read from Redis, as recorded by :meth:`create_stream`);
    ``output_partitions``: count for an output stream Redis does not know yet.
    ``batch``: entries per XREAD (per partition) and per producer script call;
    ``buffer``: entries read ahead per partition; ``codec``: ``json`` (default),
    ``str``, ``bytes`` or ``msgpack``. ``retry_s``: how long Redis may stay unreachable
    before a read or write fails (a member of a job with Redis checkpoints sets it to the
    checkpoints' ``retry_s``). ``prefix``: the first part of every Redis key (default
    ``tr``; docs/redis.md's layout). ``block_ms``: the longest one ``XREAD`` waits for new
    entries (default 200). ``client``: a redis-py client (``redis.Redis`` or
    ``RedisCluster``) to use instead of connecting to ``url``; ``close`` leaves it open.

    Thread-safety: the readers of a container are fed by one reading thread per system
    (one per partition on a Redis Cluster), which hands each batch to the engine's loop
    thread. The producer's ``send`` is safe from any thread (one lock per producer).
    ``append``, ``end_stream``, ``create_stream`` and ``read_all`` go through the
    system's redis-py client, which redis-py makes safe to share between threads.

    The keyword arguments are also the options of a job file's ``[systems.NAME]``
    table with ``type = "redis"``. Raises InputError naming the URL when Redis does not answer at start.
    """

    @options_checked
    def __init__(
        self,
        name: str = "redis",
        url: str = DEFAULT_URL,
        *,
        cluster: bool = False,
        prefix: str = "tr",
        streams: Mapping[str, int] | None = None,
        output_partitions: int = 1,
        batch: int = 1000,
        buffer: int = 4000,
        block_ms: int = 200,
        codec: str = "json",
        retry_s: float = 60.0,
        client: Any = None,
    ) -> None:
        super().__init__(name)
        if codec not in CODECS:
            raise ConfigError(f"unknown codec {codec!r}", key="codec", allowed=", ".join(CODECS))
        if codec == "msgpack":
            try:
                serde(codec)
            except SerdeError as e:
                raise ConfigError(str(e), key="codec") from None
        for key, value in (
            ("batch", batch),
            ("buffer", buffer),
            ("block_ms", block_ms),
            ("output_partitions", output_partitions),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"expected an integer >= 1, got {value!r}", key=key)
        self.url = url
        self.where = redact(url)  # the URL in messages: no password
        self.cluster = cluster
        self.keys = Keys(prefix)
        self.codec = codec
        self.batch = batch
        self.buffer = max(buffer, batch)
        self.block_ms = block_ms
        self.retry_s = retry_s
        self._declared = dict(streams or {})  # the 'streams' option: checked against Redis at first use
        self._streams: dict[str, int] = {}  # partition counts known (declared and checked, or read)
        self._default_output_partitions = output_partitions
        self._fetcher: _Fetcher | None = None
        self._fetchers: list[_Fetcher] = []
        self._producers: list[_RedisProducer] = []
        self.stop_deadline: StopDeadline | None = None
        self._own_client = client is None
        self.client = client if client is not None else connect(url, cluster=cluster)
        check(self.client, url, lambda msg: InputError(msg, source=f"system {name!r}"))

    # -- streams --------------------------------------------------------------
    def _known_partitions(self, stream: str) -> int | None:
        n = self._streams.get(stream)
        if n is not None:
            return n
        raw = retrying(
            lambda: self.client.get(self.keys.partitions(stream)),
            f"reading metadata of {stream}",
            deadline_s=self.retry_s,
            stop=self.giving_up,
        )
        recorded = None if raw is None else int(raw)
        declared = self._declared.get(stream)
        if declared is not None and recorded is not None and declared != recorded:
            # reading 4 of 8 partitions would skip half the stream without a word
            raise ConfigError(
                f"stream {stream!r} has {declared} partitions here, but Redis at {self.where} "
                f"records {recorded} (made by RedisSystem.create_stream or tailrace load "
                "--partitions); they must agree",
                key=f"systems.{self.name}.streams.{stream}",
            )
        n = declared if declared is not None else recorded
        if n is not None:
            self._streams[stream] = n
        return n

    def partitions(self, stream: str) -> int:
        n = self._known_partitions(stream)
        if n is None:
            raise InputError(
                f"Redis at {self.where} has no stream {stream!r} (create it with RedisSystem.create_stream "
                f"or give its partition count in the system's 'streams' table)",
                source=f"{self.name}.{stream}",
            )
        return n

    def output_partitions(self, stream: str) -> int:
        """Partition count of an output stream, recording the default for a new one."""
        n = self._known_partitions(stream)
        if n is None:
            self.create_stream(stream, self._default_output_partitions, exist_ok=True)
            n = self._known_partitions(stream)
        assert n is not None
        return n

    def create_stream(self, stream: str, partitions: int, *, exist_ok: bool = False) -> None:
        """Record ``stream`` with ``partitions`` partitions in Redis (ValueError if it exists
        with another count, or at all unless ``exist_ok``)."""
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        declared = self._declared.get(stream)
        if declared is not None and declared != partitions:
            raise ValueError(
                f"stream {stream!r} has {declared} partitions in the 'streams' option of system {self.name!r}"
            )
        key = self.keys.partitions(stream)
        created = retrying(lambda: self.client.set(key, partitions, nx=True), f"creating {stream}")
        if not created:
            existing = int(self.client.get(key))
            if existing != partitions or not exist_ok:
                raise ValueError(f"stream {stream!r} already exists in Redis with {existing} partitions")
        self._streams[stream] = partitions if created else int(self.client.get(key))

    def append(self, stream: str, partition: int, message: Any, key: Any = None) -> str:
        """Append one message now (acknowledged by Redis); returns its entry id."""
        enc = _encoder(self.codec)
        fields: dict[str, Any] = {"m": enc(message)}
        if key is not None:
            fields["k"] = enc(key)
        return text(self.client.xadd(self.keys.stream(stream, partition), fields))

    def end_stream(self, stream: str, partition: int | None = None) -> None:
        """Append the end-of-stream marker to one partition (or to all)."""
        parts = range(self.partitions(stream)) if partition is None else [partition]
        for p in parts:
            retrying(
                partial(self.client.xadd, self.keys.stream(stream, p), {EOS_FIELD: b"1"}), f"ending {stream}"
            )

    def read_all(self, stream: str, partition: int) -> list[tuple[str, Any, Any]]:
        """Every (entry id, key, message) of a partition, end marker excluded (for tests and tools)."""
        dec = _decoder(self.codec)
        out: list[tuple[str, Any, Any]] = []
        last = "-"
        key = self.keys.stream(stream, partition)
        while True:
            entries = self.client.xrange(key, min=last, count=10000)
            if last != "-":
                entries = entries[1:]
            if not entries:
                return out
            for raw_id, fields in entries:
                if EOS_FIELD in fields:
                    continue
                k = fields.get(b"k")
                out.append((text(raw_id), None if k is None else dec(k), dec(fields[b"m"])))
            last = text(entries[-1][0])

    # -- tailrace interface -----------------------------------------------------
    def reader(self, ssp: SystemStreamPartition) -> PartitionReader:
        n = self.partitions(ssp.stream)
        if not 0 <= ssp.partition < n:
            raise InputError(f"stream has {n} partitions, no partition {ssp.partition}", source=str(ssp))
        if self._fetcher is None or not self._fetcher._raw:
            # standalone: one fetcher (thread, connection) for every reader of this system
            self._fetcher = _Fetcher(self)
            self._fetchers.append(self._fetcher)
        return _RedisReader(self, ssp, self._fetcher)

    def producer(self) -> Producer:
        producer = _RedisProducer(self)
        self._producers.append(producer)
        return producer

    # -- bounded stops ------------------------------------------------------------
    def use_stop_deadline(self, deadline: StopDeadline) -> None:
        """Stop waiting for Redis once ``deadline`` is due (a member's graceful stop,
        bounded by ``task.shutdown.ms``): retries give up and blocked calls are aborted."""
        self.stop_deadline = deadline
        deadline.on_due(self.abort)

    def giving_up(self) -> bool:
        """True once a stop's deadline passed: no more waiting for Redis."""
        d = self.stop_deadline
        return d is not None and d.due()

    def abort(self) -> None:
        """Fail every call of this system blocked on Redis at once (any thread)."""
        for producer in self._producers:
            producer.abort()
        for fetcher in self._fetchers:
            fetcher.abort()
        abort_client(self.client)

    def unacknowledged(self) -> int:
        """Output entries sent by this system's producers that Redis has not acknowledged."""
        return sum(p.unacknowledged() for p in self._producers)

    def close(self) -> None:
        if self._own_client:
            try:
                self.client.close()
            except connection_errors():
                pass


__all__ = ["RedisSystem"]
