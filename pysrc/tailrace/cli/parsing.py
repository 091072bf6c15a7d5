"""The command line's arguments: the parser of every command, its ``--help`` texts and the
argument types.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from ..config import describe_keys
from ..container import ENGINES
from ..jobfile import JOB_FILE
from .checkpoints import cmd_reset, cmd_show
from .load import cmd_load
from .processes import _MAX_PORT
from .replay import cmd_replay
from .run import cmd_run

_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


_KEYS_EPILOG = (
    'config keys: the job file\'s [config] table, keys quoted ("task.window.ms" = 1000),\n'
    "or --config KEY=VALUE. The job's name is [job] name (or --config job.name=NAME).\n"
    + describe_keys(skip=("job.name",))
)


def _version() -> str:
    from .. import __version__

    return __version__


def _log_level_option(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` after the subcommand too (it wins over one given before it)."""
    parser.add_argument("--log-level", default=argparse.SUPPRESS, choices=_LEVELS, help="log level")


def _config_option(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--config KEY=VALUE``, repeatable: the job file as ``run`` reads it."""
    parser.add_argument(
        "--config",
        "-c",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (or a job.*, systems.<name>.*, stores.<name>.* or checkpoints.* entry); "
        f"repeatable{what}",
    )


@functools.cache
def _help_width() -> int:
    """What argparse's formatters would compute (``shutil.get_terminal_size().columns - 2``),
    once: argparse makes a formatter for every argument it adds (to check it), each asking
    the terminal again, and importing shutil for it costs every run a few ms."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns if columns > 0 else 80) - 2


class _Formatter(argparse.HelpFormatter):
    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, _help_width() if width is None else width)


