"""Several containers of one job sharing its Kafka partitions through the consumer group.

Each process runs one :class:`KafkaMember`. It subscribes to the job's input
topics with group id = the job name (unless the system names one) and lets
Kafka's group protocol assign partitions (``cooperative-sticky`` by default;
``group.instance.id`` in the consumer settings gives static membership). It
runs an ordinary :class:`~tailrace.container.Container` over the partitions the
group assigned to it (task N owns partition N of every input) and restarts that
container gracefully whenever the assignment changes:

- **assignment** (inside ``consume``, on the fetch thread): the new partitions
  are added paused, the running container is stopped gracefully (nothing is
  lost: it commits its low watermarks) and a new one starts over every owned
  partition; each reader resumes from the committed offset in the job's
  checkpoint store (its task's state store with it).
- **revocation** (cooperative: only the partitions that move): the member
  stops the running container, which stops dispatch, awaits outstanding work up
  to ``task.shutdown.ms`` and commits the watermarks (to the store, and to the
  Kafka group as ``offset + 1``); only then does the callback return and
  librdkafka release the partitions. The new owner resumes right after the last
  message this member processed: a healthy hand-over replays nothing.
- **loss** (session timeout, fenced static member): the partitions are dropped
  at once; commits for them are refused (see ``tailrace.kafka.checkpoint``).

With a Redis checkpoint store (several machines), the member also holds the
store's lease of every partition it runs (``tailrace.redis.checkpoint.Leases``,
renewed every ``lease_ms / 3``): it acquires them before a container starts
(waiting for a previous owner that neither released nor let them expire), and
releases them once a revoked partition's last commit is written. Every store
write checks the lease, so a member that lost a partition, by the group's word
or by its lease expiring, can never write offsets or state for it again (rule 28).

Rebalance callbacks block the consumer's poll while the container drains, so
``max.poll.interval.ms`` must exceed ``task.shutdown.ms`` (checked at start).

A stop is bounded by ``task.shutdown.ms`` even while Kafka (or Redis) is down: in-flight
work, the producer's flush, the final commit (to the group and the store) and leaving
all happen within it. At the deadline whatever still waits gives up, nothing more is
committed (no checkpoint past output Kafka did not acknowledge, rule 21), and ``run()``
raises CheckpointError saying which partitions were not committed: what a restart
processes again. Group commits are asynchronous, so a coordinator that vanished never
blocks the fetch thread, which keeps serving the group's callbacks.

Guarantee: at least once (rule 20); duplicates are bounded by what a container
processed after its last commit (a crash, kill -9 or lost membership).

The member's life (plan, run, re-plan, results, deadline, signals) is
:class:`tailrace.membership.MemberLifecycle`'s, shared with Redis members; this
module supplies the group's assignment, the Redis leases and what a fence means.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, parse_config
from ..container import EngineName
from ..errors import ConfigError
from ..interfaces import CheckpointStore, System
from ..membership import ContainerParts, MemberLifecycle, run_with_signals
from ..memory import MemoryCheckpointStore
from ..types import SystemStreamPartition, parse_system_stream
from .checkpoint import KafkaCheckpointStore
from .system import KafkaSystem

log = logging.getLogger("tailrace.kafka.membership")


@dataclass
class KafkaMemberSpec:
    """What one member runs.

    ``systems``: the job's systems; every input must be on a :class:`KafkaSystem`
    (they are kept open for the member's whole life: the consumer is its group
    membership). ``checkpoints``: the job's store (opened once per member; with
    several members it must be shared by them: Redis across machines, one
    in-process store for tests).
    """

    task: Any
    inputs: Sequence[str]
    systems: Sequence[System]
    checkpoints: CheckpointStore | None = None
    config: Mapping[str, Any] | Config = field(default_factory=dict)
    engine: EngineName = "c"
    default_output_system: str | None = None


@dataclass
class KafkaMemberResult:
    """What :meth:`KafkaMember.run` returns."""

    processed: int = 0  # messages processed by this member's containers
    skipped: int = 0  # bad input its containers skipped (skip_bad_lines of file inputs)
    runs: int = 0  # containers started
    assigned: int = 0  # partitions assigned to this member over its life
    revoked: int = 0  # partitions handed over gracefully
    lost: int = 0  # partitions lost without a hand-over
    fenced: int = 0  # containers stopped because a commit was fenced
    reason: str = "stop"


class KafkaMember(MemberLifecycle[SystemStreamPartition, KafkaMemberResult]):
    """One container process of a Kafka job (see the module docstring).

    ``run()`` blocks until ``stop()`` (any thread, signal handlers), a task's
    shutdown request, or an error (raised after the consumer left the group).
    """

    log = log  # the lifecycle's lines keep this module's logger
    spec: KafkaMemberSpec

    def __init__(self, spec: KafkaMemberSpec) -> None:
        self.spec = spec
        super().__init__(parse_config(spec.config), KafkaMemberResult())
        self.systems = {s.name: s for s in spec.systems}
        self.kafka: dict[str, KafkaSystem] = {}
        self.topics: dict[str, list[str]] = {}
        for name in spec.inputs:
            try:
                ss = parse_system_stream(name)
            except ValueError as e:
                raise ConfigError(str(e), key="inputs") from None
            system = self.systems.get(ss.system)
            if not isinstance(system, KafkaSystem):
                raise ConfigError(
                    f"input {name!r} is not on a kafka system (a Kafka member reads Kafka topics only)",
                    key="inputs",
                )
            self.kafka[system.name] = system
            self.topics.setdefault(system.name, []).append(ss.stream)
        if not self.kafka:
            raise ConfigError("a Kafka member needs at least one input", key="inputs")
        if len(self.kafka) > 1:
            raise ConfigError("a Kafka member reads from one kafka system", key="inputs")
        (self.system,) = self.kafka.values()
        cfg = self.system.consumer_config()
        max_poll = int(cfg.get("max.poll.interval.ms", 300000))
        if max_poll <= self.config.shutdown_ms:
            table = self.system.setting_table("max.poll.interval.ms", consumer=True)
            raise ConfigError(
                f"max.poll.interval.ms ({max_poll}) must exceed task.shutdown.ms "
                f"({self.config.shutdown_ms}): a revocation waits for outstanding work "
                "inside the consumer's poll",
                # as the job file spells it: the table it was set in, else task.shutdown.ms
                key=f"{table}.max.poll.interval.ms" if table else "task.shutdown.ms",
            )
        self.store = spec.checkpoints if spec.checkpoints is not None else MemoryCheckpointStore()
        self._redis = _redis_store(self.store)  # the job's Redis store: its client, keys and leases
        for system in self.systems.values():
            if isinstance(system, KafkaSystem):
                system.use_stop_deadline(self.deadline)
        self._leases: Any = None
        if self._redis is not None:
            from ..redis._io import abort_client
            from ..redis.checkpoint import Leases

            client = self._redis.client
            self.deadline.on_due(lambda: abort_client(client))

            self.member_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            self._leases = Leases(
                self._redis.client,
                self._redis.keys,
                self.job,
                self.member_id,
                int(self._redis.lease_ms),
                retry_s=float(self._redis.retry_s),
                stop=self.deadline.due,
            )
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._joined = False
        # (guarded by _cond)
        self._owned: set[SystemStreamPartition] = set()  # assigned and not revoked/lost
        self._revoking: set[SystemStreamPartition] = set()  # being handed over: no container may start
        self._error: BaseException | None = None  # a group callback's, raised by run()

    # -- ownership (fencing) --------------------------------------------------------
    def owned(self) -> set[SystemStreamPartition]:
        """The partitions this member may commit now. Any thread."""
        with self._cond:
            return set(self._owned)

    def _ssps(self, partitions: Sequence[Any]) -> list[SystemStreamPartition]:
        return [SystemStreamPartition(self.system.name, tp.topic, tp.partition) for tp in partitions]

    # -- group callbacks: on the fetch thread, inside consume() -----------------------
    def _on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        try:
            self.system.fetcher.group_assigned(partitions)
            ssps = self._ssps(partitions)
            log.info("member of %r: assigned %s", self.job, ", ".join(map(str, ssps)) or "nothing new")
            with self._cond:
                self._owned.update(ssps)
                self.result.assigned += len(ssps)
                if ssps:
                    self._replan = True
                    self._stop_container()
                self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - never raised into librdkafka: handed to run()
            self._fail(e)

    def _on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        try:
            ssps = set(self._ssps(partitions))
            log.info("member of %r: revoking %s", self.job, ", ".join(map(str, sorted(ssps))))
            with self._cond:
                self._replan = True
                self._revoking |= ssps
                if self._running & ssps:
                    self._stop_container()
                    # the container drains, commits (still owning ssps), and closes
                    # (its final commit to the group is served right here, on this thread)
                    deadline = time.monotonic() + self.config.shutdown_ms / 1000 + 30
                    while not (self._container is None or self._error is not None):
                        if time.monotonic() > deadline or self.deadline.due():
                            log.error("member of %r: container did not stop in time", self.job)
                            break
                        self._cond.wait(0.02)
                        self.system.fetcher.serve_commits(in_callback=True)
                self._owned -= ssps
                self._revoking -= ssps
                self.result.revoked += len(ssps)
                self._cond.notify_all()
            self._release(ssps)  # committed (or refused from now on): the new owner may take them
            self.system.fetcher.group_revoked(partitions)
        except BaseException as e:  # noqa: BLE001 - handed to run()
            self._fail(e)

    def _on_lost(self, _consumer: Any, partitions: list[Any]) -> None:
        try:
            ssps = set(self._ssps(partitions))
            log.warning("member of %r: lost %s (no hand-over)", self.job, ", ".join(map(str, sorted(ssps))))
            with self._cond:
                self._owned -= ssps  # first: from now on commits for them are refused
                self._replan = True
                self.result.lost += len(ssps)
                if self._running & ssps:
                    self._stop_container()
                self._cond.notify_all()
            self._release(ssps)
            self.system.fetcher.group_revoked(partitions)
        except BaseException as e:  # noqa: BLE001 - handed to run()
            self._fail(e)

    # -- Redis leases (a Redis checkpoint store only) -------------------------------------
    def _release(self, ssps: set[SystemStreamPartition]) -> None:
        if self._leases is not None:
            for ssp in sorted(ssps):
                self._leases.release(ssp)

    def _heartbeat(self) -> None:
        """Renew the leases every ``lease_ms / 3``; one lost (expired: this process was
        paused, or Redis unreachable) stops the container, whose commits the store now
        refuses, and the member takes the lease again before it runs the partition."""
        assert self._leases is not None
        while not self._heartbeat_stop.wait(self._leases.ttl_ms / 3000):
            try:
                lost = self._leases.renew()
            except Exception as e:  # noqa: BLE001 - retried at the next beat (the lease may still hold)
                log.warning("member of %r: renewing leases failed: %r", self.job, e)
                continue
            if lost:
                with self._cond:
                    self._replan = True
                    if self._running & lost:
                        self._stop_container()
                    self._cond.notify_all()

    def _acquire(self, owned: list[SystemStreamPartition]) -> bool:
        """Hold the lease of every partition in ``owned`` (and none other); False when the
        member must re-plan first (stopping, or the assignment changed meanwhile)."""
        leases = self._leases
        if leases is None:
            return True
        wanted = set(owned)
        self._release(set(leases.held()) - wanted)
        waiting_logged = False
        while True:
            missing = [s for s in owned if s not in leases.held()]
            missing = [s for s in missing if not leases.acquire(s)]
            if not missing:
                return True
            if not waiting_logged:
                log.info(
                    "member of %r: waiting for the Redis lease of %s (held by a previous owner; it "
                    "expires within %d ms)",
                    self.job,
                    ", ".join(map(str, missing)),
                    leases.ttl_ms,
                )
                waiting_logged = True
            with self._cond:
                if self._stopping or self._replan or self._error is not None:
                    return False
                self._cond.wait(0.1)

    def _fail(self, e: BaseException) -> None:
        log.error("member of %r: rebalance callback failed: %r", self.job, e)
        with self._cond:
            if self._error is None:
                self._error = e
            self._stopping = True
            self._stop_container()
            self._cond.notify_all()

    # -- the lifecycle's hooks ---------------------------------------------------------
    def run(self) -> KafkaMemberResult:
        """Join the group, run containers over assigned partitions until stopped, leave."""
        result = super().run()
        if self._error is not None:  # a group callback's, met while leaving
            raise self._error
        return result

    def _join(self) -> None:
        system = self.system
        if system.group_id is None:
            system.group_id = self.job
        system.keep_open = True
        system.fetcher.subscription = (
            self.topics[system.name],
            self._on_assign,
            self._on_revoke,
            self._on_lost,
        )
        if self._leases is None:
            self.store.open(self.job)
        else:
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeat, name="tailrace-kafka-leases", daemon=True
            )
            self._heartbeat_thread.start()
        try:
            for topic in self.topics[system.name]:
                # an input topic that is missing (or brokers that do not answer) is an error
                # now, naming it: a subscription would wait for it without a word
                system.topic_partitions(topic)
            system.fetcher.ensure_started()
        except BaseException:
            self._leave()
            raise
        self._joined = True
        log.info("member joining group %r for %s", system.group_id, self.spec.inputs)

    def _plan(self) -> list[SystemStreamPartition] | None:
        """What the group assigned, once it changed and no hand-over is in progress."""
        with self._cond:
            self._cond.wait_for(self._ready, 1.0)
            if self._error is not None:
                raise self._error
            if self._stopping:
                return None
            if not self._ready():
                return []
            self._replan = False
            return sorted(self._owned)

    def _ready(self) -> bool:
        """Time to (re)start a container (``_cond`` held): the assignment changed, and no
        hand-over is in progress (a revoke callback still needs the old container's commit)."""
        return self._stopping or (self._replan and bool(self._owned) and not self._revoking)

    def _prepare(self, owned: list[SystemStreamPartition]) -> ContainerParts | None:
        if not self._acquire(owned):
            return None  # re-plan first
        return owned, self.systems, self._checkpoints(owned)

    def _checkpoints(self, owned: list[SystemStreamPartition]) -> KafkaCheckpointStore:
        """The store of one container: the job's store (opened by the member), or with
        Redis a store that writes with this member's leases of ``owned``."""
        kafka = {self.system.name: self.system}
        r = self._redis
        if r is None:
            return KafkaCheckpointStore(self.store, kafka, owned=self.owned, shared=True)
        from ..redis.checkpoint import RedisCheckpointStore

        held = self._leases.held()
        inner = RedisCheckpointStore(
            r.url,
            cluster=r.cluster,
            prefix=r.keys.prefix,
            client=r.client,
            leases={s: held[s] for s in owned if s in held},
            lease_ms=r.lease_ms,
            retry_s=r.retry_s,
            stop_deadline=self.deadline,
        )
        return KafkaCheckpointStore(inner, kafka, owned=self.owned, redis_ids=True)

    def _may_start(self) -> bool:
        return not (self._stopping or self._replan or self._revoking)

    def _describe(self, owned: list[SystemStreamPartition]) -> str:
        return ", ".join(map(str, owned))

    def _fenced(self, store: CheckpointStore) -> None:
        """A commit refused (the group's generation or a lease moved on): the run loop
        runs what this member still owns again, taking its leases anew."""

    def _ended(self, owned: list[SystemStreamPartition], reason: str) -> None:
        if reason in ("shutdown", "end_of_stream"):
            log.info("member of %r: the job ended (%s); leaving", self.job, reason)
            self.result.reason = reason
            with self._cond:
                self._stopping = True

    def _leave(self) -> None:
        with self._cond:
            self._stopping = True
        system = self.system
        system.keep_open = False
        try:
            system.shutdown()  # leaves the group (a final revoke finds no container running)
        finally:
            self._heartbeat_stop.set()
            if self._heartbeat_thread is not None:
                self._heartbeat_thread.join()
            if self._leases is not None:
                self._leases.release_all()
            self.store.close()
            if self._joined:  # else it failed at start, and its error says so
                result = self.result  # what it processed counts in the run's summary
                log.info(
                    "member of %r left (%s): %s messages processed in %d container runs",
                    self.job,
                    result.reason,
                    f"{result.processed:,}",
                    result.runs,
                )

    def _unacknowledged(self) -> str | None:
        pending = sum(s.unacknowledged() for s in self.systems.values() if isinstance(s, KafkaSystem))
        return (
            f"{pending} output messages not acknowledged by Kafka (sent again after a restart)"
            if pending
            else None
        )


def _redis_store(store: CheckpointStore) -> Any:
    """``store`` when it is a RedisCheckpointStore (without importing Redis otherwise)."""
    if not type(store).__module__.startswith("tailrace.redis"):
        return None
    from ..redis.checkpoint import RedisCheckpointStore

    return store if isinstance(store, RedisCheckpointStore) else None


def run_kafka_member(spec: KafkaMemberSpec, *, handle_signals: bool = True) -> KafkaMemberResult:
    """Run one member until stopped; SIGINT/SIGTERM leave gracefully within
    ``task.shutdown.ms`` (on the main thread). Should the stop still hang past its
    deadline plus :data:`tailrace._stopping.GRACE_S` (5 s), the process exits with
    status 1 after printing what was not committed."""
    return run_with_signals(KafkaMember(spec), handle_signals=handle_signals)


__all__ = ["KafkaMember", "KafkaMemberResult", "KafkaMemberSpec", "run_kafka_member"]
