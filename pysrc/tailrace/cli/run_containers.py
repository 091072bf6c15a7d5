"""``tailrace run`` of a file job in several containers (``--containers N`` /
``job.container.count``).

The parent loads the job (its task module too), forks one container per group of
tasks, then takes the job's lock (it opens the checkpoint store as one run of the job
would) and gives each container the word on a pipe. Container i runs the tasks whose
partition number is i mod N (Samza's round-robin grouping of tasks onto containers) as
an ordinary Container whose store is opened as container i (SqliteCheckpointStore.
as_container: it refuses to run under any process but the parent holding the lock).
A fork starts no interpreter and imports nothing again: a container costs no more CPU
than the work it does. Each container reports its result on a pipe; the parent prints
the summary once. A container that fails stops the others gracefully.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import os
import signal
import sys
import time
from typing import Any, TextIO

from ..container import load_engine
from ..errors import ConfigError
from ..jobfile import JobSpec
from ..metrics import RunResult
from ..types import SystemStreamPartition
from .checkpoints import _log_resume
from .failures import _handled
from .job import _store_text
from .metrics_server import _serve_prometheus
from .processes import _container_port, _ContainerProcesses, _count_key, _log_metrics_ports
from .signals import _SIGNALS, _die_with_parent, _libc
from .text import _count, _rate_text, bad_message_text
from .watch import _run_watched

log = logging.getLogger("tailrace.cli")


def _file_task_partitions(args: argparse.Namespace, spec: JobSpec) -> list[int]:
    """The partition numbers (= tasks) of a job whose inputs can be split over processes:
    file inputs, checkpoints in SQLite (or memory); ConfigError naming the key otherwise."""
    from ..files import FileSystem
    from ..types import parse_system_stream

    key = _count_key(args)
    kind = (spec.tree.get("checkpoints") or {"type": "sqlite"}).get("type", "sqlite")
    if kind not in ("sqlite", "memory"):
        raise ConfigError(
            f"a job with {kind} checkpoints cannot run in several containers",
            key=key,
            allowed='1, or [checkpoints] type = "sqlite" (or "redis")',
            source=str(spec.source),
        )
    numbers: set[int] = set()
    for name in spec.inputs:
        ss = parse_system_stream(name)
        system = spec.systems[ss.system]
        if not isinstance(system, FileSystem):
            raise ConfigError(
                f"input {name!r} is not a file input ({type(system).__name__}): its partitions live in "
                "this process and cannot be split over container processes",
                key=key,
                allowed="1 for this job; several containers need file inputs (or Redis checkpoints)",
                source=str(spec.source),
            )
        numbers.update(range(system.partitions(ss.stream)))
    for sname, system in spec.systems.items():
        if isinstance(system, FileSystem) and system.output_format != "jsonl":
            raise ConfigError(
                f"several containers append to shared output files, which needs JSON Lines outputs "
                f"(a partial {system.output_format} value of a killed container could not be found "
                "and cut)",
                key=f"systems.{sname}.output_format",
                allowed=f"jsonl with {key} > 1",
                source=str(spec.source),
            )
    return sorted(numbers)


def _container_inputs(spec: JobSpec, index: int, count: int) -> list[SystemStreamPartition]:
    """The input partitions of container ``index`` of ``count``: task N goes to N mod count."""
    from ..types import parse_system_stream

    out: list[SystemStreamPartition] = []
    for name in spec.inputs:
        ss = parse_system_stream(name)
        n = spec.systems[ss.system].partitions(ss.stream)
        out.extend(SystemStreamPartition(ss.system, ss.stream, p) for p in range(n) if p % count == index)
    return out


def _run_file_container(
    args: argparse.Namespace, spec: JobSpec, index: int, count: int, parent: int, result_fd: int
) -> int:
    """Container ``index`` of ``count`` (a fork of the parent, process ``parent``): the
    tasks ``index`` mod ``count``, the store opened as that container; no summary (the
    parent prints it), the result as JSON on ``result_fd``."""
    _die_with_parent(parent)
    store = spec.checkpoint_store()
    as_container = getattr(store, "as_container", None)
    if as_container is not None:
        as_container(index, parent)
    inputs = _container_inputs(spec, index, count)
    container = spec.container(inputs=inputs, checkpoints=store)
    if args.metrics_port is not None:
        _serve_prometheus(container, args.metrics_port, args.metrics_host, spec.name)
    started = time.monotonic()
    result: RunResult = _run_watched(args, spec, container, container.run, container.stop, keep_frozen=True)
    seconds = time.monotonic() - started
    report = {
        "processed": result.processed,
        "reason": result.reason,
        "seconds": seconds,
        "skipped": {str(ssp): n for ssp, n in container.skipped().items() if n},
        "failed": sum(t.failed for t in result.tasks.values()),
        "ignored": sum(t.ignored for t in result.tasks.values()),
        "bad_skipped": sum(t.skipped for t in result.tasks.values()),
        "dead_lettered": sum(t.dead_lettered for t in result.tasks.values()),
        "retried": sum(t.retried for t in result.tasks.values()),
        "cpu_s": sum(os.times()[:2]),
    }
    with os.fdopen(result_fd, "w") as f:
        json.dump(report, f)
    return 0


def _container_main(
    args: argparse.Namespace, spec: JobSpec, index: int, count: int, parent: int, go: int, result_fd: int
) -> int:
    """The life of a forked container: wait for the parent's word (one byte on ``go``,
    written once it holds the job's lock; end of file: it could not start the job and
    says why itself), then run as ``_run_file_container`` with the parent's options."""
    word = os.read(go, 1)
    os.close(go)
    if word != b"1":
        os.close(result_fd)
        return 0
    own = argparse.Namespace(**vars(args))
    # progress lines on a pipe (never a live view), unless --no-progress
    own.progress = None if args.progress is not False else False
    if args.metrics_port is not None:
        own.metrics_port = _container_port(args.metrics_port, index)
    return _handled(own, lambda: _run_file_container(own, spec, index, count, parent, result_fd))


