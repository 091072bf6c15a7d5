"""Checkpoints of Kafka inputs: the job's store, plus the Kafka group's commit.

:class:`KafkaCheckpointStore` wraps the job's own checkpoint store (SQLite on one
machine, Redis across machines, memory in tests): that store is authoritative
for where a partition resumes and keeps state atomic with offsets (rules 26-28).
Each write

1. refuses partitions this member does not own (``owned``: what the group
   assigned to it and has not revoked or lost) with FencedError;
2. commits the low watermarks of the Kafka inputs to the consumer group as
   ``offset + 1`` and waits for the answer: a member that the group coordinator no
   longer counts in the current generation gets ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID
   or FENCED_INSTANCE_ID, turned into FencedError, and writes nothing to the store;
   then checks ``owned`` again (a partition lost while the answer was awaited);
3. writes offsets (and state) to the job's store in its one atomic write.

What this fences, exactly: a member that was told it lost a partition (revoke
or lost callback) cannot commit it (step 1), and a member expelled from the
group (session timeout, a paused process) is refused by the coordinator at its
next commit (step 2). A member paused *between* steps 2 and 3 for longer than
the session timeout could still write a store that has no fencing of its own
once after the new owner started; with Redis as the store that window is closed
by the store's partition leases: a member holds the Redis lease of every
partition it runs (``tailrace.kafka.membership``), a new owner acquires it only
once the old one released it or it expired, and the store's write script
refuses a stale lease. With SQLite there is one container per job (the store's
lock refuses a second one), so nobody else can own the partition.

``redis_ids``: the store keeps Redis stream entry ids (``RedisCheckpointStore``),
so a Kafka offset ``n`` is stored as the id ``"0-n"`` (which orders like ``n``
in the store's never-backwards check) and read back as ``n``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from ..errors import CheckpointError, FencedError
from ..interfaces import CheckpointStore, CommitOutputs, StateChanges
from ..types import Offset, Offsets, SystemStreamPartition
from .system import KafkaSystem, _kafka

log = logging.getLogger("tailrace.kafka")

_FENCED_CODES = ("ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "FENCED_INSTANCE_ID", "STALE_MEMBER_EPOCH")


class KafkaCheckpointStore(CheckpointStore):
    """The job's ``store``, fenced by group ownership and mirrored to the Kafka group.

    ``owned``: returns the partitions this member may commit (None: every one, as
    for a plain Container that assigned its inputs itself). ``shared``: the
    member opened ``store`` and keeps it open across its containers, so ``open``
    and ``close`` leave it alone.
    """

    def __init__(
        self,
        store: CheckpointStore,
        systems: Mapping[str, KafkaSystem],
        *,
        owned: Callable[[], set[SystemStreamPartition]] | None = None,
        shared: bool = False,
        redis_ids: bool = False,
    ) -> None:
        self.store = store
        self.systems = dict(systems)
        self.owned = owned
        self.shared = shared
        self.redis_ids = redis_ids
        self.group_commit_failures = 0

    def open(self, job_name: str) -> None:
        if not self.shared:
            self.store.open(job_name)

    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        loaded = self.store.load(task_name)
        if not self.redis_ids:
            return loaded
        return {s: (_offset_of_id(s, o) if s.system in self.systems else o) for s, o in loaded.items()}

    def write(
        self,
        task_name: str,
        offsets: Offsets,
        state: StateChanges | None = None,
        outputs: CommitOutputs | None = None,
    ) -> None:
        if outputs:  # (refused at start-up: KafkaProducer.hold)
            raise CheckpointError("the Kafka checkpoint store cannot commit held outputs")
        self._check_owned(task_name, offsets)
        for system in self.systems.values():
            mine = {s: o for s, o in offsets.items() if s.system == system.name}
            if mine:
                self._commit_group(system, mine)
        # again: the group's answer can take seconds (a coordinator that is gone answers
        # at the session timeout), and the partition may have been lost meanwhile
        self._check_owned(task_name, offsets)
        if self.redis_ids:
            offsets = {s: (f"0-{int(o)}" if s.system in self.systems else o) for s, o in offsets.items()}
        if state is None:
            self.store.write(task_name, offsets)
        else:
            self.store.write(task_name, offsets, state)

    def _check_owned(self, task_name: str, offsets: Mapping[SystemStreamPartition, Offset]) -> None:
        if self.owned is None:
            return
        owned = self.owned()
        for ssp in offsets:
            if ssp.system in self.systems and ssp not in owned:
                raise FencedError(
                    f"{task_name}: this member no longer owns {ssp} (revoked or lost in a rebalance)",
                    partition=str(ssp),
                )

    def _commit_group(self, system: KafkaSystem, offsets: Mapping[SystemStreamPartition, Offset]) -> None:
        ck = _kafka()
        try:
            system.commit_group(offsets)
        except ck.KafkaException as e:
            err = e.args[0] if e.args else None
            name = err.name() if isinstance(err, ck.KafkaError) else ""
            if name in _FENCED_CODES and self.owned is not None:
                first = next(iter(offsets))
                raise FencedError(
                    f"the Kafka group refused the commit of {', '.join(map(str, offsets))}: {err} "
                    "(this member is no longer in the group's current generation)",
                    partition=str(first),
                ) from e
            # the group's copy only feeds lag tools; the job's store stays authoritative
            self.group_commit_failures += 1
            log.warning("committing %s to the Kafka group failed: %s", ", ".join(map(str, offsets)), e)

    def state_get(self, task_name: str, store: str, key: bytes) -> bytes | None:
        return self.store.state_get(task_name, store, key)

    def state_scan(
        self, task_name: str, store: str, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self.store.state_scan(task_name, store, start, end)

    def close(self) -> None:
        if not self.shared:
            self.store.close()


def _offset_of_id(ssp: SystemStreamPartition, value: Offset) -> int:
    """The Kafka offset kept as the Redis entry id ``"0-n"`` (see ``redis_ids``)."""
    text = value if isinstance(value, str) else str(value)
    head, sep, tail = text.partition("-")
    if sep and head == "0" and tail.isdigit():
        return int(tail)
    raise CheckpointError(f"checkpoint {value!r} of {ssp} is not a Kafka offset stored as '0-OFFSET'")


__all__ = ["KafkaCheckpointStore"]
