"""An error's one line and exit status, and what ``tailrace run`` prints for a failure in
the user's code: the task, the input file and line, the user's own frames.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import ConfigError, SetupError, TailraceError, TaskError
from ..jobfile import JobSpec
from ..types import SystemStreamPartition
from .signals import _SIGNALS

log = logging.getLogger("tailrace.cli")


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
