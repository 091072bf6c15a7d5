"""``tailrace run`` of a job whose checkpoints are in Redis: this process is a member of the
job (see tailrace.redis.membership), or starts ``--containers N`` members.
"""

from __future__ import annotations

import argparse
import sys

from ..jobfile import JobSpec
from .checkpoints import _print_committed
from .job import _load_spec
from .members import _MemberView, _run_local_containers, _watch_member
from .metrics_server import _serve_prometheus
from .processes import _container_count
from .text import _count, _rate_text


def _run_distributed(args: argparse.Namespace, spec: JobSpec) -> int:
    """Checkpoints in Redis: run as a member of the job (see tailrace.redis.membership),
    or start ``--containers`` member processes whose lines are prefixed ``[container i]``."""
    from ..redis.membership import Member, member_spec_from_job

    member_spec = member_spec_from_job(spec, lambda: _load_spec(args))  # checks [checkpoints] is Redis
    count = _container_count(args, spec)
    if count != 1:
        return _run_local_containers(args, spec, count)
    member = Member(member_spec)
    view = _MemberView(member)
    if args.metrics_port is not None:
        _serve_prometheus(view, args.metrics_port, args.metrics_host, spec.name)
    result, seconds = _watch_member(args, spec, view, member)
    print(
        f"member {result.member} of job {spec.name!r} left ({result.reason}) after {seconds:.2f} s: "
        f"{_rate_text(result.processed, seconds)} in {_count(result.runs, 'container run')}; partitions "
        f"finished here: {sorted(result.done)}\n  {_count(result.skipped, 'bad line')} skipped",
        flush=True,
    )
    _print_committed(spec, sys.stdout)
    return 0
