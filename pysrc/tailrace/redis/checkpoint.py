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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import CheckpointError, ConfigError, FencedError
from ..interfaces import CheckpointStore, StateChanges
from ..types import Offset, SystemStreamPartition
from ._io import (
    DEFAULT_URL,
    Keys,
    Scripts,
    StopDeadline,
    check,
    connect,
    connection_errors,
    entry_id,
    retrying,
    text,
)

log = logging.getLogger("tailrace.redis")


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
            log.warning("could not release %s (%r); it expires in %d ms", ssp, e, self.ttl_ms)

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
    Redis call of the job, its systems' included).

    ``stop_deadline``: once due (a member's graceful stop ran out of
    ``task.shutdown.ms``), writes give up at once instead of retrying.

    ``leases``: the lease values (``ssp -> "member|token"``) this container writes
    with, as held by a distributed member. Without it, ``inputs`` names the
    partitions and ``open`` acquires their leases itself (CheckpointError when
    another container holds one) and renews them on a thread until ``close``.

    ``write`` raises FencedError when a lease is no longer held with that value or
    an id would move backwards; CheckpointError when Redis stays unreachable.
    """

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
        self.fenced: set[SystemStreamPartition] = set()

    # -- CheckpointStore ----------------------------------------------------------
    def open(self, job_name: str) -> None:
        if self._given is None and not self._inputs:
            raise CheckpointError(
                "a Redis checkpoint store needs its partitions (leases= or inputs=); jobs with "
                '[checkpoints] type = "redis" run through tailrace.redis.membership (tailrace run does this)'
            )
        check(self.client, self.url, CheckpointError)
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
                    f"(Redis at {self.url}; a crashed container's lease expires after {self.lease_ms} ms)"
                )
        self._own_leases = leases
        self._values = leases.held()
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name="tailrace-redis-leases", daemon=True)
        self._renewer.start()

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
            raise CheckpointError(f"Redis at {self.url} is unreachable: {e}") from e
        out: dict[SystemStreamPartition, Offset] = {}
        for ssp, raw in zip(self._inputs, values):
            if raw is None:
                continue
            value = text(raw)
            try:
                entry_id(value, f"checkpoint of {ssp}")
            except ValueError as e:
                raise CheckpointError(f"corrupt checkpoint in Redis at {self.url}: {e}") from None
            out[ssp] = value
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
        offsets: Mapping[SystemStreamPartition, Offset],
        state: StateChanges | None = None,
    ) -> None:
        if state:  # state stores land in their own commit (issue: durable state)
            raise CheckpointError(f"{type(self).__name__} cannot store state yet")
        job = self._require_job()
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
            raise CheckpointError(f"task {task_name!r}: Redis at {self.url} is unreachable: {e}") from e
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

    def close(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self._own_leases is not None:
            self._own_leases.release_all()
            self._own_leases = None
        self._job = None
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
