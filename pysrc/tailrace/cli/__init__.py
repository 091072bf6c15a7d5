"""The ``tailrace`` command line: run a job file, inspect or reset its checkpoints.

Exit status: 0 after a graceful end (end of stream, shutdown request, Ctrl-C or
SIGTERM, including one that arrives while the job starts or after its summary),
1 when the job failed (task error, bad input, checkpoint error), 2 for a
configuration, usage or environment error (a state directory that cannot be
written), 128+N after a forced stop by a second signal N.

The modules, each importing only those listed after it (every one logs as
``tailrace.cli``):

- ``parsing``: the parser of every command, its ``--help`` texts, the argument types
- ``run``: ``tailrace run``: the checks every job passes, the path it takes, a job run
  as one container in this process
- ``run_containers``: ``--containers N`` of a file job (forks of this process)
- ``run_redis``, ``run_kafka``: a job as a member of a Redis job or of a Kafka group
- ``members``: what those two share (a member's metrics, N member processes)
- ``checkpoints``: ``tailrace checkpoints show|reset``; the offsets a run logs and prints
- ``load``: ``tailrace load``
- ``replay``: ``tailrace replay`` (dead letters back to their partitions)
- ``watch``: a run on its own thread while the main thread shows it and takes signals
- ``display``: the live view, the progress lines, the summary
- ``metrics_server``: ``--metrics-port``
- ``processes``: the container processes of ``--containers N``
- ``job``: the job a command names, and what kind it is
- ``failures``: an error's one line and exit status; a task failure's user frames
- ``text``: counts and rates as the commands write them
- ``signals``: SIGINT/SIGTERM, a forked container's parent death
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
from collections.abc import Sequence

from .checkpoints import SUMMARY_METADATA_TIMEOUT_S, cmd_reset, cmd_show
from .failures import _handled, describe_task_error, line_at_offset, user_frames
from .load import cmd_load
from .parsing import _help_width as _help_width  # tests reach it here
from .parsing import _parser
from .replay import cmd_replay
from .run import cmd_run
from .signals import _SIGNALS as _SIGNALS  # main's, and tests reach it here
from .signals import _die_with_parent as _die_with_parent  # tests reach it here

__all__ = [
    "SUMMARY_METADATA_TIMEOUT_S",
    "cmd_load",
    "cmd_replay",
    "cmd_reset",
    "cmd_run",
    "cmd_show",
    "console_main",
    "describe_task_error",
    "line_at_offset",
    "main",
    "user_frames",
]


def console_main() -> int:
    """The ``tailrace`` command (and ``python -m tailrace``): :func:`main`, then SIGINT and
    SIGTERM blocked for the rest of the process. Python puts the default handlers back
    while it shuts down, so a signal arriving then would kill the process (status -2 /
    -15) after a graceful run; blocked, it leaves the status ``main`` returned."""
    code = main()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    # the process ends now: its last collections need not scan every module (nothing of
    # the job is left to finalize; its outputs and stores were closed by the run)
    gc.freeze()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """The command line's work; returns the exit status (usable in-process: it leaves the
    signal mask alone)."""
    args = _parser().parse_args(argv)
    if args.command == "run":
        _SIGNALS.install()  # before anything slow: a stop while the job starts is graceful too
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return _handled(args, lambda: int(args.fn(args)))
