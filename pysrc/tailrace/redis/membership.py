"""Several containers of one job sharing its partitions through Redis.

Each process runs one :class:`Member`. Members register in a sorted set
(``PREFIX:{job:JOB}:members``, score = heartbeat expiry on the server's clock)
and agree, without talking to each other, on a deterministic assignment:
partition ``p`` belongs to the ``(p mod n)``-th live member (ids sorted). A
member works on a partition only while it holds the partition's lease (``SET NX
PX`` with a fencing token from ``INCR``, renewed every heartbeat); every
checkpoint write checks that lease (see ``tailrace.redis.checkpoint``), so two
containers never commit for the same partition, and a container that lost a
lease (crash, pause, network split) can never commit for it again.

A member runs an ordinary :class:`~tailrace.container.Container` over the
partitions it owns. When membership changes or a lease is lost, it stops that
container gracefully (in-flight work finishes, the final commit runs, fenced
for lost partitions), releases what is no longer assigned to it, acquires what
is newly assigned once the previous owner released it or its lease expired, and
starts a new container. A crashed member's partitions move after ``lease_ms``.
Guarantee: at least once (rule 20); duplicates are bounded by what a container
processed after its last commit.

A partition whose input ended (end-of-stream entry, see ``RedisSystem.end_stream``)
and was committed to its end is marked done; with ``exit_when_done`` every member
exits once every partition of the job is done.

The member's life (plan, run, re-plan, results, deadline, signals) is
:class:`tailrace.membership.MemberLifecycle`'s, shared with Kafka members; this
module supplies the assignment, the leases and what a fenced lease means.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..config import parse_config
from ..container import EngineName
from ..errors import CheckpointError, ConfigError
from ..interfaces import CheckpointStore, System
from ..membership import ContainerParts, MemberLifecycle, run_with_signals
from ..types import SystemStreamPartition, parse_system_stream
from ._io import (
    DEFAULT_URL,
    Keys,
    Scripts,
    abort_client,
    check,
    connect,
    connection_errors,
    redact,
    retrying,
    text,
)
from .checkpoint import Leases, RedisCheckpointStore
from .system import RedisSystem

log = logging.getLogger("tailrace.redis.membership")


@dataclass
class MemberSpec:
    """What one member runs.

    ``systems`` is called for every container a member starts (a container closes
    its systems when it ends). ``url``/``cluster``/``prefix`` locate the Redis that
    holds checkpoints, leases and membership (it need not hold the input streams).
    ``lease_ms`` bounds how long a crashed member's partitions wait for a new owner;
    every ``heartbeat_ms`` a member renews its leases and its membership entry, and
    in between, every 100 ms (``Member.WATCH_S``), it looks at the membership and at
    partitions assigned to it that another member still held: a join or a graceful
    leave is acted on within about 100 ms, and a released partition taken over as
    promptly (a member with nothing to run plans again after 10 ms, then less often,
    up to every 100 ms: ``Member.IDLE_WATCH_S``).
    """

    task: Any
    inputs: Sequence[str]
    systems: Callable[[], Sequence[System]]
    url: str = DEFAULT_URL
    cluster: bool = False
    prefix: str = "tr"
    config: Mapping[str, Any] = field(default_factory=dict)
    engine: EngineName = "c"
    default_output_system: str | None = None
    lease_ms: int = 10000
    heartbeat_ms: int | None = None  # default: lease_ms / 3, at most 1000
    member_id: str | None = None
    exit_when_done: bool = True
    retry_s: float = 60.0  # every Redis call of the member: its systems', checkpoints, leases, membership


@dataclass
class MemberResult:
    """What :meth:`Member.run` returns."""

    member: str
    processed: int = 0  # messages processed by this member's containers
    skipped: int = 0  # bad input its containers skipped (skip_bad_lines of file inputs)
    runs: int = 0  # containers started
    fenced: int = 0  # containers stopped because a commit was fenced
    done: list[int] = field(default_factory=list)  # partitions this member finished
    reason: str = "stop"  # "stop" or "done" (every partition of the job is done)


class Member(MemberLifecycle[int, MemberResult]):
    """One container process of a distributed job (see the module docstring).

    ``run()`` blocks until ``stop()`` (any thread, signal handlers) or, with
    ``exit_when_done``, until every partition is done. Raises CheckpointError
    naming the URL when Redis does not answer at start, and the container's error
    (TaskError, ...) when user code fails; leases are released either way.

    A stop is bounded by ``task.shutdown.ms`` even while Redis is down or paused:
    in-flight work, the final flush and commit, releasing leases and leaving all
    happen within it; at the deadline every retry gives up, calls blocked on Redis
    are aborted, and ``run()`` raises CheckpointError saying which partitions were
    not committed (what a restart processes again).
    """

    WATCH_S = 0.1  # between heartbeats, how often membership and wanted partitions are looked at
    # with nothing to run, the first wait before planning again (then doubled, up to WATCH_S):
    # a member whose partitions are done sees the others' end within this of it
    IDLE_WATCH_S = 0.01
    log = log  # the lifecycle's lines keep this module's logger
    spec: MemberSpec

    def __init__(self, spec: MemberSpec) -> None:
        if spec.lease_ms < 100:
            raise ConfigError(f"{spec.lease_ms} is too short", key="lease_ms", allowed="an integer >= 100")
        self.spec = spec
        self.heartbeat_s = (spec.heartbeat_ms or min(spec.lease_ms // 3, 1000)) / 1000
        if not 0 < self.heartbeat_s * 1000 <= spec.lease_ms / 2:
            raise ConfigError(
                f"heartbeat_ms {spec.heartbeat_ms} must be positive and at most half of lease_ms",
                key="heartbeat_ms",
            )
        config = parse_config(spec.config)
        self.id = spec.member_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if "|" in self.id:
            raise ConfigError(f"member id {self.id!r} must not contain '|'", key="member_id")
        super().__init__(config, MemberResult(self.id), member_id=self.id)
        self.keys = Keys(spec.prefix)
        self.client = connect(spec.url, cluster=spec.cluster)
        check(self.client, spec.url, CheckpointError)
        self._scripts = Scripts(self.client)
        self.deadline.on_due(lambda: abort_client(self.client))
        self.leases = Leases(
            self.client,
            self.keys,
            self.job,
            self.id,
            spec.lease_ms,
            retry_s=spec.retry_s,
            stop=self.deadline.due,
        )
        self.groups = self._resolve_partitions()
        self._members: list[str] = []  # (guarded by _cond)
        self._done: set[int] = set()
        self._systems: list[System] = []
        self._hb_failures = 0  # heartbeats failed in a row (the first is logged, the rest counted)
        self._idle_wait = self.IDLE_WATCH_S  # the next wait of a plan with nothing to run
        self._lease_lock = threading.Lock()
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None

    def _resolve_partitions(self) -> dict[int, list[SystemStreamPartition]]:
        systems = {s.name: s for s in self.spec.systems()}
        try:
            groups: dict[int, list[SystemStreamPartition]] = {}
            for spec in self.spec.inputs:
                try:
                    ss = parse_system_stream(spec)
                except ValueError as e:
                    raise ConfigError(str(e), key="inputs") from None
                system = systems.get(ss.system)
                if system is None:
                    raise ConfigError(f"input {spec!r} names unknown system {ss.system!r}", key="inputs")
                _check_redis_input(spec, system)
                for p in range(system.partitions(ss.stream)):
                    groups.setdefault(p, []).append(SystemStreamPartition(ss.system, ss.stream, p))
            if not groups:
                raise ConfigError("a distributed job needs at least one input", key="inputs")
            return groups
        finally:
            for s in systems.values():
                s.close()

    # -- membership and assignment ------------------------------------------------
    def _heartbeat(self, ttl_ms: int) -> list[str]:
        reply = self._scripts.heartbeat(keys=[self.keys.members(self.job)], args=[self.id, ttl_ms])
        return sorted(text(m) for m in reply)

    def _live_members(self) -> list[str]:
        """The live members, read only (between heartbeats)."""
        return sorted(text(m) for m in self._scripts.members(keys=[self.keys.members(self.job)]))

    def assigned(self, members: Sequence[str] | None = None) -> set[int]:
        """Partitions assigned to this member by the current membership (done ones excluded)."""
        live = sorted(members if members is not None else self._members)
        if self.id not in live:
            return set()
        me, n = live.index(self.id), len(live)
        return {p for p in self.groups if p % n == me and p not in self._done}

    def _owned(self, p: int) -> bool:
        held = self.leases.held()
        return all(s in held for s in self.groups[p])

    def _try_acquire(self, p: int) -> bool:
        with self._lease_lock:
            for ssp in self.groups[p]:
                if not self.leases.acquire(ssp):
                    return False
            return True

    def _release(self, p: int) -> None:
        with self._lease_lock:
            for ssp in self.groups[p]:
                self.leases.release(ssp)

    def _refresh_done(self) -> None:
        keys = [
            (p, self.keys.done(s.stream, s.partition, self.job))
            for p, ssps in self.groups.items()
            for s in ssps
        ]

        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)  # one round trip
            for _, k in keys:
                pipe.get(k)
            return list(pipe.execute())

        values = retrying(
            read,
            "reading done marks",
            deadline_s=self.spec.retry_s,
            stop=self.deadline.due,
        )
        undone = {p for (p, _), v in zip(keys, values) if v is None}
        self._done = set(self.groups) - undone

    def _mark_done(self, partitions: Sequence[int]) -> None:
        held = self.leases.held()
        for p in partitions:
            for s in self.groups[p]:
                value = held.get(s)
                if value is None:
                    continue
                keys = [
                    self.keys.lease(s.stream, s.partition, self.job),
                    self.keys.done(s.stream, s.partition, self.job),
                ]
                ok = retrying(
                    partial(self._scripts.mark_done, keys=keys, args=[value]),
                    f"marking {s} done",
                    deadline_s=self.spec.retry_s,
                    stop=self.deadline.due,
                )
                if int(ok) != 1:
                    log.warning(
                        "member %s: %s ended but its lease was lost before it was marked done", self.id, s
                    )
                    break
            else:
                self.result.done.append(p)
                log.info("member %s: partition %d done", self.id, p)

    def _restart(self, why: str) -> None:
        """Ask the running container to stop gracefully so that the loop re-plans."""
        log.info("member %s: rebalancing (%s)", self.id, why)
        with self._cond:
            self._replan = True
            self._cond.notify_all()
        self._stop_container()

    def _heartbeat_loop(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_s
        while not self._hb_stop.wait(min(self.WATCH_S, max(next_beat - time.monotonic(), 0.0))):
            if self.deadline.due():
                return  # a stop ran out of time: no more calls to an unresponsive Redis
            beat = time.monotonic() >= next_beat
            try:
                if beat:  # renew leases and membership
                    next_beat = time.monotonic() + self.heartbeat_s
                    members = self._heartbeat(self.spec.lease_ms)
                    lost = self.leases.renew()
                else:  # only look: has membership changed, or is a wanted partition free now?
                    members = self._live_members()
                    lost = set()
            except Exception as e:  # noqa: BLE001 - keep heartbeating; a dead heartbeat thread would lose leases
                if beat:  # (a failed look in between is retried quietly at the next tick)
                    self._heartbeat_failed(e, expected=isinstance(e, connection_errors()))
                continue
            if beat and self._hb_failures:
                log.info(
                    "member %s: heartbeat works again, after %s",
                    self.id,
                    _count(self._hb_failures, "failed heartbeat"),
                )
                self._hb_failures = 0
            with self._cond:
                changed = members != self._members
                self._members = members
                running = set(self._running)
            if self._stopping:
                continue
            if lost & {s for p in running for s in self.groups[p]}:
                self._restart("lease lost")
                continue
            wanted = self.assigned(members)
            if running - wanted:
                self._restart(f"members now {members}")
                continue
            if beat:
                gained = [p for p in sorted(wanted - running) if self._owned(p) or self._try_acquire(p)]
            elif changed or wanted - running:
                # between heartbeats, only partitions that just became free: one this
                # member already holds is the run loop's to start (it may be between
                # two containers right now)
                gained = [p for p in sorted(wanted - running) if not self._owned(p) and self._try_acquire(p)]
            else:
                continue
            if gained or (changed and not running):
                self._restart(f"acquired partitions {gained}" if gained else f"members now {members}")

    def _heartbeat_failed(self, e: BaseException, *, expected: bool) -> None:
        """Say the first failure of a run of failed heartbeats (one a second while Redis is
        down); count the others, said when it works again or when the member leaves."""
        self._hb_failures += 1
        if self._hb_failures == 1:
            log.warning(
                "member %s: heartbeat failed (%s: %s); retrying every %.1f s, further failures counted",
                self.id,
                type(e).__name__,
                e,
                self.heartbeat_s,
                exc_info=not expected and log.isEnabledFor(logging.DEBUG),
            )
        else:
            log.debug("member %s: heartbeat failed again (%s)", self.id, e, exc_info=not expected)

    # -- the lifecycle's hooks ------------------------------------------------------
    def _join(self) -> None:
        self._members = self._heartbeat(self.spec.lease_ms)
        log.info("member %s joined job %r (members: %s)", self.id, self.job, self._members)
        self._hb_thread = threading.Thread(
            target=self._heartbeat_loop, name="tailrace-member-heartbeat", daemon=True
        )
        self._hb_thread.start()

    def _plan(self) -> list[int] | None:
        """The partitions assigned to this member whose leases it holds (released: the
        others); ``[]`` after waiting for partitions others hold, or for the job's end."""
        if self._stopping:
            return None
        with self._cond:
            self._replan = False
        self._refresh_done()
        if self.spec.exit_when_done and self._done == set(self.groups):
            self.result.reason = "done"
            return None
        with self._cond:
            wanted = self.assigned()
        for p in sorted(set(self.groups) - wanted):
            self._release(p)
        owned = sorted(p for p in wanted if self._owned(p) or self._try_acquire(p))
        if not owned:
            # nothing to run: look again soon, then less often (IDLE_WATCH_S, doubling up to
            # WATCH_S), so that the job's end or a partition just let go is seen at once
            wait = self._idle_wait
            self._idle_wait = min(wait * 2, self.WATCH_S)
            with self._cond:
                self._cond.wait_for(lambda: self._replan or self._stopping, min(self.heartbeat_s, wait))
        else:
            self._idle_wait = self.IDLE_WATCH_S
        return owned

    def _prepare(self, owned: list[int]) -> ContainerParts:
        ssps = [s for p in owned for s in self.groups[p]]
        store = RedisCheckpointStore(
            self.spec.url,
            cluster=self.spec.cluster,
            prefix=self.spec.prefix,
            client=self.client,
            leases={s: v for s, v in self.leases.held().items() if s in set(ssps)},
            retry_s=self.spec.retry_s,
            stop_deadline=self.deadline,
        )
        systems = list(self.spec.systems())
        for system in systems:
            if isinstance(system, RedisSystem):  # one retry setting, one stop deadline
                system.retry_s = self.spec.retry_s
                system.use_stop_deadline(self.deadline)
        self._systems = systems
        return ssps, systems, store

    def _describe(self, owned: list[int]) -> str:
        return f"partitions {owned}"

    def _fenced(self, store: CheckpointStore) -> None:
        """Forget the leases the store found taken: the next plan acquires them anew."""
        assert isinstance(store, RedisCheckpointStore)
        with self._lease_lock:
            for ssp in store.fenced:
                self.leases.forget(ssp)

    def _ended(self, owned: list[int], reason: str) -> None:
        if reason == "end_of_stream":
            self._mark_done(owned)
        elif reason == "shutdown":
            log.info("member %s: the task requested shutdown; leaving", self.id)
            self._stopping = True

    def _leave(self) -> None:
        self._hb_stop.set()
        if self._hb_thread is not None:
            # (a heartbeat blocked on Redis is aborted at the stop's deadline)
            self._hb_thread.join(timeout=2.0 if self.deadline.due() else None)
        for p in list(self.groups):
            self._release(p)
        failed = f" ({_count(self._hb_failures, 'failed heartbeat')})" if self._hb_failures else ""
        if self.deadline.due():
            log.warning(
                "member %s: left without telling Redis%s; its leases and entry expire in %d ms",
                self.id,
                failed,
                self.spec.lease_ms,
            )
        else:
            try:
                self._heartbeat(0)  # leave: the others rebalance at their next heartbeat
            except connection_errors() as e:
                log.warning(
                    "member %s: could not leave cleanly (%s)%s; its entry expires", self.id, e, failed
                )
        self.client.close()
        log.info("member %s left job %r (%s)", self.id, self.job, self.result.reason)

    def _unreachable(self, e: Exception) -> Exception | None:
        if not isinstance(e, connection_errors()):
            return None
        if self.deadline.due():
            return CheckpointError(self.gave_up_message(f"Redis at {redact(self.spec.url)}: {e}"))
        return CheckpointError(
            f"Redis at {redact(self.spec.url)} stayed unreachable for {self.spec.retry_s} s: {e}"
        )

    def _unacknowledged(self) -> str | None:
        pending = sum(s.unacknowledged() for s in self._systems if isinstance(s, RedisSystem))
        return (
            f"{pending} output entries not acknowledged by Redis (sent again after a restart)"
            if pending
            else None
        )


