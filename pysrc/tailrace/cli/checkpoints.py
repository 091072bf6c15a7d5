"""``tailrace checkpoints show|reset``, and the committed offsets a run logs when it starts
(``resuming from checkpoint``) and prints after a Redis or Kafka run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TextIO

from ..errors import ConfigError, InputError, TailraceError
from ..jobfile import JobSpec
from ..types import Offset, SystemStreamPartition
from .job import _check_state_dir, _is_distributed, _kafka_systems, _load, _store_text
from .text import _count

log = logging.getLogger("tailrace.cli")


def _redis_inputs(spec: JobSpec, missing: list[str] | None = None) -> list[SystemStreamPartition]:
    """Every input partition of a Redis-checkpointed job (asks each input's system). An input
    stream that does not exist yet is left out and described in ``missing`` when it is
    given (else its InputError is raised)."""
    from ..errors import CheckpointError
    from ..redis import RedisSystem
    from ..redis._io import connection_errors
    from ..types import parse_system_stream

    out: list[SystemStreamPartition] = []
    for name in spec.inputs:
        ss = parse_system_stream(name)
        system = spec.systems[ss.system]
        try:
            n = system.partitions(ss.stream)
        except connection_errors() as e:  # (retried for the system's retry_s first)
            where = system.where if isinstance(system, RedisSystem) else ss.system
            raise CheckpointError(f"Redis at {where} is unreachable: {e}") from e
        except InputError as e:
            if missing is None:
                raise
            if not isinstance(system, RedisSystem):
                missing.append(f"input {name} does not exist yet: {e}")
                continue
            stream = f" --stream {name}" if len(spec.inputs) > 1 else ""
            missing.append(
                f"input {name} does not exist yet: Redis at {system.where} has no stream {ss.stream!r}; "
                f"create it with: tailrace load {spec.source} FILE{stream} --partitions N"
            )
            continue
        out.extend(SystemStreamPartition(ss.system, ss.stream, p) for p in range(n))
    return out


def _redis_store_args(spec: JobSpec) -> tuple[str, bool, str]:
    store = spec.checkpoint_store()
    try:
        return str(store.url), bool(store.cluster), str(store.keys.prefix)  # type: ignore[attr-defined]
    finally:
        store.close()


def _committed(
    spec: JobSpec, missing: list[str] | None = None
) -> dict[str, dict[SystemStreamPartition, Offset]]:
    """Committed offsets per task (Redis jobs: per partition, under "Partition N"; an input
    stream that does not exist yet is described in ``missing``, see _redis_inputs)."""
    if _is_distributed(spec):
        from ..redis.tools import committed_offsets

        url, cluster, prefix = _redis_store_args(spec)
        per_task: dict[str, dict[SystemStreamPartition, Offset]] = {}
        kafka = _kafka_systems(spec)
        inputs = _redis_inputs(spec, missing)
        for ssp, off in committed_offsets(url, cluster, prefix, spec.name, inputs).items():
            if ssp.system in kafka:  # a Kafka offset N is kept in Redis as the id "0-N"
                from ..kafka.checkpoint import _offset_of_id

                off = _offset_of_id(ssp, off)
            per_task.setdefault(f"Partition {ssp.partition}", {})[ssp] = off
        return per_task
    store = spec.checkpoint_store()
    lister = getattr(store, "committed", None)
    if lister is None:
        store.close()
        raise ConfigError(
            f"checkpoint store type {type(store).__name__} cannot list checkpoints", key="checkpoints.type"
        )
    try:
        return lister(spec.name)
    finally:
        store.close()


def _log_resume(spec: JobSpec) -> None:
    try:
        committed = _committed(spec)
    except (ConfigError, TailraceError):
        return  # a store that cannot list (or a broken one: start-up reports it)
    offsets = {ssp: off for per_task in committed.values() for ssp, off in per_task.items()}
    if not offsets:
        log.info("no checkpoint yet: every input starts from the beginning")
        return
    shown = ", ".join(f"{ssp} after {off!r}" for ssp, off in sorted(offsets.items())[:8])
    more = f" (and {len(offsets) - 8} more)" if len(offsets) > 8 else ""
    log.info("resuming from checkpoint: %s%s", shown, more)


SUMMARY_METADATA_TIMEOUT_S = 3.0
"""How long the summary after a run waits for a Kafka topic's partition count, or retries
a Redis that does not answer."""


def _print_committed(spec: JobSpec, out: TextIO) -> None:
    """The committed offsets after a Redis run (the SQLite summary has them already)."""
    if os.environ.get("TAILRACE_MEMBER_INDEX") is not None:
        return  # a member process of --containers: the parent prints them once
    for system in spec.systems.values():  # a summary: not worth a long wait for a service that is down
        if hasattr(system, "metadata_timeout_s"):
            system.metadata_timeout_s = min(system.metadata_timeout_s, SUMMARY_METADATA_TIMEOUT_S)
        if hasattr(system, "retry_s"):
            system.retry_s = min(system.retry_s, SUMMARY_METADATA_TIMEOUT_S)
    try:
        committed = _committed(spec)
    except (ConfigError, TailraceError) as e:
        log.warning("cannot read the committed offsets: %s", e)
        return
    offsets = sorted((ssp, off) for per_task in committed.values() for ssp, off in per_task.items())
    out.write("  committed offsets:\n" if offsets else "  no committed offsets\n")
    for ssp, off in offsets:
        out.write(f"    {ssp!s:<28} {off!s}\n")
    out.flush()


def cmd_show(args: argparse.Namespace) -> int:
    spec = _load(args)
    _check_state_dir(spec, create=False)  # read only: creates nothing
    missing: list[str] = []
    committed = _committed(spec, missing)
    print(f"job {spec.name!r}, checkpoints: {_store_text(spec)}")
    for line in missing:
        print(f"  {line}")
    if not committed:
        path = None if _is_distributed(spec) else getattr(spec.checkpoint_store(), "path", None)
        if path is not None and not Path(path).exists():
            print(f"  no checkpoint store yet: {path} does not exist (no run has created it)")
        print("  no checkpoints: the next run starts every input from the beginning")
        return 0
    print(f"  {'task':<16} {'partition':<28} committed offset")
    for task, offsets in committed.items():
        for ssp, off in sorted(offsets.items()):
            print(f"  {task:<16} {ssp!s:<28} {off!s}")
    counts = _state_counts(spec)
    if not counts:
        print("  no state stores (nothing kept but the offsets)")
        return 0
    print(f"  {'task':<16} {'store':<28} state entries")
    for task, stores in counts.items():
        for store, n in stores.items():
            print(f"  {task:<16} {store:<28} {n:,}")
    return 0


def _state_counts(spec: JobSpec) -> dict[str, dict[str, int]]:
    """Entries per task and store of the job's state (committed with its offsets)."""
    if _is_distributed(spec):
        from ..redis.tools import state_counts

        url, cluster, prefix = _redis_store_args(spec)
        return state_counts(url, cluster, prefix, spec.name, _redis_inputs(spec, []))
    store = spec.checkpoint_store()
    try:
        counts = getattr(store, "state_counts", None)
        return {} if counts is None else dict(counts(spec.name))
    finally:
        store.close()


def _state_text(counts: dict[str, dict[str, int]]) -> str:
    """`` and 254 state entries of store 'counts'``: what a reset deletes besides the offsets."""
    per_store: dict[str, int] = {}
    for stores in counts.values():
        for store, n in stores.items():
            per_store[store] = per_store.get(store, 0) + n
    if not per_store:
        return "; it keeps no state"
    total = _count(sum(per_store.values()), "state entry", "state entries")
    if len(per_store) == 1:
        return f" and {total} of store {next(iter(per_store))!r}"
    each = ", ".join(f"{name!r} ({n:,})" for name, n in sorted(per_store.items()))
    return f" and {total} of stores {each}"


def cmd_reset(args: argparse.Namespace) -> int:
    spec = _load(args)
    _check_state_dir(spec, create=False)  # a job that never ran: nothing to create
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("refusing to reset checkpoints without confirmation; pass --yes")
        answer = input(
            f"delete every checkpoint of job {spec.name!r}, and the state of its stores "
            f"({_store_text(spec)})? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 0
    if _is_distributed(spec):
        from ..redis.tools import reset_checkpoints

        url, cluster, prefix = _redis_store_args(spec)
        missing: list[str] = []
        inputs = _redis_inputs(spec, missing)
        for line in missing:
            print(line)
        if not inputs:  # no run has read anything: nothing to delete, nothing to touch
            print(f"nothing to delete: no input stream of job {spec.name!r} exists yet")
            return 0
        state = _state_text(_state_counts(spec))
        n = reset_checkpoints(url, cluster, prefix, spec.name, inputs)
        print(
            f"deleted {_count(n, 'checkpoint')} of job {spec.name!r} (committed offsets{state}); "
            "the next run starts from the beginning"
        )
        return 0
    store = spec.checkpoint_store()
    path = getattr(store, "path", None)
    if path is not None and not Path(path).exists():  # never ran: nothing to delete, nothing created
        print(f"nothing to delete: {path} does not exist (no run of job {spec.name!r} has created it)")
        return 0
    reset = getattr(store, "reset", None)
    if reset is None:
        raise ConfigError(
            f"checkpoint store type {type(store).__name__} cannot be reset", key="checkpoints.type"
        )
    store.open(spec.name)  # takes the job's lock: refused while the job runs
    try:
        counts = getattr(store, "state_counts", None)
        state = _state_text({} if counts is None else counts())  # under the lock: what reset deletes
        n = reset()
    finally:
        store.close()
    print(
        f"deleted {_count(n, 'checkpoint row')} of job {spec.name!r} (committed offsets{state}); "
        "the next run starts from the beginning"
    )
    return 0
