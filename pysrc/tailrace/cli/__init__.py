"""The ``tailrace`` command line: run a job file, inspect or reset its checkpoints.

Exit status: 0 after a graceful end (end of stream, shutdown request, Ctrl-C or
SIGTERM, including one that arrives while the job starts or after its summary),
1 when the job failed (task error, bad input, checkpoint error), 2 for a
configuration, usage or environment error (a state directory that cannot be
written), 128+N after a forced stop by a second signal N.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import functools
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TextIO

from ..config import describe_keys
from ..container import ENGINES, Container, load_engine
from ..errors import ConfigError, InputError, SetupError, TailraceError, TaskError
from ..jobfile import JOB_FILE, JobSpec, load_job, parse_override
from ..metrics import RunResult, TaskMetrics
from ..types import Offset, SystemStreamPartition

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger("tailrace.cli")

_SHOWN_PARTITIONS = 16  # partitions listed in the live display


_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
_MAX_PORT = 65535
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
    return p


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


def _handled(args: argparse.Namespace, work: Callable[[], int]) -> int:
    """``work()``'s exit status, or the status and one clear line for the error it raised
    (a command, or a container of ``--containers N``)."""
    try:
        return work()
    except ConfigError as e:
        log.debug("config error", exc_info=True)
        spec = getattr(args, "spec", None)
        print(f"tailrace: config error: {spec.attributed(e) if spec is not None else e}", file=sys.stderr)
        return 2
    except SetupError as e:
        log.debug("environment error", exc_info=True)
        print(f"tailrace: error: {e}", file=sys.stderr)
        return 2
    except TaskError as e:
        if isinstance(e.original, ConfigError):  # tailrace's refusal, found once the task ran
            log.debug("config error found while running", exc_info=True)
            spec = getattr(args, "spec", None)
            original = spec.attributed(e.original) if spec is not None else e.original
            where = f"task {e.task!r}, {e.phase}" + (f" of {e.ssp}" if e.ssp is not None else "")
            print(f"tailrace: config error: {original} (found when {where} first used it)", file=sys.stderr)
            return 2
        log.debug("job failed", exc_info=True)
        print(describe_task_error(e, getattr(args, "spec", None)), file=sys.stderr)
        return 1
    except TailraceError as e:
        log.debug("job failed", exc_info=True)
        print(f"tailrace: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        log.debug("environment error", exc_info=True)
        print(f"tailrace: error: {_os_error_text(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # commands other than run (run stops gracefully instead)
        print("\ntailrace: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        _SIGNALS.finished = True  # the handler stays until exit: a late signal keeps this status


def _os_error_text(e: OSError) -> str:
    what = e.strerror or str(e)
    return f"{e.filename}: {what}" if e.filename else what


# -- signals --------------------------------------------------------------------
class _StopSignals:
    """SIGINT/SIGTERM of ``tailrace run``, handled from the start of ``main`` until exit.

    The first signal asks for a graceful stop: of the running container, or, when it
    arrives while the job starts, of the container as soon as it exists; after the
    run (summary printed) it changes nothing, so the exit status is the graceful
    path's. A second signal before the end forces an immediate exit (128 + N).
    While a live display owns the terminal, the notice is handed to it (printing from
    a signal handler could interleave with a redraw).
    """

    def __init__(self) -> None:
        self.received = 0
        self.signum: int | None = None  # the first stop signal
        self.finished = False
        self.notices: list[str] = []
        self.live = False  # a live display shows self.notices
        self._stop: Callable[[], None] | None = None
        self._force: Callable[[], None] | None = None

    def reset(self) -> None:
        """As if no signal had come yet (a container forked by its parent starts afresh)."""
        self.__init__()  # type: ignore[misc]

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, self._handle)

    def install_parent_death(self, signum: int) -> None:
        """``signum`` means "the parent process died" (a container's PR_SET_PDEATHSIG): a
        graceful stop, however often it comes. The kernel sends it each time a thread of the
        parent that was the container's parent ends, and a killed parent's threads end one by
        one, so one death can bring it several times; as SIGTERM, the second would force."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, self._parent_died)

    def _parent_died(self, signum: int, frame: FrameType | None) -> None:
        if self.finished or self.received:
            return  # already stopping (or over): the parent's death changes nothing
        self.received += 1
        self._graceful("tailrace: the parent process died: stopping gracefully")

    def attach(self, stop: Callable[[], None], force: Callable[[], None] | None = None) -> None:
        """From now on a signal calls ``stop`` (a second one ``force``, then exits); calls
        ``stop`` now when a signal already came."""
        self._stop = stop
        self._force = force
        if self.received:
            stop()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.finished:
            return  # the job is over: nothing to stop, the status stays the graceful one
        self.received += 1
        if self.received > 1:
            os.write(2, f"\ntailrace: {name} again: forced stop, no final checkpoint\n".encode())
            if self._force is not None:
                self._force()
            os._exit(128 + signum)
        self.signum = signum
        notice = (
            f"tailrace: {name}: stopping gracefully (finishing in-flight work, writing a checkpoint); "
            + ("Ctrl-C again to force" if signum == signal.SIGINT else f"a second {name} forces")
        )
        self._graceful(notice)

    def _graceful(self, notice: str) -> None:
        """The first stop request: say so, then stop gracefully."""
        if self.live:
            self.notices.append(notice)
        else:
            try:  # on a terminal, on a line of its own (not after the ^C echoed)
                os.write(2, f"{chr(10) if os.isatty(2) else ''}{notice}\n".encode())
            except OSError:  # stderr closed (a container whose parent died): stop all the same
                pass
        if self._stop is not None:
            self._stop()


_SIGNALS = _StopSignals()


# -- task failures ----------------------------------------------------------------
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tailrace/, above cli/


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    """The standard library's directories (sysconfig is imported on this error path only:
    ~8M instructions that every run paid at start-up)."""
    import sysconfig

    return tuple({os.path.abspath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")})


def _is_user_frame(filename: str) -> bool:
    """False for tailrace's own frames (Python and Cython), the standard library and ``<frozen ...>``."""
    if filename.startswith("<"):
        return False
    if filename.endswith((".pyx", ".pxi")) and "tailrace" in Path(filename).parts:
        return False
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR + os.sep):
        return False
    return not any(path.startswith(d + os.sep) for d in _stdlib_dirs())


def user_frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    """The frames of ``tb`` in the user's code (not tailrace's, not the standard library's)."""
    return [f for f in traceback.extract_tb(tb) if _is_user_frame(f.filename)]


def line_at_offset(path: str | os.PathLike[str], offset: int) -> int:
    """1-based number of the line holding byte ``offset`` of ``path`` (newlines before it + 1).

    Error path only: reads the file up to ``offset``.
    """
    count = 0
    remaining = offset
    with open(path, "rb") as f:
        while remaining > 0:
            chunk = f.read(min(1 << 20, remaining))
            if not chunk:
                break
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count + 1


def _input_location(spec: JobSpec | None, ssp: Any, offset: Any) -> str | None:
    """``FILE line N (byte offset O)`` for a message of a file input, else None."""
    if spec is None or not isinstance(ssp, SystemStreamPartition) or not isinstance(offset, int):
        return None
    from ..files import FileSystem

    system = spec.systems.get(ssp.system)
    if not isinstance(system, FileSystem):
        return None
    try:
        reader = system.reader(ssp)
        path = getattr(reader, "path", None)
        reader.close()
        if path is None:
            return None
        return f"{path} line {line_at_offset(path, offset)} (byte offset {offset})"
    except (TailraceError, OSError):
        return None


def describe_task_error(e: TaskError, spec: JobSpec | None) -> str:
    """What ``tailrace run`` prints for a failure in user code: where (task, input file
    and line), the traceback frames of the user's code, and how to see more."""
    lines = [f"tailrace: error: {e}"]
    where = _input_location(spec, e.ssp, e.offset)
    if where:
        lines.append(f"  input: {where}")
    original = e.original
    if original is not None:
        frames = user_frames(original.__traceback__)
        if frames:
            lines.append("  in your code (most recent call last):")
            for f in frames:
                lines.append(f'    File "{f.filename}", line {f.lineno}, in {f.name}')
                if f.line:
                    lines.append(f"      {f.line}")
            lines.append(f"  {type(original).__name__}: {original}")
        elif original.__traceback__ is None:
            lines.append(f"  (the {type(original).__name__} was handed to callback.fail(), never raised)")
    if not log.isEnabledFor(logging.DEBUG):  # else the full traceback was just logged
        lines.append("  run with --log-level DEBUG for the full traceback, tailrace's frames included")
    return "\n".join(lines)


# -- run ----------------------------------------------------------------------
def _load_spec(args: argparse.Namespace) -> JobSpec:
    overrides = dict(parse_override(item) for item in getattr(args, "config", []))
    return load_job(args.job, overrides, engine=getattr(args, "engine", None))


def _load(args: argparse.Namespace) -> JobSpec:
    """The job of ``args``, kept as ``args.spec`` too (for describe_task_error, and to say
    which errors found after it was loaded a ``--config`` pair caused)."""
    spec = args.spec = _load_spec(args)
    return spec


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


class _Reporting:
    """Context manager: the live display on a terminal, else plain progress lines."""

    def __init__(self, reporter: _Reporter, interval: float) -> None:
        self.reporter = reporter
        self.interval = interval

    def __enter__(self) -> tuple[_Reporter, float]:
        self.reporter.start()
        return self.reporter, self.interval

    def __exit__(self, *exc: object) -> None:
        self.reporter.close()


def _reporter(args: argparse.Namespace, spec: JobSpec, source: _MetricsSource) -> _Reporting:
    live = args.progress if args.progress is not None else sys.stderr.isatty()
    if live:
        return _Reporting(_LiveDisplay(spec, source, sys.stderr), 0.25)
    return _Reporting(
        _LogLines(spec, source, enabled=args.progress is None), max(0.05, args.progress_interval)
    )


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


def _check_state_dir(spec: JobSpec, *, create: bool = True) -> None:
    """One clear line (SetupError, exit 2) when the SQLite store's directory cannot be
    created or written, before SQLite reports it as something else. Changes nothing: a
    missing directory is made by the store when the run opens it, so a run refused
    before that leaves none behind (``create``: whether it could be made is checked;
    false: a missing one is fine, as read-only commands find it); never suggests
    deleting anything."""
    table = spec.tree.get("checkpoints") or {"type": "sqlite"}
    if not isinstance(table, dict) or table.get("type", "sqlite") != "sqlite":
        return
    path = getattr(spec.checkpoint_store(), "path", None)
    if path is None:
        return
    path = Path(path)
    where = "[checkpoints] path in " + str(spec.source)
    state = path.parent
    if not state.is_dir():
        if not create:
            return
        existing = state
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            problem: int | None = errno.EEXIST if existing == state else errno.ENOTDIR
        else:
            problem = None if os.access(existing, os.W_OK | os.X_OK) else errno.EACCES
        if problem is not None:
            raise SetupError(
                f"cannot create the state directory {state} ({os.strerror(problem)}); create it with "
                f"write permission for this user, or point {where} at a writable directory"
            )
        return  # nothing in it yet to check
    if not os.access(state, os.W_OK | os.X_OK):
        held = " (the checkpoints in it are intact)" if path.exists() else ""
        raise SetupError(
            f"state directory {state} is not writable by this user{held}: the checkpoint store "
            f"{path.name} needs to write its lock, -wal and -shm files there; make the directory "
            f"writable, run as its owner, or point {where} at a writable directory"
        )
    for f in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if f.exists() and not os.access(f, os.R_OK | os.W_OK):
            raise SetupError(
                f"checkpoint file {f} is not readable and writable by this user (the checkpoints in "
                "it are intact); fix its permissions or run as its owner"
            )


def _is_distributed(spec: JobSpec) -> bool:
    table = spec.tree.get("checkpoints") or {}
    return isinstance(table, dict) and table.get("type") == "redis"


def _run_watched(
    args: argparse.Namespace,
    spec: JobSpec,
    view: Any,
    run: Callable[[], Any],
    stop: Callable[[], None],
    armed: Callable[[threading.Event], None] | None = None,
    *,
    keep_frozen: bool = False,
) -> Any:
    """``run()`` on a thread of its own while the main thread keeps the progress view and
    takes the signals (the first one calls ``stop``); its result, or its error re-raised.
    ``armed(done)`` is called before it starts, with the event set when it ends."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["result"] = run()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            box["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=target, name="tailrace-run")
    if armed is not None:
        armed(done)
    _SIGNALS.attach(stop)
    # What start-up loaded (modules, the job, the task's module) lives to the end: frozen,
    # it is out of the cycle collector's reach, so the collections that the run's own
    # allocations trigger scan only the run's objects (the oldest generation's scanned
    # every module again: 1-2% of a cheap job's CPU). A forked container keeps them so
    # (``keep_frozen``: the parent froze them before the fork, see _run_file_containers);
    # the freeze count cannot tell (CPython 3.12 starts with objects frozen)
    gc.freeze()
    try:
        with _reporter(args, spec, view) as (reporter, interval):
            worker.start()
            try:
                while not done.wait(interval):
                    reporter.tick()
            finally:
                worker.join()
    finally:
        if not keep_frozen:
            gc.unfreeze()  # main() may run in-process: what it leaves is collectable again
    if "error" in box:
        raise box["error"]
    return box["result"]


def _run_distributed(args: argparse.Namespace, spec: JobSpec) -> int:
    """Checkpoints in Redis: run as a member of the job (see tailrace.redis.membership),
    or start ``--containers`` member processes whose lines are prefixed ``[container i]``."""
    from .._stopping import arm_backstop
    from ..redis.membership import Member, member_spec_from_job

    member_spec = member_spec_from_job(spec, lambda: _load_spec(args))  # checks [checkpoints] is Redis
    count = _container_count(args, spec)
    if count != 1:
        return _run_local_containers(args, spec, count)
    member = Member(member_spec)
    view = _MemberView(member)
    if args.metrics_port is not None:
        _serve_prometheus(view, args.metrics_port, args.metrics_host, spec.name)
    started = time.monotonic()
    result = _run_watched(args, spec, view, member.run, member.stop, lambda done: arm_backstop(member, done))
    seconds = time.monotonic() - started
    print(
        f"member {result.member} of job {spec.name!r} left ({result.reason}) after {seconds:.2f} s: "
        f"{_rate_text(result.processed, seconds)} in {_count(result.runs, 'container run')}; partitions "
        f"finished here: {sorted(result.done)}\n  {_count(result.skipped, 'bad line')} skipped",
        flush=True,
    )
    _print_committed(spec, sys.stdout)
    return 0


def _count(n: int, word: str, plural: str | None = None) -> str:
    """``1 message``, ``2 messages``, ``1,000 messages``: ``n`` with ``word`` in its number."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def _rate_text(processed: int, seconds: float) -> str:
    """``N messages processed (R msg/s)``: the summaries' first figures."""
    rate = processed / seconds if seconds > 0 else 0.0
    return f"{_count(processed, 'message')} processed ({rate:,.0f} msg/s)"


def _kafka_systems(spec: JobSpec) -> set[str]:
    """The names of the job's ``kafka`` systems (by their tables' type)."""
    systems = spec.tree.get("systems") or {}
    return {name for name, t in systems.items() if isinstance(t, dict) and t.get("type") == "kafka"}


def _is_kafka(spec: JobSpec) -> bool:
    """True when an input of the job is on a ``kafka`` system."""
    return bool(_kafka_systems(spec) & {name.partition(".")[0] for name in spec.inputs})


def _run_kafka(args: argparse.Namespace, spec: JobSpec) -> int:
    """Kafka inputs: run as a member of the job's consumer group (group id = the job's
    name; see tailrace.kafka.membership), or start ``--containers`` member processes.
    Several members of one job need one checkpoint store they all reach (Redis)."""
    from .._stopping import arm_backstop
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
    started = time.monotonic()
    result = _run_watched(args, spec, view, member.run, member.stop, lambda done: arm_backstop(member, done))
    seconds = time.monotonic() - started
    print(
        f"member of job {spec.name!r} left ({result.reason}) after {seconds:.2f} s: "
        f"{_rate_text(result.processed, seconds)} in {_count(result.runs, 'container run')}; partitions "
        f"assigned {result.assigned}, handed over {result.revoked}, lost {result.lost}, "
        f"commits refused {result.fenced}\n  {_count(result.skipped, 'bad line')} skipped",
        flush=True,
    )
    _print_committed(spec, sys.stdout)
    return 0


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


def _container_port(port: int, i: int) -> int:
    """Container ``i``'s metrics port: PORT + i; with PORT 0, 0 for each (a free port each)."""
    return port + i if port else 0


def _metrics_argv(args: argparse.Namespace, i: int) -> list[str]:
    """``--metrics-port`` of container ``i``."""
    if args.metrics_port is None:
        return []
    return ["--metrics-port", str(_container_port(args.metrics_port, i)), "--metrics-host", args.metrics_host]


def _log_metrics_ports(args: argparse.Namespace, count: int) -> None:
    if args.metrics_port == 0:
        log.info("Prometheus metrics of each container on a free port (each container logs its own)")
    elif args.metrics_port is not None:
        log.info(
            "Prometheus metrics of container i on http://%s:%d+i/metrics (ports %d..%d)",
            args.metrics_host,
            args.metrics_port,
            args.metrics_port,
            args.metrics_port + count - 1,
        )


class _Forked:
    """A container forked from this process (``_ContainerProcesses.fork``): the part of
    ``subprocess.Popen`` that ``_ContainerProcesses`` uses. Reaping and signalling take
    one lock, so a signal never goes to a pid already reaped (and perhaps reused)."""

    def __init__(self, pid: int, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, flags)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        if self.returncode is None:
            try:  # wait for the end without reaping, outside the lock (a signal may come meanwhile)
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass  # reaped by another thread meanwhile
        code = self._reap(0)
        assert code is not None
        return code

    def send_signal(self, signum: int) -> None:
        with self._lock:
            if self.returncode is None:
                os.kill(self.pid, signum)


class _ContainerProcesses:
    """The container processes of ``--containers N``: forks of this process (a file job)
    or ``tailrace run`` processes (a Redis or Kafka job). Every line they print is
    prefixed ``[container i]`` and written whole, so containers never interleave
    mid-line. Each runs in its own process group: a terminal's Ctrl-C reaches the parent
    only, which forwards it once (a container that got it twice, from the terminal and
    from the parent, would force-stop)."""

    def __init__(self, count: int) -> None:
        self.procs: dict[int, subprocess.Popen[bytes] | _Forked] = {}
        self._width = len(str(count - 1))
        self._write_lock = threading.Lock()
        self._pumps: list[threading.Thread] = []
        self._unpumped: list[int] = []
        self._parent_fds: list[int] = []  # what a later fork must close: the pipes of the earlier ones

    def start(
        self, i: int, argv: list[str], env: dict[str, str], pass_fds: Sequence[int] = ()
    ) -> subprocess.Popen[bytes]:
        import subprocess  # here: only containers of a distributed job are started this way

        proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
            pass_fds=tuple(pass_fds),
        )
        self.procs[i] = proc
        self._unpumped.append(i)
        self.start_pumps()
        return proc

    def fork(self, i: int, body: Callable[[], int], parent_fds: Sequence[int] = ()) -> _Forked:
        """Fork container ``i``, which runs ``body()`` and exits with its status; it closes
        ``parent_fds`` (this process's ends of its pipes) and those of the earlier forks.
        Call before this process starts any thread; then ``start_pumps``."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write what is buffered a second time
        pid = os.fork()
        if pid == 0:  # the container: never returns into the parent's frames
            code = 70  # EX_SOFTWARE: body() itself failed
            try:
                _SIGNALS.reset()
                os.setpgid(0, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for fd in (out_r, err_r, out_w, err_w, *self._parent_fds, *parent_fds):
                    os.close(fd)
                code = body()
            except BaseException:  # noqa: BLE001 - the child's last word
                traceback.print_exc()
            finally:
                try:
                    atexit._run_exitfuncs()  # as a process of its own would at exit (logging's flush)
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        try:
            os.setpgid(pid, pid)  # from both sides: whichever runs first (a shell does the same)
        except OSError:
            pass  # it already did, or already exited
        os.close(out_w)
        os.close(err_w)
        self._parent_fds += [out_r, err_r, *parent_fds]
        proc = _Forked(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
        self.procs[i] = proc
        self._unpumped.append(i)
        return proc

    def start_pumps(self) -> None:
        """Copy the output of the containers started since the last call, line by line."""
        for i in self._unpumped:
            proc = self.procs[i]
            for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                t = threading.Thread(target=self._pump, args=(i, stream, out), daemon=True)
                t.start()
                self._pumps.append(t)
        self._unpumped.clear()

    def _pump(self, i: int, stream: Any, out: TextIO) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.strip():
                continue  # a prefix alone says nothing
            with self._write_lock:
                out.write(f"[container {i:>{self._width}}] {line}\n")
                out.flush()

    def watch(self) -> threading.Event:
        """An event set each time a container ends (its ``returncode`` is set first)."""
        ended = threading.Event()

        def waiter(p: subprocess.Popen[bytes] | _Forked) -> None:
            p.wait()
            ended.set()

        for p in self.procs.values():
            threading.Thread(target=waiter, args=(p,), daemon=True).start()
        return ended

    def terminate(self) -> None:
        """SIGTERM to every container still running (a graceful stop; a second one forces)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def join_pumps(self) -> None:
        for t in self._pumps:
            t.join(timeout=5)


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


def _store_text(spec: JobSpec) -> str:
    t = spec.tree.get("checkpoints") or {"type": "sqlite"}
    path = getattr(spec.checkpoint_store(), "path", None)
    return f"{t.get('type')} {path}" if path is not None else str(t.get("type"))


class _MetricsSource(Protocol):
    """What a reporter reads: a Container, or a Redis member's view of its current one."""

    def metrics(self) -> tuple[dict[str, TaskMetrics], Any] | None: ...

    def skipped(self) -> dict[SystemStreamPartition, int]: ...


class _Reporter:
    def __init__(self, spec: JobSpec, source: Any) -> None:
        self.spec = spec
        self.source = source
        self.t0 = time.monotonic()
        self.last_t = self.t0
        self.last_n = 0

    def snapshot(self) -> tuple[dict[str, TaskMetrics], float, float] | None:
        m = self.source.metrics()
        if m is None:
            return None
        tasks, _ = m
        now = time.monotonic()
        n = sum(t.processed for t in tasks.values())
        rate = (n - self.last_n) / (now - self.last_t) if now > self.last_t else 0.0
        if n < self.last_n:  # a new container (Redis rebalance) counts from 0
            rate = 0.0
        self.last_t, self.last_n = now, n
        return tasks, rate, now - self.t0

    def start(self) -> None:
        pass

    def tick(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _LogLines(_Reporter):
    """Plain periodic progress lines (not on a terminal)."""

    def __init__(self, spec: JobSpec, source: Any, enabled: bool) -> None:
        super().__init__(spec, source)
        self.enabled = enabled
        self.files = _FileProgress(spec) if enabled else None

    def tick(self) -> None:
        snap = self.snapshot() if self.enabled else None
        if snap is None:
            return
        tasks, rate, elapsed = snap
        processed = sum(t.processed for t in tasks.values())
        outstanding = sum(t.outstanding for t in tasks.values())
        lag = sum(v for t in tasks.values() for v in t.lag.values())
        remaining = self.files.remaining(tasks) if self.files else {}
        log.info(
            "progress: %d processed (%.0f msg/s), %d outstanding, lag %d, %d skipped, %.1f s%s",
            processed,
            rate,
            outstanding,
            lag,
            sum(self.source.skipped().values()),
            elapsed,
            "; " + _to_go_text(self.files, remaining) if self.files and remaining else "",
        )


class _LiveDisplay(_Reporter):
    """A live view (rich) on a terminal: rates, per-partition committed offsets and lag.

    It fits the terminal's width (long cells are cut with an ellipsis, never wrapped),
    log lines, the task's prints and the shutdown notice are printed above it, and it
    disappears at the end, leaving the final summary clean. Only the main thread draws
    (no refresh thread), so a signal handler never interrupts a redraw it then joins.
    """

    def __init__(self, spec: JobSpec, source: Any, out: TextIO) -> None:
        super().__init__(spec, source)
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=out, force_terminal=True, highlight=False, soft_wrap=False)
        self.live = Live(
            console=self.console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=True,
        )
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []
        self.stopping = False
        self.files = _FileProgress(spec)

    def start(self) -> None:
        self.live.start()
        # log records go through the live console (above the view), not straight to the terminal
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and h.stream is self.console.file:
                self._handlers.append((h, h.setStream(sys.stderr)))
        _SIGNALS.live = True

    def _notices(self) -> None:
        while _SIGNALS.notices:
            self.stopping = True
            self.live.console.print(_SIGNALS.notices.pop(0), style="bold yellow", overflow="fold")

    def tick(self) -> None:
        self._notices()
        snap = self.snapshot()
        self.live.update(self._render(snap), refresh=True)

    def _render(self, snap: tuple[dict[str, TaskMetrics], float, float] | None) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(f"tailrace {self.spec.name}", style="bold")
        head.append(f" ({self.spec.engine} engine)  {time.monotonic() - self.t0:.1f} s")
        parts: list[Any] = [head]
        if self.stopping:
            force = "; Ctrl-C again to force" if _SIGNALS.signum == signal.SIGINT else ""
            parts.append(Text(f"stopping gracefully{force}", style="yellow", no_wrap=True))
        if snap is None:
            parts.append(Text("starting...", no_wrap=True))
            return Group(*parts)
        tasks, rate, _ = snap
        skipped = self.source.skipped()
        parts.append(
            Text(
                f"processed {sum(t.processed for t in tasks.values()):,}  {rate:,.0f} msg/s  "
                f"outstanding {sum(t.outstanding for t in tasks.values())}  "
                f"commits {sum(t.commits for t in tasks.values())}  skipped {sum(skipped.values())}",
                no_wrap=True,
                overflow="ellipsis",
            )
        )
        remaining = self.files.remaining(tasks) if self.files else {}
        if remaining:
            parts.append(Text(_to_go_text(self.files, remaining), no_wrap=True, overflow="ellipsis"))
        table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
        table.add_column("partition", no_wrap=True, overflow="ellipsis", max_width=40)
        table.add_column("committed", justify="right", no_wrap=True, overflow="ellipsis")
        table.add_column("lag", justify="right", no_wrap=True)
        if remaining:
            table.add_column("remaining", justify="right", no_wrap=True)
        rows = sorted((ssp, t) for t in tasks.values() for ssp in _partitions(t))
        for ssp, t in rows[:_SHOWN_PARTITIONS]:
            cells = [str(ssp), str(t.committed.get(ssp, "-")), f"{t.lag.get(ssp, 0):,}"]
            if remaining:
                to_go, size = remaining.get(ssp, (0, 0))
                cells.append(f"{_bytes_text(to_go)} {100 * to_go / size:3.0f}%" if size else "-")
            table.add_row(*cells)
        parts.append(table)
        if len(rows) > _SHOWN_PARTITIONS:
            parts.append(Text(f"... and {len(rows) - _SHOWN_PARTITIONS} more partitions", no_wrap=True))
        return Group(*parts)

    def close(self) -> None:
        self._notices()
        self.live.stop()  # transient: the view is erased, the summary follows on a clean line
        for h, old in self._handlers:
            h.setStream(old)
        _SIGNALS.live = False
        while _SIGNALS.notices:
            print(_SIGNALS.notices.pop(0), file=sys.stderr, flush=True)


class _FileProgress:
    """How far a file job's inputs have to go (their sizes are known): per partition, the
    bytes after the last processed line (its low watermark, else its committed offset)
    and the share of the file they are; over every partition, an ETA from the rate at
    which the remaining bytes went down since the run started. Files are stat'ed at each
    call: an appended file has more to go."""

    def __init__(self, spec: JobSpec) -> None:
        from ..files import FileSystem, partition_file, scan_stream
        from ..types import parse_system_stream

        self.paths: dict[SystemStreamPartition, Path] = {}
        for name in spec.inputs:
            ss = parse_system_stream(name)
            system = spec.systems.get(ss.system)
            if not isinstance(system, FileSystem):
                continue
            try:
                count, fmt = scan_stream(system.path / ss.stream)
            except (TailraceError, OSError):
                continue  # the run reports it
            for p in range(count):
                ssp = SystemStreamPartition(ss.system, ss.stream, p)
                self.paths[ssp] = partition_file(system.path / ss.stream, p, fmt)
        self._last_line: dict[Path, tuple[int, int]] = {}  # path -> (size, start of its last line)
        self._first: tuple[float, int] | None = None  # (time, bytes to go) at the first sample

    def __bool__(self) -> bool:
        return bool(self.paths)

    def _last_line_start(self, path: Path, size: int) -> int:
        """Where the file's last line starts (its tail read once per size; -1 when unknown)."""
        known = self._last_line.get(path)
        if known is not None and known[0] == size:
            return known[1]
        start = -1
        if path.suffix != ".msgpack":
            try:
                with open(path, "rb") as f:
                    at = max(0, size - 65536)
                    f.seek(at)
                    tail = f.read(size - at).rstrip(b"\n")
                cut = tail.rfind(b"\n")
                start = at + cut + 1 if cut >= 0 or at == 0 else -1
            except OSError:
                start = -1
        self._last_line[path] = (size, start)
        return start

    def remaining(self, tasks: dict[str, TaskMetrics]) -> dict[SystemStreamPartition, tuple[int, int]]:
        """(bytes to go, file size) per file partition."""
        out: dict[SystemStreamPartition, tuple[int, int]] = {}
        done: dict[SystemStreamPartition, Any] = {}
        for t in tasks.values():
            for ssp, off in t.committed.items():
                done[ssp] = off
            for ssp, off in t.low_watermark.items():
                done[ssp] = off
        for ssp, path in self.paths.items():
            try:
                size = path.stat().st_size
            except OSError:
                continue
            at = done.get(ssp)
            if not isinstance(at, int):
                out[ssp] = (size, size)
                continue
            # the offset is the start of the last line processed: the bytes after that line
            last = self._last_line_start(path, size)
            out[ssp] = (0 if last >= 0 and at >= last else max(0, size - at), size)
        return out

    def eta(self, to_go: int) -> float | None:
        """Seconds until ``to_go`` bytes are done at the rate seen so far (None: no rate yet)."""
        now = time.monotonic()
        if self._first is None:
            self._first = (now, to_go)
            return None
        t0, first = self._first
        rate = (first - to_go) / (now - t0) if now > t0 else 0.0
        return to_go / rate if rate > 0 else None


def _bytes_text(n: int) -> str:
    """``812 B``, ``1.5 KiB``, ``12.3 MiB``, ``2.0 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _duration_text(seconds: float) -> str:
    """``0:42``, ``12:05``, ``3:02:10``."""
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _to_go_text(progress: _FileProgress, remaining: dict[SystemStreamPartition, tuple[int, int]]) -> str:
    """``remaining 12.3 MiB of 40.0 MiB (31%), ETA 0:42``: the file inputs all together."""
    to_go = sum(r for r, _ in remaining.values())
    total = sum(size for _, size in remaining.values())
    share = f" ({100 * to_go / total:.0f}%)" if total else ""
    eta = progress.eta(to_go)
    when = "done" if to_go == 0 else "ETA " + (_duration_text(eta) if eta is not None else "-")
    return f"remaining {_bytes_text(to_go)} of {_bytes_text(total)}{share}, {when}"


def _partitions(t: TaskMetrics) -> set[SystemStreamPartition]:
    return set(t.committed) | set(t.lag) | set(t.newest_read)


def _print_summary(
    spec: JobSpec, container: Container, result: RunResult, seconds: float, out: TextIO
) -> None:
    skipped = container.skipped()
    # short lines: the summary stays readable at 80 columns
    out.write(
        f"job {spec.name!r} finished ({result.reason}) in {seconds:.2f} s: "
        f"{_rate_text(result.processed, seconds)}\n"
    )
    failed = sum(t.failed for t in result.tasks.values())
    ignored = sum(t.ignored for t in result.tasks.values())
    more = f", failed {failed}, ignored exceptions {ignored}" if failed or ignored else ""
    out.write(f"  {_count(sum(skipped.values()), 'bad line')} skipped{more}\n")
    out.write("  committed offsets:\n")
    for ssp, off in sorted(result.committed.items()):
        extra = f"  ({skipped[ssp]} skipped)" if skipped.get(ssp) else ""
        out.write(f"    {ssp!s:<28} {off!s}{extra}\n")
    out.flush()


# -- checkpoints ----------------------------------------------------------------
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


# -- load -------------------------------------------------------------------------
def cmd_load(args: argparse.Namespace) -> int:
    """Append a file's lines to a Redis stream of the job, pipelined."""
    from ..redis import RedisSystem
    from ..redis.tools import append_pipelined, ended_partitions, read_messages
    from ..types import parse_system_stream

    spec = _load(args)
    target = args.stream or (spec.inputs[0] if len(spec.inputs) == 1 else None)
    if target is None:
        raise ConfigError(
            "the job has several inputs: name one with --stream",
            key="--stream",
            allowed=", ".join(spec.inputs),
        )
    try:
        ss = parse_system_stream(target)
    except ValueError as e:
        raise ConfigError(str(e), key="--stream") from None
    system = spec.systems.get(ss.system)
    if not isinstance(system, RedisSystem):
        raise ConfigError(
            f"{target!r} is not a stream of a Redis system of the job",
            key="--stream",
            allowed=", ".join(n for n, s in spec.systems.items() if isinstance(s, RedisSystem)) or "none",
            source=str(spec.source),
        )
    path = Path(args.file)
    if not path.is_file():
        if path.is_dir():
            raise SetupError(f"{path}: is a directory; load reads one file (JSON Lines or text)")
        if path.exists():
            raise SetupError(f"{path}: not a regular file; load reads one file (JSON Lines or text)")
        raise SetupError(f"{path}: no such file")
    fmt = args.format or ("text" if path.suffix == ".txt" else "jsonl")
    if args.key_field is not None and fmt == "text":
        raise ConfigError(
            f"a text file's messages are strings, with no field to take a key from ({path})",
            key="--key-field",
            allowed="--key-field with a JSON Lines file (--format jsonl)",
        )
    if args.partitions is not None:
        try:
            system.create_stream(ss.stream, args.partitions, exist_ok=True)
        except ValueError as e:  # the stream exists, or is declared, with another partition count
            raise ConfigError(str(e), key="--partitions") from None
    else:
        # the job file's count (checked against Redis), recorded: a job that later declares
        # another count is refused rather than reading only some of the partitions
        try:
            n = system.partitions(ss.stream)
        except InputError:  # neither Redis nor the job file knows the stream: nothing to append to
            raise ConfigError(
                f"Redis at {system.where} has no stream {ss.stream!r}: create it with this command's "
                f"--partitions N (N partitions), or give its partition count in the 'streams' table of "
                f"[systems.{ss.system}]",
                key="--partitions",
            ) from None
        system.create_stream(ss.stream, n, exist_ok=True)
    ended = ended_partitions(system, ss.stream)
    if ended:  # docs/redis.md: an end marker is final
        raise SetupError(
            f"stream {target} has ended: {', '.join(f'{target}[{p}]' for p in ended)} "
            f"end{'s' if len(ended) == 1 else ''} with an end marker (tailrace load --end, "
            "RedisSystem.end_stream), and a reader never reads past it; nothing was appended"
        )
    started = time.monotonic()
    messages = read_messages(path, fmt, key_field=args.key_field)
    counts = append_pipelined(system, ss.stream, messages, key_field=args.key_field, batch=args.batch)
    if args.end:
        system.end_stream(ss.stream)
    seconds = time.monotonic() - started
    total = sum(counts.values())
    rate = total / seconds if seconds > 0 else 0.0
    spread = ", ".join(f"[{p}] {n:,}" for p, n in sorted(counts.items()))
    print(
        f"appended {_count(total, 'message')} of {path} to {target} in {seconds:.2f} s ({rate:,.0f} msg/s):",
        spread,
    )
    system.close()
    return 0


# -- containers of a file job (--containers N / job.container.count) ------------------
# The parent loads the job (its task module too), forks one container per group of
# tasks, then takes the job's lock (it opens the checkpoint store as one run of the job
# would) and gives each container the word on a pipe. Container i runs the tasks whose
# partition number is i mod N (Samza's round-robin grouping of tasks onto containers) as
# an ordinary Container whose store is opened as container i (SqliteCheckpointStore.
# as_container: it refuses to run under any process but the parent holding the lock).
# A fork starts no interpreter and imports nothing again: a container costs no more CPU
# than the work it does. Each container reports its result on a pipe; the parent prints
# the summary once. A container that fails stops the others gracefully.


def _container_count(args: argparse.Namespace, spec: JobSpec) -> int:
    """``--containers`` when given (it wins), else the job's ``job.container.count``;
    ConfigError when container i of them could not serve its metrics on ``--metrics-port`` + i."""
    n = args.containers
    if n is None:
        n = spec.config.container_count
    elif n < 1 or n > 1024:
        raise ConfigError(
            f"{n} is not a container count", key="--containers", allowed="an integer from 1 to 1024"
        )
    port = args.metrics_port
    if port and port + n - 1 > _MAX_PORT:
        raise ConfigError(
            f"{port} leaves no port for container {n - 1} of {n} ({_count_key(args)} {n}: "
            f"container i serves on PORT+i, up to {port + n - 1})",
            key="--metrics-port",
            allowed=f"0 (a free port each) or 1 to {_MAX_PORT - n + 1}",
        )
    return int(n)


def _count_key(args: argparse.Namespace) -> str:
    return "--containers" if args.containers is not None else "job.container.count"


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


def _die_with_parent(parent: int) -> None:
    """Ask the kernel for a SIGHUP when the parent dies (Linux only): a graceful stop
    (see _StopSignals.install_parent_death). A parent gone before the request is seen
    by its pid changing."""
    if not sys.platform.startswith("linux"):
        return
    _SIGNALS.install_parent_death(signal.SIGHUP)
    try:
        _libc().prctl(1, int(signal.SIGHUP), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        log.debug("prctl(PR_SET_PDEATHSIG) unavailable", exc_info=True)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGHUP)


@functools.cache
def _libc() -> Any:
    """The C library through ctypes (loaded once, by the parent before it forks)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


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


# -- prometheus -----------------------------------------------------------------
def _serve_prometheus(source: Any, port: int, host: str, job: str) -> None:
    try:
        from prometheus_client import start_http_server
        from prometheus_client.core import CollectorRegistry
    except ImportError:
        raise ConfigError(
            "--metrics-port needs prometheus-client: pip install 'tailrace[prometheus]'", key="--metrics-port"
        ) from None
    from ..prometheus import ContainerCollector

    registry = CollectorRegistry()
    registry.register(ContainerCollector(source, job=job))
    try:
        started = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise SetupError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
    # prometheus-client >= 0.20 returns (server, thread): for port 0, the port the server took
    server = started[0] if isinstance(started, tuple) else None
    log.info("Prometheus metrics on http://%s:%d/metrics", host, getattr(server, "server_port", port))