def _count(n: int, word: str) -> str:
    return f"{n:,} {word if n == 1 else word + 's'}"


def run_member(spec: MemberSpec, *, handle_signals: bool = True) -> MemberResult:
    """Run one member until stopped or done (when called on the main thread with
    ``handle_signals``): the first SIGINT/SIGTERM leaves gracefully within
    ``task.shutdown.ms`` (see :class:`Member`), a second one exits at once (status
    128 + N, no final commit). Should the graceful stop still hang past its deadline
    plus :data:`tailrace._stopping.GRACE_S` (5 s), the process exits with status 1 after printing what was not
    committed."""
    member = Member(spec)
    stops = 0

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stops
        stops += 1
        name = signal.Signals(signum).name
        if stops > 1:
            print(f"\ntailrace: {name} again: forced stop", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        print(
            f"\ntailrace: {name}: leaving gracefully (final checkpoint, leases released) within "
            f"task.shutdown.ms = {member.config.shutdown_ms} ms; again to force",
            file=sys.stderr,
            flush=True,
        )
        member.stop()

    return run_with_signals(member, handle_signals=handle_signals, on_signal=on_signal)


def run_local_containers(
    n: int, command: Sequence[str], *, env: Mapping[str, str] | None = None
) -> list[int]:
    """Start ``n`` copies of ``command`` (each one member) and wait for all of them.

    Each copy gets ``TAILRACE_MEMBER_INDEX`` (0..n-1) in its environment. SIGINT and
    SIGTERM are forwarded (graceful leave). Returns the exit codes.
    """
    if n < 1:
        raise ConfigError(f"{n} is not a container count", key="--containers", allowed="an integer >= 1")
    procs: list[subprocess.Popen[bytes]] = []
    base = dict(os.environ if env is None else env)
    for i in range(n):
        procs.append(subprocess.Popen(list(command), env={**base, "TAILRACE_MEMBER_INDEX": str(i)}))

    def forward(sig: int, _frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    restore: list[tuple[signal.Signals, Any]] = []
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            restore.append((sig, signal.signal(sig, forward)))
    try:
        return [p.wait() for p in procs]
    finally:
        for sig, old in restore:
            signal.signal(sig, old)


def python_command(module: str, *args: str) -> list[str]:
    """``[sys.executable, "-m", module, *args]`` (for :func:`run_local_containers`)."""
    return [sys.executable, "-m", module, *args]


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds passed (tools and tests)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# -- the command line (tailrace run JOB [--containers N]) -----------------------------
def _check_redis_input(name: str, system: System) -> None:
    """ConfigError unless input ``name`` is on a Redis system: the members' checkpoints are
    Redis stream entry ids, kept with the partitions' leases."""
    if not isinstance(system, RedisSystem):
        raise ConfigError(
            f"input {name!r} is not on a redis system: Redis checkpoints keep the offsets of Redis "
            "streams (entry ids) with their leases; a file or memory job keeps its checkpoints in "
            'SQLite ([checkpoints] type = "sqlite"), a Kafka job in Redis as a Kafka member',
            key="inputs",
        )


def member_spec_from_job(job: Any, reload: Callable[[], Any]) -> MemberSpec:
    """A MemberSpec for a loaded job file (``tailrace.jobfile.JobSpec``) whose
    ``[checkpoints]`` table has ``type = "redis"``; ``reload()`` loads the job file
    again (each container gets freshly built systems)."""
    store = job.checkpoint_store()
    if not isinstance(store, RedisCheckpointStore):
        raise ConfigError(
            'several containers of one job need checkpoints in Redis ([checkpoints] type = "redis")',
            key="checkpoints.type",
            source=str(job.source),
        )
    store.close()
    for name in job.inputs:
        system = job.systems.get(name.split(".", 1)[0])
        if system is not None:
            try:
                _check_redis_input(name, system)
            except ConfigError as e:
                raise ConfigError(e.reason, key=e.key, source=str(job.source)) from None
    systems = job.tree.get("systems") if isinstance(getattr(job, "tree", None), dict) else None
    for name, table in (systems or {}).items():
        if isinstance(table, dict) and table.get("type") == "redis" and "retry_s" in table:
            raise ConfigError(
                "set retry_s in [checkpoints] instead: with Redis checkpoints it bounds every Redis "
                "call of the job (reads, writes, commits, leases, membership)",
                key=f"systems.{name}.retry_s",
                source=str(job.source),
            )
    return MemberSpec(
        task=job.load_task(),
        inputs=list(job.inputs),
        systems=lambda: list(reload().systems.values()),
        url=store.url,
        cluster=store.cluster,
        prefix=store.keys.prefix,
        config=job.config,
        engine=job.engine,
        default_output_system=job.default_output,
        lease_ms=int(store.lease_ms),
        retry_s=float(store.retry_s),
        exit_when_done=True,
    )


def run_cli(job: Any, reload: Callable[[], Any], containers: int, member_argv: Sequence[str]) -> int:
    """``tailrace run`` for a Redis-coordinated job: one member in this process, or
    (``containers`` > 1) that many member processes running ``member_argv``."""
    spec = member_spec_from_job(job, reload)
    if containers > 1:
        codes = run_local_containers(containers, member_argv)
        failed = [c for c in codes if c != 0]
        if failed:
            log.error("%d of %d containers failed (exit codes %s)", len(failed), containers, codes)
        return max((abs(c) for c in codes), default=0)
    result = run_member(spec)
    print(
        f"member {result.member} of job {job.name!r} left ({result.reason}): {result.processed:,} messages "
        f"processed in {result.runs} container runs; partitions finished here: {sorted(result.done)}",
        flush=True,
    )
    return 0


__all__ = [
    "Member",
    "MemberResult",
    "MemberSpec",
    "member_spec_from_job",
    "run_cli",
    "run_local_containers",
    "run_member",
]
