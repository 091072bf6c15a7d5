"""Checkpoints in Redis, fenced by partition leases.

The committed entry id of (job, stream, partition) lives in
``PREFIX:{stream:p}:ckpt:JOB``, next to the partition's lease
``PREFIX:{stream:p}:lease:JOB`` (same hash slot). A lease's value is
``member|token``, where the token comes from an ``INCR`` of the partition's
fencing counter on every acquisition, so it is never reused. Every checkpoint
write is one Lua script that first checks that the lease still holds the
writer's exact value and that no id moves backwards, then writes: a container
that lost a lease (paused, partitioned away, expired) can never commit for that
partition again; it gets :class:`~tailrace.errors.FencedError` instead.

:class:`Leases` keeps a member's leases (``SET NX PX``, renewed by whoever drives
the heartbeat); :class:`RedisCheckpointStore` writes fenced checkpoints with the
lease values it is given, or, used alone with a plain Container, acquires and
renews leases on its inputs itself (a second container of the same job is then
refused with CheckpointError).

State (rules 25-29). A task's key-value stores live in the hash slot of the
task's *anchor*, its first input partition (``{stream:p}``, the task's partitions
sorted as the container sorts them): per store a sorted set of the encoded keys
(score 0, so ``ZRANGEBYLEX`` scans them in byte order) and a hash of the values.
A commit that carries state is one ``STATE_COMMIT`` script that checks the
leases of the task's partitions in that slot and that no id moves backwards,
then writes the state changes and the offsets. A commit of more than
``STATE_BATCH`` changes is several such scripts in one ``MULTI``/``EXEC``: each
makes the same checks, and nothing runs between them, so all apply or none.
On a Redis Cluster, the ids of a task's partitions that hash elsewhere (several
input streams) are kept in a hash next to the anchor (``tckpt``), written by the
same script, and the task is fenced by the lease of its anchor, which every
owner of the task holds (a container runs a task only while it holds the leases
of all its partitions).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from .._stopping import StopDeadline
from ..config import options_checked
from ..errors import CheckpointError, ConfigError, FencedError
from ..interfaces import CheckpointStore, CommitOutputs, StateChanges, StoreWrite
from ..types import Offset, Offsets, SystemStreamPartition
from ._io import (
    DEFAULT_URL,
    SCAN_LIMIT,
    Keys,
    RespConnection,
    Scripts,
    check,
    connect,
    connection_errors,
    entry_id,
    redact,
    retrying,
    text,
)

log = logging.getLogger("tailrace.redis")

STATE_BATCH = 10_000
"""State changes per STATE_COMMIT call: a larger commit is several calls in one
MULTI/EXEC (bounds each script's arguments and Lua stack, not atomicity)."""

SCAN_BATCH = SCAN_LIMIT
"""Entries fetched per STATE_SCAN call by ``state_scan`` (at most SCAN_LIMIT)."""


@dataclass(frozen=True)
class _TaskLayout:
    """Where one task's checkpoint and state live (see the module docstring)."""

    anchor: SystemStreamPartition
    local: tuple[SystemStreamPartition, ...]  # partitions in the anchor's slot (all of them off-cluster)
    remote: tuple[SystemStreamPartition, ...]  # the others (cluster only): ids in ``tckpt``
    tckpt: str


@dataclass(frozen=True)
class _TaskWrite:
    """A task's commit prepared as calls of one MULTI/EXEC (``RedisCheckpointStore._prepare``):
    the keys and arguments its calls share, its STATE_COMMIT calls, its OUTPUT_COMMIT call (at
    most one), the leases it checks and the ids it writes, in the order its replies name them."""

    job: str
    task: str
    layout: _TaskLayout
    keys: list[str]
    head: list[Any]
    tail: list[Any]
    calls: list[tuple[list[str], list[Any]]]
    outs: list[tuple[int, list[bytes], int, bytes]]
    leases: list[SystemStreamPartition]
    ids: list[tuple[SystemStreamPartition, str]]


class Leases:
    """The partition leases one member holds for one job.

    ``acquire``/``release``/``renew`` may be called from any thread (a lock guards
    the table). A lease that fails to renew is dropped and reported by ``renew``;
    its token is dead forever (a new acquisition gets a new token).
    """

    def __init__(
        self,
        client: Any,
        keys: Keys,
        job: str,
        member: str,
        ttl_ms: int,
        *,
        retry_s: float = 60.0,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        if "|" in member:
            raise ValueError(f"member id {member!r} must not contain '|'")
        self.client = client
        self.keys = keys
        self.job = job
        self.member = member
        self.ttl_ms = ttl_ms
        self.retry_s = retry_s
        self._stop = stop  # true: a stop's deadline passed, give up waiting for Redis
        self._scripts = Scripts(client)
        self._held: dict[SystemStreamPartition, str] = {}
        self._lock = threading.Lock()

    def acquire(self, ssp: SystemStreamPartition) -> bool:
        """Take the lease of ``ssp`` if it is free (True), or when already ours."""
        with self._lock:
            if ssp in self._held:
                return True
        k = self.keys
        token = retrying(
            lambda: self._scripts.acquire(
                keys=[
                    k.lease(ssp.stream, ssp.partition, self.job),
                    k.fence(ssp.stream, ssp.partition, self.job),
                ],
                args=[self.member, self.ttl_ms],
            ),
            f"acquiring the lease of {ssp}",
            deadline_s=self.retry_s,
            stop=self._stop,
        )
        if token is None:
            return False
        with self._lock:
            self._held[ssp] = f"{self.member}|{int(token)}"
        log.info("member %s acquired %s (token %s)", self.member, ssp, int(token))
        return True

    def release(self, ssp: SystemStreamPartition) -> None:
        """Give the lease back (only if it is still ours)."""
        with self._lock:
            value = self._held.pop(ssp, None)
        if value is None:
            return
        try:
            retrying(
                lambda: self._scripts.release(
                    keys=[self.keys.lease(ssp.stream, ssp.partition, self.job)], args=[value]
                ),
                f"releasing the lease of {ssp}",
                deadline_s=min(self.retry_s, self.ttl_ms / 1000),
                stop=self._stop,
            )
            log.info("member %s released %s", self.member, ssp)
        except connection_errors() as e:
            if self._stop is not None and self._stop():  # the member's last line says so, once
                log.debug("could not release %s at the stop's deadline (%s)", ssp, e)
            else:
                log.warning("could not release %s (%s); it expires in %d ms", ssp, e, self.ttl_ms)

    def renew(self) -> set[SystemStreamPartition]:
        """Extend every held lease by the TTL; returns (and drops) the ones lost."""
        with self._lock:
            held = dict(self._held)
        if not held:
            return set()
        order = list(held.items())
        replies: list[Any] = []
        try:
            for ssp, value in order:
                key = self.keys.lease(ssp.stream, ssp.partition, self.job)
                replies.append(self._scripts.renew(keys=[key], args=[value, self.ttl_ms]))
        except connection_errors() as e:
            # Not lost yet: the lease may still be alive; the next heartbeat retries.
            log.warning("member %s: renewing leases failed (%r)", self.member, e)
            order = order[: len(replies)]
        lost = {ssp for (ssp, _), ok in zip(order, replies) if int(ok) != 1}
        if lost:
            with self._lock:
                for ssp in lost:
                    if self._held.get(ssp) == held[ssp]:
                        del self._held[ssp]
            log.warning("member %s lost the lease of %s", self.member, ", ".join(sorted(map(str, lost))))
        return lost

    def forget(self, ssp: SystemStreamPartition) -> None:
        """Drop a lease known to be lost (fenced) without touching Redis."""
        with self._lock:
            self._held.pop(ssp, None)

    def held(self) -> dict[SystemStreamPartition, str]:
        """A snapshot: ssp -> lease value (``member|token``)."""
        with self._lock:
            return dict(self._held)

    def release_all(self) -> None:
        for ssp in list(self.held()):
            self.release(ssp)


class RedisCheckpointStore(CheckpointStore):
    """Committed entry ids in Redis, each write fenced by the partition's lease.

    Options (also the keys of a job file's ``[checkpoints]`` table with ``type =
    "redis"``): ``url``, ``cluster``, ``prefix``, ``lease_ms``, ``retry_s`` (how long
    Redis may stay unreachable before a call fails; a member applies it to every
    Redis call of the job, its systems' included). ``client``: a redis-py client to use
    instead of connecting to ``url`` (``close`` leaves it open).

    ``stop_deadline``: once due (a member's graceful stop ran out of
    ``task.shutdown.ms``), writes give up at once instead of retrying.

    ``leases``: the lease values (``ssp -> "member|token"``) this container writes
    with, as held by a distributed member. Without it, ``inputs`` names the
    partitions and ``open`` acquires their leases itself (CheckpointError when
    another container holds one) and renews them on a thread until ``close``.

    ``write`` raises FencedError when a lease is no longer held with that value or
    an id would move backwards; CheckpointError when Redis stays unreachable.

    Task state (rules 25-29): ``write(task, offsets, state)`` applies the state
    changes and the offsets in one fenced atomic write; ``state_get`` and
    ``state_scan`` read committed state from any thread (see the module
    docstring for the layout, docs/redis.md for the cluster rules).
    """

    @options_checked
    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        cluster: bool = False,
        prefix: str = "tr",
        client: Any = None,
        leases: Mapping[SystemStreamPartition, str] | None = None,
        inputs: Sequence[SystemStreamPartition] | None = None,
        lease_ms: int = 10000,
        retry_s: float = 60.0,
        stop_deadline: StopDeadline | None = None,
    ) -> None:
        for key, value, low in (("lease_ms", lease_ms, 100), ("retry_s", retry_s, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ConfigError(f"expected a number >= {low}, got {value!r}", key=key)
        self.url = url
        self.where = redact(url)  # the URL in messages: no password
        self.cluster = cluster
        self.keys = Keys(prefix)
        self.retry_s = retry_s
        self.lease_ms = lease_ms
        self.stop_deadline = stop_deadline
        self._own_client = client is None
        self.client = client if client is not None else connect(url, cluster=cluster)
        self._scripts = Scripts(self.client)
        self._given = dict(leases) if leases is not None else None
        self._inputs = list(inputs) if inputs is not None else list(self._given or {})
        self._values: dict[SystemStreamPartition, str] = {}
        self._job: str | None = None
        self._committed: dict[SystemStreamPartition, Offset] | None = None
        self._own_leases: Leases | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._layouts: dict[str, _TaskLayout] | None = None
        self._anchored: set[str] = set()  # tasks whose anchor matched the registry (this open)
        # (task, its anchor's lease value) -> the task's last appended output batch (rule 41):
        # read once per lease, so a lease lost and taken again reads it afresh
        self._output_seq: dict[tuple[str, str], int] = {}
        self._conn: Any = None  # exactly-once transactions' connection (``_connection``)
        # partitions whose commit was fenced during the last open (a member reads it after the
        # container stopped, so it is kept past close and emptied by the next open)
        self.fenced: set[SystemStreamPartition] = set()

    # -- CheckpointStore ----------------------------------------------------------
    def open(self, job_name: str) -> None:
        if self._given is None and not self._inputs:
            raise CheckpointError(
                "a Redis checkpoint store needs its partitions (leases= or inputs=); jobs with "
                '[checkpoints] type = "redis" run through tailrace.redis.membership (tailrace run does this)'
            )
        check(self.client, self.url, CheckpointError)
        # nothing of an earlier open carries over: the committed ids are read again from
        # Redis (another run may have committed since), the leases are new ones
        self._forget_run()
        self.fenced = set()
        self._job = job_name
        if self._given is not None:
            self._values = dict(self._given)
            return
        import os
        import socket
        import uuid

        member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        leases = Leases(
            self.client,
            self.keys,
            job_name,
            member,
            self.lease_ms,
            retry_s=self.retry_s,
            stop=self._giving_up,
        )
        for ssp in self._inputs:
            if not leases.acquire(ssp):
                leases.release_all()
                raise CheckpointError(
                    f"job {job_name!r}: partition {ssp} is leased by another container "
                    f"(Redis at {self.where}; a crashed container's lease expires after {self.lease_ms} ms)"
                )
        self._own_leases = leases
        self._values = leases.held()
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name="tailrace-redis-leases", daemon=True)
        self._renewer.start()

    def _forget_run(self) -> None:
        """Drop what one open cached: committed ids, lease values, task layouts, anchors seen."""
        self._committed = None
        self._values = {}
        self._layouts = None
        self._anchored = set()
        self._output_seq = {}

    def _renew_loop(self) -> None:
        assert self._own_leases is not None
        while not self._stop.wait(self.lease_ms / 3000):
            self._own_leases.renew()

    def _giving_up(self) -> bool:
        d = self.stop_deadline
        return d is not None and d.due()

    def _require_job(self) -> str:
        if self._job is None:
            raise CheckpointError("the Redis checkpoint store is not open")
        return self._job

    def read_committed(self) -> dict[SystemStreamPartition, Offset]:
        """The committed entry id of every partition of this store (read from Redis)."""
        job = self._require_job()
        keys = [self.keys.checkpoint(s.stream, s.partition, job) for s in self._inputs]

        def get_all() -> list[Any]:
            return [self.client.get(k) for k in keys] if self.cluster else list(self.client.mget(keys))

        try:
            values = retrying(get_all, "reading checkpoints", deadline_s=self.retry_s) if keys else []
        except connection_errors() as e:
            raise CheckpointError(f"Redis at {self.where} is unreachable: {e}") from e
        out: dict[SystemStreamPartition, Offset] = {}
        for ssp, raw in zip(self._inputs, values):
            if raw is None:
                continue
            value = text(raw)
            try:
                entry_id(value, f"checkpoint of {ssp}")
            except ValueError as e:
                raise CheckpointError(f"corrupt checkpoint in Redis at {self.where}: {e}") from None
            out[ssp] = value
        out.update(self._read_task_offsets(job))
        return out

    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        # Checkpoints are kept per partition, not per task: hand back every known
        # partition's id; the container keeps those of the task's own partitions.
        if self._committed is None:
            self._committed = self.read_committed()
        return dict(self._committed)

    def write(
        self,
        task_name: str,
        offsets: Offsets,
        state: StateChanges | None = None,
        outputs: CommitOutputs | None = None,
    ) -> None:
        job = self._require_job()
        prepared = self._task_write(job, task_name, offsets, state, outputs)
        if prepared is not None:
            replies = self._retrying_write([task_name], lambda: self._run_write(prepared))
            self._finish_write(prepared, replies)
            return
        items: list[tuple[SystemStreamPartition, str, str]] = []
        for ssp, offset in offsets.items():
            value = self._values.get(ssp)
            if value is None or ssp in self.fenced:
                raise FencedError(f"job {job!r} holds no lease on this partition", partition=str(ssp))
            try:
                entry_id(offset, str(ssp))
            except ValueError as e:
                raise CheckpointError(f"task {task_name!r}: {e}") from None
            items.append((ssp, value, str(offset)))
        # On a cluster each partition is its own slot: one script per partition
        # (each atomic). On one server all partitions of the task go in one script.
        groups = [[i] for i in items] if self.cluster else [items]
        for group in groups:
            if group:
                self._write_group(job, task_name, group)

    def _write_group(
        self, job: str, task_name: str, group: list[tuple[SystemStreamPartition, str, str]]
    ) -> None:
        keys: list[str] = []
        args: list[str] = []
        for ssp, value, offset in group:
            keys += [
                self.keys.lease(ssp.stream, ssp.partition, job),
                self.keys.checkpoint(ssp.stream, ssp.partition, job),
            ]
            args += [value, offset]
        try:
            reply = retrying(
                lambda: self._scripts.commit(keys=keys, args=args),
                f"committing {task_name}",
                deadline_s=self.retry_s,
                stop=self._giving_up,
            )
        except connection_errors() as e:
            raise CheckpointError(f"task {task_name!r}: Redis at {self.where} is unreachable: {e}") from e
        code = int(reply[0])
        if code == 0:
            if self._committed is not None:
                for ssp, _, offset in group:
                    self._committed[ssp] = offset
            return
        ssp, value, offset = group[int(reply[1]) - 1]
        self.fenced.add(ssp)
        if code == 1:
            raise FencedError(
                f"job {job!r}: lease {value!r} is no longer held (another container owns the partition, "
                f"or the lease expired); refusing to commit {offset}",
                partition=str(ssp),
            )
        raise FencedError(
            f"job {job!r}: refusing to move the committed offset back from {text(reply[2])} to {offset}",
            partition=str(ssp),
        )

    # -- state (rules 25-29) --------------------------------------------------------
    def _task_layouts(self) -> dict[str, _TaskLayout]:
        """Every task of this store's partitions (GroupByPartition, as the container
        groups them: task "Partition N" owns partition N of every input)."""
        layouts = self._layouts
        if layouts is not None:
            return layouts
        job = self._job or ""
        by_partition: dict[int, list[SystemStreamPartition]] = {}
        for ssp in self._inputs:
            by_partition.setdefault(ssp.partition, []).append(ssp)
        layouts = {}
        for pnum, ssps in by_partition.items():
            parts = sorted(ssps)
            anchor = parts[0]
            local: list[SystemStreamPartition] = [anchor]
            remote: list[SystemStreamPartition] = []
            if self.cluster:
                slot = self._slot(anchor)
                for s in parts[1:]:
                    (local if self._slot(s) == slot else remote).append(s)
            else:
                local = parts
            name = f"Partition {pnum}"
            tckpt = self.keys.task_offsets(anchor.stream, anchor.partition, job, name)
            layouts[name] = _TaskLayout(anchor, tuple(local), tuple(remote), tckpt)
        self._layouts = layouts  # built once per open; later readers see the whole dict
        return layouts

    def _slot(self, ssp: SystemStreamPartition) -> int:
        from redis.crc import key_slot

        return int(key_slot(self.keys.lease(ssp.stream, ssp.partition, "").encode()))

    def _layout(self, task_name: str) -> _TaskLayout | None:
        return self._task_layouts().get(task_name)

    def _state_keys(self, job: str, task_name: str, store: str, *, claim: bool = False) -> tuple[str, str]:
        layout = self._layout(task_name)
        if layout is None:
            raise CheckpointError(
                f"task {task_name!r} has no input partitions in this Redis checkpoint store "
                f"(its tasks: {', '.join(sorted(self._task_layouts())) or 'none'})"
            )
        a = layout.anchor
        if task_name not in self._anchored:
            self._check_anchor(job, task_name, a, claim)
        return self.keys.state(a.stream, a.partition, job, task_name, store)

    def _check_anchor(self, job: str, task_name: str, anchor: SystemStreamPartition, claim: bool) -> None:
        """Refuse to use a task's state under another anchor than the one it was written
        under (the job's inputs changed so that another stream sorts first); ``claim``
        records the anchor on the first state write. Once per task per open."""
        registry, here = self.keys.anchors(job), f"{anchor.stream}:{anchor.partition}"

        def check() -> Any:
            old = self.client.hget(registry, task_name)
            if old is None and claim:
                self.client.hsetnx(registry, task_name, here)
                old = self.client.hget(registry, task_name)
            return old

        try:
            old = retrying(
                check,
                f"reading the state anchor of {task_name}",
                deadline_s=self.retry_s,
                stop=self._giving_up,
            )
        except connection_errors() as e:
            raise CheckpointError(f"task {task_name!r}: Redis at {self.where} is unreachable: {e}") from e
        if old is None:
            return  # no state written yet: nothing to find elsewhere
        if text(old) != here:
            raise CheckpointError(
                f"job {job!r} task {task_name!r}: its state was written under input partition {text(old)} "
                f"(the task's first input), but its first input is now {anchor.stream}:{anchor.partition}; "
                f"the job's inputs changed. Keep the inputs, or delete the task's old state "
                f"(keys {self.keys.prefix}:{{{text(old)}}}:state:{job}:{task_name}:*) and field "
                f"{task_name!r} of {registry} to start it afresh"
            )
        self._anchored.add(task_name)

    def _read_task_offsets(self, job: str) -> dict[SystemStreamPartition, Offset]:
        """Ids of the tasks' partitions kept next to their anchors (cluster, several slots)."""
        out: dict[SystemStreamPartition, Offset] = {}
        for task_name, layout in self._task_layouts().items():
            if not layout.remote:
                continue
            try:
                raw = retrying(
                    partial(self.client.hgetall, layout.tckpt),
                    f"reading the checkpoint of {task_name}",
                    deadline_s=self.retry_s,
                    stop=self._giving_up,
                )
            except connection_errors() as e:
                raise CheckpointError(f"Redis at {self.where} is unreachable: {e}") from e
            fields = {text(k): text(v) for k, v in raw.items()}
            for ssp in layout.remote:
                value = fields.get(f"{ssp.stream}:{ssp.partition}")
                if value is None:
                    continue
                try:
                    entry_id(value, f"checkpoint of {ssp}")
                except ValueError as e:
                    raise CheckpointError(f"corrupt checkpoint in Redis at {self.where}: {e}") from None
                out[ssp] = value
        return out

    def _task_write(
        self,
        job: str,
        task_name: str,
        offsets: Offsets,
        state: StateChanges | None,
        outputs: CommitOutputs | None,
        *,
        grouped: bool = False,
    ) -> _TaskWrite | None:
        """A task's commit as one fenced atomic write of its offsets, state changes and held
        outputs (``_TaskWrite``), or None when it is the offsets alone, written by COMMIT
        scripts (``_write_group``). ``grouped``: for ``write_many``, which writes a task
        with input partitions here this way even without state or outputs."""
        if outputs is not None and outputs.marks:
            raise CheckpointError(
                "the Redis checkpoint store cannot record file outputs' committed lengths "
                "(exactly-once file outputs need a sqlite checkpoint store)"
            )
        records = outputs.records if outputs is not None else []
        layout = self._layout(task_name) if state or records or self.cluster or grouped else None
        if (state or records) and layout is None:
            raise CheckpointError(
                f"task {task_name!r} has no input partitions in this Redis checkpoint store "
                f"(its tasks: {', '.join(sorted(self._task_layouts())) or 'none'}); cannot place its "
                f"{'state' if state else 'outputs'}"
            )
        if layout is None or not (state or records or layout.remote or grouped):
            return None
        return self._prepare(job, task_name, layout, offsets, state or {}, records)

    def write_many(self, writes: Sequence[StoreWrite]) -> list[BaseException | None]:
        """Several tasks' commits in one MULTI/EXEC (one round trip; ``groups_writes``):
        each commit's calls make its own checks, so each applies or is refused on its own.
        A retry after a lost reply sends them all again (each re-applies the same changes,
        as ``write``'s retry does)."""
        job = self._require_job()
        errors: list[BaseException | None] = [None] * len(writes)
        prepared: list[tuple[int, _TaskWrite]] = []
        alone: list[int] = []
        for i, (task_name, offsets, state, outputs) in enumerate(writes):
            try:
                tw = self._task_write(job, task_name, offsets, state, outputs or None, grouped=True)
            except Exception as e:  # noqa: BLE001 - handed back, one per write
                errors[i] = e
                continue
            if tw is None:
                alone.append(i)
            else:
                prepared.append((i, tw))
        if prepared:
            tasks = [tw.task for _, tw in prepared]
            replies = self._retrying_write(tasks, lambda: self._transaction([tw for _, tw in prepared]))
            for (i, tw), reply in zip(prepared, replies):
                try:
                    self._finish_write(tw, reply)
                except Exception as e:  # noqa: BLE001 - handed back, one per write
                    errors[i] = e
        for i in alone:
            task_name, offsets, state, outputs = writes[i]
            try:
                self.write(task_name, offsets, state, outputs=outputs or None)
            except Exception as e:  # noqa: BLE001 - handed back, one per write
                errors[i] = e
        return errors

    def _retrying_write(self, tasks: list[str], run: Callable[[], Any]) -> Any:
        """``run()``, retried while Redis is unreachable (CheckpointError once it stays so)."""
        try:
            # A retry after a lost reply re-applies the same changes: same checks, same values.
            return retrying(
                run, f"committing {', '.join(tasks)}", deadline_s=self.retry_s, stop=self._giving_up
            )
        except connection_errors() as e:
            named = ", ".join(map(repr, tasks))
            raise CheckpointError(
                f"task{'s' if len(tasks) > 1 else ''} {named}: Redis at {self.where} is unreachable: {e}"
            ) from e

    def _prepare(
        self,
        job: str,
        task_name: str,
        layout: _TaskLayout,
        offsets: Mapping[SystemStreamPartition, Offset],
        state: StateChanges,
        records: list[Any],
    ) -> _TaskWrite:
        """One atomic, fenced write of a task's offsets, state changes and held outputs
        (rules 26, 28, 41): OUTPUT_COMMIT calls for the outputs, then STATE_COMMIT calls,
        in one MULTI/EXEC when there are several, each making the same checks."""
        k = self.keys
        leases: list[SystemStreamPartition] = []
        lease_values: list[str] = []
        for ssp in layout.local:  # the task's state is written: every lease in the slot must hold
            value = self._values.get(ssp)
            if value is None or ssp in self.fenced:
                raise FencedError(f"job {job!r} holds no lease on this partition", partition=str(ssp))
            leases.append(ssp)
            lease_values.append(value)
        local_ids: list[tuple[SystemStreamPartition, str]] = []
        remote_ids: list[tuple[SystemStreamPartition, str]] = []
        local = set(layout.local)
        for ssp, offset in offsets.items():
            if ssp not in local and ssp not in layout.remote:
                raise CheckpointError(f"task {task_name!r}: {ssp} is not one of its partitions")
            if ssp in self.fenced or ssp not in self._values:
                raise FencedError(f"job {job!r} holds no lease on this partition", partition=str(ssp))
            try:
                entry_id(offset, str(ssp))
            except ValueError as e:
                raise CheckpointError(f"task {task_name!r}: {e}") from None
            (local_ids if ssp in local else remote_ids).append((ssp, str(offset)))
        keys = [k.lease(s.stream, s.partition, job) for s in leases]
        keys += [k.checkpoint(s.stream, s.partition, job) for s, _ in local_ids]
        keys.append(layout.tckpt)
        head: list[Any] = [len(leases), len(local_ids), len(remote_ids)]
        tail: list[Any] = [*lease_values, *(i for _, i in local_ids)]
        for s, i in remote_ids:
            tail += [f"{s.stream}:{s.partition}", i]
        return _TaskWrite(
            job,
            task_name,
            layout,
            keys,
            head,
            tail,
            self._state_calls(job, task_name, state),
            self._output_calls(job, task_name, layout, records),
            leases,
            local_ids + remote_ids,
        )

    def _run_write(self, tw: _TaskWrite) -> list[Any]:
        """The replies of a task's write's calls (see ``_prepare``)."""
        keys, head, tail, calls = tw.keys, tw.head, tw.tail, tw.calls
        if tw.outs:
            return self._transaction([tw])[0]
        if len(calls) == 1:
            store_keys, store_args = calls[0]
            return [
                self._scripts.state_commit(
                    keys=keys + store_keys, args=[*head, len(store_keys) // 2, -1, *tail, *store_args]
                )
            ]
        pipe = self.client.pipeline(transaction=True)
        for store_keys, store_args in calls:
            # EVAL, not EVALSHA: a NOSCRIPT inside EXEC would fail that call alone
            pipe.execute_command(
                "EVAL",
                self._scripts.state_commit.script,
                len(keys) + len(store_keys),
                *keys,
                *store_keys,
                *head,
                len(store_keys) // 2,
                -1,  # no outputs: none expected
                *tail,
                *store_args,
            )
        return list(pipe.execute())

    def _finish_write(self, tw: _TaskWrite, replies: list[Any]) -> None:
        """A task's write done: what it committed noted, or FencedError for a refusal."""
        job, task_name, a = tw.job, tw.task, tw.layout.anchor
        for i, r in enumerate(replies):
            if isinstance(r, Exception):  # a script that failed inside the MULTI/EXEC
                raise CheckpointError(f"task {task_name!r}: Redis at {self.where} refused its commit: {r}")
            if int(r[0]) == 4:  # (only an OUTPUT_COMMIT call, the first ones: i indexes tw.outs)
                key = text(tw.outs[i][1][int(r[1]) - 1])
                raise CheckpointError(
                    f"task {task_name!r}: Redis key {key} holds a {text(r[2])}, not a stream, so its "
                    f"outputs cannot be appended there; nothing of the commit was written (Redis at "
                    f"{self.where}: delete or rename that key, or send to another stream)"
                )
        reply = next((r for r in replies if int(r[0]) != 0), replies[0])
        code = int(reply[0])
        if code == 0:
            if self._committed is not None:
                self._committed.update(dict(tw.ids))
            if tw.outs:
                self._output_seq[task_name, self._values[a]] += len(tw.outs)
            return
        if code == 3:
            raise FencedError(
                f"job {job!r} task {task_name!r}: its outputs were appended by another owner since "
                f"(batch {text(reply[1])}); refusing to commit",
                partition=str(a),
            )
        if code == 1:
            ssp = tw.leases[int(reply[1]) - 1]
            self.fenced.add(ssp)
            raise FencedError(
                f"job {job!r}: lease {self._values[ssp]!r} is no longer held (another container owns the "
                f"partition, or the lease expired); refusing to commit task {task_name!r} "
                f"(offsets and state; anchor {a})",
                partition=str(ssp),
            )
        ssp, offset = tw.ids[int(reply[1]) - 1]
        self.fenced.add(ssp)
        raise FencedError(
            f"job {job!r}: refusing to move the committed offset back from {text(reply[2])} to {offset}",
            partition=str(ssp),
        )

    def _state_calls(
        self, job: str, task_name: str, state: StateChanges
    ) -> list[tuple[list[str], list[Any]]]:
        """The state changes cut into STATE_COMMIT calls of at most STATE_BATCH changes:
        (store keys, store arguments) per call; at least one call (offsets alone)."""
        calls: list[tuple[list[str], list[Any]]] = []
        keys: list[str] = []
        args: list[Any] = []
        room = STATE_BATCH
        for store, changes in state.items():
            if not changes:
                continue
            zkey, hkey = self._state_keys(job, task_name, store, claim=True)
            items = list(changes.items())
            i = 0
            while i < len(items):
                part = items[i : i + room]
                i += len(part)
                sets: list[bytes] = []
                dels: list[bytes] = []
                for key, value in part:
                    if not isinstance(key, bytes) or not (value is None or isinstance(value, bytes)):
                        raise CheckpointError(
                            f"task {task_name!r} store {store!r}: state keys and values must be bytes, "
                            f"got {type(key).__name__} -> {type(value).__name__}"
                        )
                    if value is None:
                        dels.append(key)
                    else:
                        sets += [key, value]
                keys += [zkey, hkey]
                args += [len(sets) // 2, len(dels), *sets, *dels]
                room -= len(part)
                if room == 0:
                    calls.append((keys, args))
                    keys, args, room = [], [], STATE_BATCH
        if keys or not calls:
            calls.append((keys, args))
        return calls

    def _output_calls(
        self, job: str, task_name: str, layout: _TaskLayout, records: list[Any]
    ) -> list[tuple[int, list[bytes], int, bytes]]:
        """A commit's held outputs (one batch per held producer: ``(stream keys, argument
        count, encoded arguments)``, ``_resp.Batch.take_body``) as one OUTPUT_COMMIT call:
        (batch number, stream keys, argument count, arguments), numbered on from the task's
        last appended batch (read from Redis once per task and lease). One call, so that it
        checks every stream before it appends to any."""
        if not records:
            return []
        held = (task_name, self._values.get(layout.anchor, ""))
        if held not in self._output_seq:
            try:
                raw = retrying(
                    partial(self.client.hget, layout.tckpt, "~outputs"),
                    f"reading the output batches of {task_name}",
                    deadline_s=self.retry_s,
                    stop=self._giving_up,
                )
            except connection_errors() as e:
                raise CheckpointError(f"task {task_name!r}: Redis at {self.where} is unreachable: {e}") from e
            self._output_seq[held] = 0 if raw is None else int(text(raw))
        seq = self._output_seq[held] + 1
        if len(records) == 1:
            keys, nargs, body = records[0]
            return [(seq, keys, nargs, body)]
        return [
            (
                seq,
                [k for keys, _, _ in records for k in keys],
                sum(nargs for _, nargs, _ in records),
                b"".join(body for _, _, body in records),
            )
        ]

    def _transaction(self, writes: list[_TaskWrite]) -> list[list[Any]]:
        """One MULTI/EXEC of every write's OUTPUT_COMMIT calls, then its STATE_COMMIT calls,
        written as RESP bytes on a connection of the store's own (the held entries are
        already encoded: redis-py would pack every argument again); each write's replies."""
        from ._resp import pack

        commands = [pack(("MULTI",))]
        for tw in writes:
            keys, head, tail = tw.keys, tw.head, tw.tail
            expect = tw.outs[-1][0] if tw.outs else -1  # the state calls run only after the outputs
            for seq, stream_keys, nargs, body in tw.outs:
                prefix = (
                    "EVAL",
                    self._scripts.output_commit.script,
                    len(keys) + len(stream_keys),
                    *keys,
                    *stream_keys,
                    *head,
                    len(stream_keys),
                    -1,  # (its own batch number follows the checks)
                    *tail,
                    seq,
                )
                packed = pack(prefix)
                header = b"*%d\r\n" % len(prefix)
                commands.append(b"*%d\r\n" % (len(prefix) + nargs) + packed[len(header) :] + body)
            for store_keys, store_args in tw.calls:
                commands.append(
                    pack(
                        (
                            "EVAL",
                            self._scripts.state_commit.script,
                            len(keys) + len(store_keys),
                            *keys,
                            *store_keys,
                            *head,
                            len(store_keys) // 2,
                            expect,
                            *tail,
                            *store_args,
                        )
                    )
                )
        commands.append(pack(("EXEC",)))
        conn = self._connection()
        try:
            conn.send_packed_command(commands)
            for _ in range(len(commands) - 1):  # OK, then QUEUED per call
                conn.read_response()
            replies = list(conn.read_response())
        except BaseException:
            conn.disconnect()  # the server drops a transaction whose connection closes
            raise
        out: list[list[Any]] = []
        at = 0
        for tw in writes:
            n = len(tw.outs) + len(tw.calls)
            out.append(replies[at : at + n])
            at += n
        return out

    def _connection(self) -> Any:
        """The store's own connection for its exactly-once transactions (made on first use)."""
        if self._conn is None:
            params = RespConnection.usable_for(self.client)
            self._conn = (
                RespConnection(params)
                if params is not None
                else self.client.connection_pool.make_connection()
            )
        return self._conn

    def _read_fence(
        self, job: str, task_name: str
    ) -> tuple[list[SystemStreamPartition], list[str], list[str]]:
        """The leases a read of ``task_name``'s state checks (rule 28, as its commits): those
        of its partitions in the state's slot that this store holds, as (partitions, keys,
        values); FencedError at once for one known lost."""
        layout = self._layout(task_name)
        ssps = [s for s in layout.local if s in self._values] if layout is not None else []
        for ssp in ssps:
            if ssp in self.fenced:
                raise FencedError(f"job {job!r} holds no lease on this partition", partition=str(ssp))
        keys = [self.keys.lease(s.stream, s.partition, job) for s in ssps]
        return ssps, keys, [self._values[s] for s in ssps]

    def _read_fenced(
        self, job: str, task_name: str, store: str, ssps: list[SystemStreamPartition], i: int
    ) -> None:
        """Lease ``i`` (1-based) of ``ssps`` is lost: FencedError, as a fenced commit's."""
        ssp = ssps[i - 1]
        value = self._values.get(ssp)
        self.fenced.add(ssp)
        raise FencedError(
            f"job {job!r}: lease {value!r} is no longer held (another container owns the partition, "
            f"or the lease expired); refusing to read store {store!r} of task {task_name!r}",
            partition=str(ssp),
        )

    def state_get(self, task_name: str, store: str, key: bytes) -> bytes | None:
        """The committed value of ``key``, read with the task's leases checked (one script
        call: a container that lost a lease never reads its successor's state). Any thread."""
        job = self._require_job()
        _, hkey = self._state_keys(job, task_name, store)
        ssps, lease_keys, values = self._read_fence(job, task_name)
        try:
            reply = retrying(
                partial(self._scripts.state_get, keys=[*lease_keys, hkey], args=[len(values), *values, key]),
                f"reading {store!r} of {task_name}",
                deadline_s=self.retry_s,
                stop=self._giving_up,
            )
        except connection_errors() as e:
            raise CheckpointError(
                f"task {task_name!r} store {store!r}: Redis at {self.where} is unreachable: {e}"
            ) from e
        if int(reply[0]) != 0:
            self._read_fenced(job, task_name, store, ssps, int(reply[1]))
        value = reply[1] if len(reply) > 1 else None
        return None if value is None else bytes(value)

    def state_scan(
        self, task_name: str, store: str, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Committed entries in key order, ``SCAN_BATCH`` per round trip (each batch
        read atomically; a commit between two batches may show in the later one). Any thread."""
        job = self._require_job()
        zkey, hkey = self._state_keys(job, task_name, store)
        return self._scan(job, task_name, store, zkey, hkey, start, end)

    def _scan(
        self,
        job: str,
        task_name: str,
        store: str,
        zkey: str,
        hkey: str,
        start: bytes | None,
        end: bytes | None,
    ) -> Iterator[tuple[bytes, bytes]]:
        low = b"-" if start is None else b"[" + start
        high = b"+" if end is None else b"(" + end
        limit = min(SCAN_BATCH, SCAN_LIMIT)
        while True:
            ssps, lease_keys, lease_values = self._read_fence(job, task_name)  # each batch (rule 28)
            try:
                reply = retrying(
                    partial(
                        self._scripts.state_scan,
                        keys=[*lease_keys, zkey, hkey],
                        args=[len(lease_values), *lease_values, low, high, limit],
                    ),
                    f"scanning {store!r} of {task_name}",
                    deadline_s=self.retry_s,
                    stop=self._giving_up,
                )
            except connection_errors() as e:
                raise CheckpointError(
                    f"task {task_name!r} store {store!r}: Redis at {self.where} is unreachable: {e}"
                ) from e
            if int(reply[0]) != 0:
                self._read_fenced(job, task_name, store, ssps, int(reply[1]))
            keys, values = reply[1], reply[2]
            for key, value in zip(keys, values):
                if value is not None:  # (a key without a value: only by tampering)
                    yield key, value
            if len(keys) < limit:
                return
            low = b"(" + keys[-1]

    def close(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self._own_leases is not None:
            self._own_leases.release_all()
            self._own_leases = None
        self._job = None
        self._forget_run()  # (``fenced`` stays readable until the next open: see __init__)
        if self._conn is not None:
            self._conn.disconnect()
            self._conn = None
        if self._own_client:
            try:
                self.client.close()
            except connection_errors():
                pass


def lease_values(leases: Leases, ssps: Iterable[SystemStreamPartition]) -> dict[SystemStreamPartition, str]:
    """The held lease values of ``ssps`` (those not held are left out)."""
    held = leases.held()
    return {s: held[s] for s in ssps if s in held}


__all__ = ["Leases", "RedisCheckpointStore"]