def _stopped(code: int) -> bool:
    """A container ended by the stop we forwarded before it could take the signal itself
    (still starting: nothing processed, nothing to commit), not a failure."""
    return code == -signal.SIGTERM and _SIGNALS.received > 0


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _run_file_containers(args: argparse.Namespace, spec: JobSpec, count: int) -> int:
    """``--containers N`` of a file job (see the top of this section)."""
    numbers = _file_task_partitions(args, spec)
    groups = {i: [p for p in numbers if p % count == i] for i in range(count)}
    started_ids = [i for i in range(count) if groups[i]]
    if len(started_ids) < count:
        idle = [str(i) for i in range(count) if not groups[i]]
        log.info(
            "the job has %s: %s %s would have none and %s not started",
            _count(len(numbers), "task"),
            "container" if len(idle) == 1 else "containers",
            ", ".join(idle),
            "is" if len(idle) == 1 else "are",
        )
    # what every container needs, loaded once here: each is a fork of this process
    spec.load_task()
    try:
        load_engine(spec.engine)
    except ImportError:
        pass  # each container says so (spec.container)
    if sys.platform.startswith("linux"):
        try:
            _libc()
        except OSError:
            pass  # each container logs it (_die_with_parent)
    parent = os.getpid()
    children = _ContainerProcesses(count)
    results: dict[int, int] = {}  # container -> read end of its result pipe
    words: dict[int, int] = {}  # container -> write end of its go pipe, until the word is sent
    try:
        # fork before this process opens the store or starts a thread: a child inherits
        # neither an SQLite connection (SQLite forbids using one across fork) nor a lock.
        # What is loaded now stays out of the collector's reach in the containers: a
        # collection there would touch (and so copy) every page of it, and scan it each time
        gc.freeze()
        try:
            for i in started_ids:
                go_r, go_w = os.pipe()
                res_r, res_w = os.pipe()
                try:
                    body = functools.partial(_container_main, args, spec, i, count, parent, go_r, res_w)
                    children.fork(i, body, parent_fds=(go_w, res_r))
                finally:
                    os.close(go_r)
                    os.close(res_w)
                words[i], results[i] = go_w, res_r
        finally:
            gc.unfreeze()  # here, as before (the containers keep it frozen)
        lock = spec.checkpoint_store()
        lock.open(spec.name)  # the job's lock, held until every container ended: no other run overlaps
        try:
            log.info(
                "running job %r (%s engine) from %s in %d containers; checkpoints: %s",
                spec.name,
                spec.engine,
                spec.source,
                len(started_ids),
                _store_text(spec),
            )
            for i in started_ids:
                tasks = ", ".join(f"Partition {p}" for p in groups[i])
                log.info("container %d: tasks %s (pid %d)", i, tasks, children.procs[i].pid)
            _log_resume(spec)
            while words:
                i, w = words.popitem()
                os.write(w, b"1")
                os.close(w)
            return _watch_file_containers(args, spec, count, children, results, groups, lock)
        finally:
            lock.close()
    finally:
        for w in words.values():  # never got the word (the job could not start): they end at once
            os.close(w)
        for i in words:
            children.procs[i].wait()
        for r in results.values():
            try:
                os.close(r)
            except OSError:
                pass


