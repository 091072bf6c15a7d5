"""``tailrace run`` of a job with Kafka inputs: this process is a member of the job's
consumer group (see tailrace.kafka.membership), or starts ``--containers N`` members.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import ConfigError
from ..jobfile import JobSpec
from .checkpoints import _print_committed
from .job import _is_distributed, _store_text
from .members import _MemberView, _run_local_containers, _watch_member
from .metrics_server import _serve_prometheus
from .processes import _container_count
from .text import _count, _rate_text

log = logging.getLogger("tailrace.cli")


def _run_kafka(args: argparse.Namespace, spec: JobSpec) -> int:
    """Kafka inputs: run as a member of the job's consumer group (group id = the job's
    name; see tailrace.kafka.membership), or start ``--containers`` member processes.
    Several members of one job need one checkpoint store they all reach (Redis)."""
    from ..kafka.membership import KafkaMember, KafkaMemberSpec

    count = _container_count(args, spec)
    if count != 1:
        if not _is_distributed(spec):
            raise ConfigError(
                "several containers of one Kafka job need checkpoints they all reach "
                '([checkpoints] type = "redis"; a SQLite store admits one container per job)',
                key="checkpoints.type",
                source=str(spec.source),
            )
        return _run_local_containers(args, spec, count)
    try:
        member = KafkaMember(
            KafkaMemberSpec(
                spec.load_task(),
                inputs=list(spec.inputs),
                systems=list(spec.systems.values()),
                checkpoints=spec.checkpoint_store(),
                config=spec.config,
                engine=spec.engine,
                default_output_system=spec.default_output,
            )
        )
    except ConfigError as e:
        if e.source:
            raise
        raise ConfigError(e.reason, key=e.key, allowed=e.allowed, source=str(spec.source)) from e
    view = _MemberView(member)
    if args.metrics_port is not None:
        _serve_prometheus(view, args.metrics_port, args.metrics_host, spec.name)
    log.info(
        "running job %r (%s engine) from %s as a member of Kafka group %r; checkpoints: %s",
        spec.name,
        spec.engine,
        spec.source,
        member.system.group_id or spec.name,
        _store_text(spec),
    )
    result, seconds = _watch_member(args, spec, view, member)
    print(
        f"member of job {spec.name!r} left ({result.reason}) after {seconds:.2f} s: "
        f"{_rate_text(result.processed, seconds)} in {_count(result.runs, 'container run')}; partitions "
        f"assigned {result.assigned}, handed over {result.revoked}, lost {result.lost}, "
        f"commits refused {result.fenced}\n  {_count(result.skipped, 'bad line')} skipped",
        flush=True,
    )
    _print_committed(spec, sys.stdout)
    return 0
