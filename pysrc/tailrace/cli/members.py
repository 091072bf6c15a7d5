"""What the Redis and Kafka paths of ``tailrace run`` share: the metrics of a member's
current container, and ``--containers N`` as N ``tailrace run`` member processes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import Any

from ..container import Container
from ..jobfile import JobSpec
from ..metrics import TaskMetrics
from ..types import SystemStreamPartition
from .checkpoints import _print_committed
from .processes import _ContainerProcesses, _log_metrics_ports, _metrics_argv
from .signals import _SIGNALS
from .watch import _run_watched

log = logging.getLogger("tailrace.cli")


class _MemberView:
    """The metrics of a member's current container, Redis or Kafka (none between rebalances)."""

    def __init__(self, member: Any) -> None:
        self.member = member

    def _container(self) -> Container | None:
        return getattr(self.member, "_container", None)

    def metrics(self) -> tuple[dict[str, TaskMetrics], Any] | None:
        c = self._container()
        return None if c is None else c.metrics()

    def skipped(self) -> dict[SystemStreamPartition, int]:
        c = self._container()
        return {} if c is None else c.skipped()


def _watch_member(
    args: argparse.Namespace, spec: JobSpec, view: _MemberView, member: Any
) -> tuple[Any, float]:
    """Run a Redis or Kafka member under the live view (or progress lines) until it leaves:
    its result and the seconds it ran."""
    from .._stopping import arm_backstop

    started = time.monotonic()
    result = _run_watched(args, spec, view, member.run, member.stop, lambda done: arm_backstop(member, done))
    return result, time.monotonic() - started


def _member_argv(args: argparse.Namespace) -> list[str]:
    # a member's output is a pipe: progress lines every --progress-interval, as a file job's
    # containers log them (none with --no-progress)
    if args.progress is False:
        progress = ["--no-progress"]
    else:
        progress = ["--progress-interval", repr(args.progress_interval)]
    argv = [sys.executable, "-m", "tailrace", "--log-level", args.log_level, "run", args.job, *progress]
    if args.engine:
        argv += ["--engine", args.engine]
    for item in args.config:
        argv += ["--config", item]
    return argv


def _run_local_containers(args: argparse.Namespace, spec: JobSpec, count: int) -> int:
    """``--containers N`` of a Redis job: N member processes sharing the partitions by
    lease (see tailrace.redis.membership); each output line is prefixed with its
    container's index."""
    argv = [*_member_argv(args), "--containers", "1"]  # a member never starts members itself
    children = _ContainerProcesses(count)
    for i in range(count):
        children.start(i, argv + _metrics_argv(args, i), {"TAILRACE_MEMBER_INDEX": str(i)})
    _log_metrics_ports(args, count)
    _SIGNALS.attach(children.terminate, force=children.terminate)  # a second SIGTERM force-stops each
    codes = [p.wait() for p in children.procs.values()]
    children.join_pumps()
    failed = [c for c in codes if c != 0]
    if failed:
        log.error("%d of %d containers failed (exit codes %s)", len(failed), count, codes)
    _print_committed(spec, sys.stdout)
    return _members_exit(codes)


def _members_exit(codes: list[int]) -> int:
    """The parent's exit status from its members' (the statuses of running-jobs.md): 0 when
    every member ended gracefully; 2 when one refused the configuration; 128+N when the
    user forced the stop with a second signal N; else 1 (a member failed, or was killed: a
    kill -9 is -9 here, never an exit status of its own)."""
    failed = [c for c in codes if c != 0]
    if not failed:
        return 0
    if 2 in failed:
        return 2
    forced = [c for c in failed if c in (128 + signal.SIGINT, 128 + signal.SIGTERM)]
    if forced and _SIGNALS.received > 1:
        return forced[0]
    return 1
