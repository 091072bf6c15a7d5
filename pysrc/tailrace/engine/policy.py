"""What a bad message does (SEMANTICS rules 39-40), the same in both engines.

A bad message is one whose input could not be read (its envelope's message is a
:class:`tailrace.types.BadInput`), or whose ``process`` raised (sync, pool, callback or
``async def``). The engines call :meth:`ErrorPolicy.handle` where they used to fail the
message; it answers what happens to it:

- ``IGNORED``: the exception is listed in ``task.ignored.exceptions`` (rule 16): the
  message completes, its writes stay, counted as ignored (as before this policy existed);
- ``RECOVERED``: a retry (``task.error.retries``) passed: the message completes normally;
- ``FAIL``: ``task.error.policy = fail``: the engine fails the message (the container stops);
- ``HANDLED``: ``skip`` or ``dead-letter``: the message's store writes are undone (sync
  tasks: the engine's journal, see ``tailrace.stores.journal_undo``), a dead letter is sent
  to ``task.error.stream`` through the task's collector (so the commit that passes the
  message flushes it first, as every output), and the message completes; counted.

The first bad message of a run is logged in full (a warning with its traceback); later ones
are counted (``TaskMetrics.skipped``, ``dead_lettered``, ``retried``) and summed up at the end.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from ..config import Config
from ..types import BadInput, SystemStreamPartition

log = logging.getLogger("tailrace.errors")

FAIL = 0
IGNORED = 1
HANDLED = 2
RECOVERED = 3

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MAX_BACKOFF_S = 60.0


class RunLog:
    """What one run logged of its bad messages (shared by its tasks' policies)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.logged = False


class ErrorPolicy:
    """One task's ``task.error.*`` settings and counters; ``handle`` may run on any thread
    (a pool thread, the thread that failed an async callback)."""

    def __init__(
        self,
        config: Config,
        task: str,
        collector: Any,
        readers: Mapping[SystemStreamPartition, Any] | None = None,
        run_log: RunLog | None = None,
    ) -> None:
        self.task = task
        self.policy = config.error_policy
        self.stream = config.error_stream
        self.retries = config.error_retries
        self.backoff_s = config.error_retry_backoff_ms / 1000
        self._ignores: Callable[[BaseException], bool] | None = (
            config.ignores if config.ignored_exceptions else None
        )
        self._collector = collector
        self._readers = dict(readers or {})
        self._run_log = run_log or RunLog()
        self._lock = threading.Lock()
        # anything to decide besides failing (the engines' fast path checks this once)
        self.active = self._ignores is not None or self.policy != "fail" or self.retries > 0
        # sync tasks record their store writes per invocation: a skipped or dead-lettered
        # message, or a retry, starts from the state before its first attempt
        self.journaling = self.policy != "fail" or self.retries > 0
        self.skipped = 0
        self.dead_lettered = 0
        self.retried = 0  # attempts made again (a message retried twice counts 2)
        self.recovered = 0  # messages a retry passed

    # -- the decision ------------------------------------------------------------------
    def handle(
        self,
        env: Any,
        error: BaseException,
        retry: Callable[[], Any] | None = None,
        undo: Callable[[], Any] | None = None,
        ignorable: bool = True,
    ) -> tuple[int, BaseException]:
        """What happens to ``env``, whose handling raised ``error``: ``(verdict, error)``,
        the error being the last attempt's. ``retry`` calls ``process`` again (sync tasks;
        None where the engine cannot: the retries of ``async def`` tasks run in their own
        coroutine); ``undo`` undoes the invocation's store writes. Raises when a dead letter
        cannot be sent (the container stops with that error: nothing is lost).
        ``ignorable``: ``task.ignored.exceptions`` applies (sync calls, rule 16)."""
        if not ignorable:
            pass
        elif self._ignores is not None and self._ignores(error):
            return IGNORED, error
        attempts = 1
        if retry is not None and self.retries and type(env.message) is not BadInput:
            for i in range(self.retries):
                if undo is not None:
                    undo()
                delay = min(self.backoff_s * (2**i), _MAX_BACKOFF_S)
                if delay > 0:
                    time.sleep(delay)
                attempts += 1
                with self._lock:
                    self.retried += 1
                try:
                    retry()
                except Exception as e:  # noqa: BLE001 - user code: the next attempt, or the policy
                    error = e
                    if ignorable and self._ignores is not None and self._ignores(e):
                        return IGNORED, e
                    continue
                with self._lock:
                    self.recovered += 1
                return RECOVERED, error
        if self.policy == "fail":
            return FAIL, error
        if undo is not None:
            undo()
        if self.policy == "dead-letter":
            self._collector.send(self.stream, self.dead_letter(env, error, attempts), key=_origin(env))
            with self._lock:
                self.dead_lettered += 1
        else:
            with self._lock:
                self.skipped += 1
        self._log_first(env, error)
        return HANDLED, error

    def _log_first(self, env: Any, error: BaseException) -> None:
        run = self._run_log
        with run.lock:
            if run.logged:
                return
            run.logged = True
        what = "dead-lettered to " + self.stream if self.policy == "dead-letter" else "skipped"
        log.warning(
            "task %r: bad message at %s offset %r %s (task.error.policy = %s): %s: %s; further bad "
            "messages are counted, not logged",
            self.task,
            env.ssp,
            env.offset,
            what,
            self.policy,
            type(error).__name__,
            error,
            exc_info=(type(error), error, error.__traceback__),
        )

    # -- the dead letter ---------------------------------------------------------------
    def dead_letter(self, env: Any, error: BaseException, attempts: int = 1) -> dict[str, Any]:
        """The record sent to ``task.error.stream`` for ``env`` (a JSON-able dict): where
        the message came from, its original bytes (``bytes``, UTF-8 text, or
        ``bytes_base64``) or, where the input keeps none, its decoded ``value``, the error
        with the user's frame, the task, the attempts and the time (ms since the epoch)."""
        message = env.message
        raw: bytes | None
        raw_input = type(message) is BadInput
        if raw_input:
            raw = message.raw
            message = message.value
        else:
            raw = self._raw(env)
        record: dict[str, Any] = {
            "system": env.system,
            "stream": env.stream,
            "partition": env.partition,
            "offset": env.offset,
            "key": _plain(env.key),
            "task": self.task,
            "error": {
                "type": _type_name(error),
                "message": str(error),
                # input that could not be read never reached the user's code
                "frame": None if raw_input else user_frame(error),
            },
            "attempts": attempts,
            "time": int(time.time() * 1000),
        }
        if raw is not None:
            try:
                record["bytes"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                record["bytes_base64"] = base64.b64encode(raw).decode("ascii")
        else:
            record["value"] = _plain(message)
        return record

    def _raw(self, env: Any) -> bytes | None:
        reader = self._readers.get(env.ssp)
        if reader is None:
            return None
        try:
            raw = reader.raw(env.offset)
        except Exception:
            log.debug("cannot read back the bytes of %s offset %r", env.ssp, env.offset, exc_info=True)
            return None
        return raw if isinstance(raw, bytes) else None

    def note_retry(self) -> None:
        """One more attempt made elsewhere (an ``async def`` task retries in its coroutine)."""
        with self._lock:
            self.retried += 1

    def counts(self) -> dict[str, int]:
        return {
            "skipped": self.skipped,
            "dead_lettered": self.dead_lettered,
            "retried": self.retried,
            "recovered": self.recovered,
        }


def _origin(env: Any) -> str:
    """The dead letter's key: its source partition (dead letters of one partition stay in
    order in the error stream)."""
    return f"{env.system}.{env.stream}[{env.partition}]"


def _type_name(error: BaseException) -> str:
    t = type(error)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def user_frame(error: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame of ``error``'s traceback outside
    tailrace (the user's code that raised), else the innermost frame; None without one."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ is not None else []
    if not frames:
        return None
    user = [f for f in frames if not os.path.abspath(f.filename).startswith(_PACKAGE)]
    f = (user or frames)[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def _plain(value: Any) -> Any:
    """``value`` when JSON can hold it as it is, else its repr."""
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return repr(value)
    return value
