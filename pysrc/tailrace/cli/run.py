"""``tailrace run``: the checks every job passes, the path it takes (Kafka, Redis, file
containers), and a job run as one container in this process.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from ..errors import ConfigError
from ..jobfile import JobSpec
from ..metrics import RunResult
from .checkpoints import _log_resume
from .display import _print_summary
from .job import _check_state_dir, _is_distributed, _is_kafka, _load, _store_text
from .metrics_server import _serve_prometheus
from .processes import _container_count
from .run_containers import _run_file_containers
from .run_kafka import _run_kafka
from .run_redis import _run_distributed
from .watch import _run_watched

log = logging.getLogger("tailrace.cli")


def cmd_run(args: argparse.Namespace) -> int:
    spec = _load(args)
    _check_file_inputs(spec)
    _check_state_dir(spec)
    if _is_kafka(spec):
        return _run_kafka(args, spec)
    if _is_distributed(spec):
        return _run_distributed(args, spec)
    count = _container_count(args, spec)
    if count != 1:
        return _run_file_containers(args, spec, count)
    container = spec.container()
    if args.metrics_port is not None:
        _serve_prometheus(container, args.metrics_port, args.metrics_host, spec.name)

    log.info(
        "running job %r (%s engine) from %s; checkpoints: %s",
        spec.name,
        spec.engine,
        spec.source,
        _store_text(spec),
    )
    _log_resume(spec)
    started = time.monotonic()
    result: RunResult = _run_watched(args, spec, container, container.run, container.stop)
    _print_summary(spec, container, result, time.monotonic() - started, sys.stdout)
    return 0


def _check_file_inputs(spec: JobSpec) -> None:
    """A file input whose directory does not exist (a misspelt stream in ``job.inputs``, or
    a wrong ``path``) is a configuration error (exit 2), said before anything is made or
    run. A stream directory that exists but is malformed (a partition gap, an unexpected
    file, mixed formats) is bad input, which the run reports (InputError, exit 1)."""
    from ..files import FileSystem

    for name in spec.inputs:
        sname, _, stream = name.partition(".")
        system = spec.systems.get(sname)
        if not isinstance(system, FileSystem) or not stream:
            continue
        if not system.path.is_dir():
            what = "is not a directory" if system.path.exists() else "does not exist"
            raise ConfigError(
                f"input {name!r}: the input directory {system.path} of system {sname!r} {what}",
                key=f"systems.{sname}.path",
                source=str(spec.source),
            )
        directory = system.path / stream
        if not directory.is_dir():
            what = "is not a directory" if directory.exists() else "does not exist"
            streams = sorted(e.name for e in system.path.iterdir() if e.is_dir() and e.name[0] != ".")
            raise ConfigError(
                f"input {name!r}: its stream directory {directory} {what}",
                key="job.inputs",
                allowed=", ".join(f"{sname}.{s}" for s in streams) or f"none: {system.path} holds no stream",
                source=str(spec.source),
            )