class _RawFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailrace",
        description="Run tailrace stream-processing jobs described by a job file (TOML).",
        epilog=_KEYS_EPILOG,
        formatter_class=_RawFormatter,
    )
    p.add_argument("--log-level", default="INFO", choices=_LEVELS, help="log level (default INFO)")
    p.add_argument("--version", action="version", version=f"tailrace {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    job_help = f"the job file (TOML, or a .py defining `job`), or a directory holding {JOB_FILE}"
    run = sub.add_parser(
        "run",
        help="run a job until its input ends or it is stopped",
        description="Run a job. Each partition resumes after its committed offset. Ctrl-C or SIGTERM "
        "stops gracefully (in-flight work finishes, a final checkpoint is written); a second Ctrl-C "
        "forces an immediate stop (a restart then replays what came after the last checkpoint).",
        epilog=_KEYS_EPILOG,
        formatter_class=_RawFormatter,
    )
    run.add_argument("job", metavar="JOB", help=job_help)
    _log_level_option(run)
    run.add_argument(
        "--engine", choices=sorted(ENGINES), help="run loop engine (default: the job file's, else c)"
    )
    _config_option(run)
    prog = run.add_mutually_exclusive_group()
    prog.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="live progress display (default when stderr is a terminal)",
    )
    prog.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="neither live display nor periodic progress lines (the final summary is still printed)",
    )
    run.add_argument(
        "--progress-interval",
        type=_positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="seconds between progress log lines when not on a terminal (default 5)",
    )
    run.add_argument(
        "--containers",
        type=int,
        default=None,
        metavar="N",
        help="start N container processes sharing the job's tasks (default: the config key "
        "job.container.count, else 1); file jobs: task N runs in container N mod count",
    )
    run.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics on this port (needs the extra: pip install 'tailrace[prometheus]'); "
        "with --containers N, container i serves on PORT+i; 0: a free port, each container its own",
    )
    run.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        metavar="HOST",
        help="address the metrics server listens on (default 0.0.0.0; 127.0.0.1 for this machine only)",
    )
    run.set_defaults(fn=cmd_run)

    cp = sub.add_parser(
        "checkpoints", help="show or reset a job's committed offsets", formatter_class=_Formatter
    )
    cps = cp.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = cps.add_parser(
        "show", help="print the committed offset of every partition", formatter_class=_Formatter
    )
    show.add_argument("job", metavar="JOB", help=job_help)
    _config_option(show, ": give those of the run (job.name, checkpoints.*) to find its checkpoints")
    _log_level_option(show)
    show.set_defaults(fn=cmd_show)
    reset = cps.add_parser(
        "reset",
        help="delete the job's checkpoints: the next run starts every input from the beginning",
        formatter_class=_Formatter,
    )
    reset.add_argument("job", metavar="JOB", help=job_help)
    _config_option(reset, ": give those of the run (job.name, checkpoints.*) to find its checkpoints")
    _log_level_option(reset)
    reset.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(fn=cmd_reset)

    load = sub.add_parser(
        "load",
        help="append a file (JSON Lines or text) to a Redis input stream of a job, pipelined",
        description="Append every line of FILE to a stream of the job's Redis system, 1,000 per round "
        "trip. A message goes to the partition of its key (--key-field: every message must have it), "
        "else round robin. A stream that has ended (an end marker) is refused.",
        formatter_class=_Formatter,
    )
    load.add_argument("job", metavar="JOB", help=job_help)
    load.add_argument("file", metavar="FILE", help="a .jsonl (one JSON value a line) or .txt file")
    load.add_argument("--stream", metavar="SYSTEM.STREAM", help="the stream (default: the job's only input)")
    load.add_argument("--format", choices=["jsonl", "text"], help="default: text for .txt, else jsonl")
    load.add_argument(
        "--key-field",
        metavar="FIELD",
        help="JSON field whose value is the message key; a message without it stops the load",
    )
    load.add_argument(
        "--partitions",
        type=_positive_int,
        metavar="N",
        help="create the stream with N partitions if Redis lacks it",
    )
    load.add_argument(
        "--batch", type=_positive_int, default=1000, metavar="N", help="messages per round trip"
    )
    load.add_argument("--end", action="store_true", help="then append the end-of-stream marker")
    _log_level_option(load)
    load.set_defaults(fn=cmd_load)

    replay = sub.add_parser(
        "replay",
        help="append dead letters' original messages to the partitions they came from",
        description="Read the dead letters of a job (task.error.policy = dead-letter) from DEAD_LETTERS "
        "and append each one's original message (its 'bytes', else its 'value' as JSON) to the partition "
        "it came from (the letter's system, stream and partition) in the job's own system: a line at the "
        "end of a file input's partition file, an entry of a Redis stream, a record of a Kafka topic "
        "partition. The job reads them after its committed offsets, like any new message. Every letter is "
        "checked first: one that cannot be replayed (no coordinates, a system or partition the job lacks) "
        "stops the command, naming its file and line, before anything is appended. A message "
        "dead-lettered twice (the same partition and offset: a crash between the dead letter and the "
        "commit) is appended once. Replaying the same dead letters twice appends them twice: move them "
        "aside once replayed. See docs/bad-messages.md.",
        formatter_class=_Formatter,
    )
    replay.add_argument("job", metavar="JOB", help=job_help)
    replay.add_argument(
        "dead_letters",
        metavar="DEAD_LETTERS",
        help="a file of dead letters (.jsonl, one a line) or a file stream directory of them "
        "(partition-N.jsonl files, such as data/dead-letters for task.error.stream = files.dead-letters)",
    )
    replay.add_argument(
        "--stream",
        metavar="SYSTEM.STREAM",
        help="append to this stream of the job instead (its partition: the letter's, modulo the "
        "stream's partition count)",
    )
    replay.add_argument(
        "--dry-run", action="store_true", help="check the letters and print the counts; append nothing"
    )
    _config_option(replay, ": give those of the run (systems.*) to find its streams")
    _log_level_option(replay)
    replay.set_defaults(fn=cmd_replay)
    return p


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {text!r}") from None
    if not 0 <= value <= _MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value