def _watch_file_containers(
    args: argparse.Namespace,
    spec: JobSpec,
    count: int,
    children: _ContainerProcesses,
    results: dict[int, int],
    groups: dict[int, list[int]],
    lock: Any,
) -> int:
    started = time.monotonic()
    children.start_pumps()
    _log_metrics_ports(args, count)
    _SIGNALS.attach(children.terminate, force=children.terminate)
    failure: tuple[int, int] | None = None
    ended = children.watch()
    while True:
        ended.wait()
        ended.clear()
        codes = {i: p.returncode for i, p in children.procs.items()}
        if failure is None:
            failure = next(((i, c) for i, c in codes.items() if c and not _stopped(c)), None)
            if failure is not None:
                log.error(
                    "container %d (tasks %s) failed (%s): stopping the other containers gracefully",
                    failure[0],
                    ", ".join(f"Partition {p}" for p in groups[failure[0]]),
                    _exit_text(failure[1]),
                )
                children.terminate()
        if all(c is not None for c in codes.values()):
            break
    children.join_pumps()
    reports = {i: _read_report(r) for i, r in results.items()}
    exits = {i: p.wait() for i, p in children.procs.items()}
    if failure is not None:
        others = [f"container {i}: {_exit_text(c)}" for i, c in exits.items() if i != failure[0]]
        print(
            f"tailrace: error: container {failure[0]} of job {spec.name!r} (tasks "
            f"{', '.join(f'Partition {p}' for p in groups[failure[0]])}) failed ({_exit_text(failure[1])}); "
            f"the others were stopped gracefully ({'; '.join(others) or 'none'}). A rerun resumes every "
            "task after its last checkpoint",
            file=sys.stderr,
            flush=True,
        )
        return 1
    _print_containers_summary(spec, reports, lock, time.monotonic() - started, sys.stdout)
    return 0


def _read_report(fd: int) -> dict[str, Any]:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    try:
        report = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def _print_containers_summary(
    spec: JobSpec, reports: dict[int, dict[str, Any]], store: Any, seconds: float, out: TextIO
) -> None:
    for i, r in sorted(reports.items()):
        if r:
            log.info(
                "container %d: %s in %.2f s, CPU %.2f s",
                i,
                _count(int(r.get("processed", 0)), "message"),
                float(r.get("seconds", 0.0)),
                float(r.get("cpu_s", 0.0)),
            )
    log.info("this process (the parent): CPU %.2f s", sum(os.times()[:2]))
    processed = sum(int(r.get("processed", 0)) for r in reports.values())
    # no report: the container was stopped while it started (before it ran anything)
    reasons = sorted({str(r.get("reason", "stopped while starting")) for r in reports.values()})
    out.write(
        f"job {spec.name!r} finished ({', '.join(reasons)}) in {seconds:.2f} s: "
        f"{_rate_text(processed, seconds)} by {_count(len(reports), 'container')}\n"
    )
    skipped: dict[str, int] = {}
    for r in reports.values():
        skipped.update(r.get("skipped") or {})
    failed = sum(int(r.get("failed", 0)) for r in reports.values())
    ignored = sum(int(r.get("ignored", 0)) for r in reports.values())
    more = f", failed {failed}, ignored exceptions {ignored}" if failed or ignored else ""
    out.write(f"  {_count(sum(skipped.values()), 'bad line')} skipped{more}\n")
    bad = bad_message_text(
        *(
            sum(int(r.get(k, 0)) for r in reports.values())
            for k in ("bad_skipped", "dead_lettered", "retried")
        )
    )
    if bad:
        out.write(f"  {bad}\n")
    committed = getattr(store, "committed", None)
    offsets = (
        sorted((ssp, off) for per_task in committed().values() for ssp, off in per_task.items())
        if committed is not None
        else []
    )
    out.write("  committed offsets:\n" if offsets else "  no committed offsets\n")
    for ssp, off in offsets:
        extra = f"  ({skipped[str(ssp)]} skipped)" if skipped.get(str(ssp)) else ""
        out.write(f"    {ssp!s:<28} {off!s}{extra}\n")
    out.flush()
