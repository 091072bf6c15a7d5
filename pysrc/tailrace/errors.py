"""Exception classes of tailrace, shared by both engines ("rule N": docs/SEMANTICS.md, see tailrace.api).

Plain Python on purpose: the compiled core raises these too (through one error
checker that maps C status codes to exceptions), so ``except`` clauses work the
same whichever engine runs.
"""

from __future__ import annotations

from typing import Any


class TailraceError(Exception):
    """Base class of every error tailrace raises."""


class ConfigError(TailraceError, ValueError):
    """Invalid configuration, rejected before anything starts.

    ``key`` names the offending config key (or None), ``source`` the file it came
    from (or None), ``allowed`` describes the values that would be accepted.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        allowed: str | None = None,
        source: str | None = None,
    ) -> None:
        self.key = key
        self.allowed = allowed
        self.source = source
        self.reason = message
        parts = []
        if source:
            parts.append(f"{source}: ")
        if key:
            parts.append(f"config key {key!r}: ")
        parts.append(message)
        if allowed:
            parts.append(f" (allowed: {allowed})")
        super().__init__("".join(parts))


class SetupError(TailraceError):
    """The environment stops a job before it starts: a state directory that cannot be
    created or written, a file that cannot be read. Nothing was changed; the command
    line exits with status 2 (as for a configuration error)."""


class TaskError(TailraceError):
    """User code failed; the container stopped (rule 16 of docs/SEMANTICS.md).

    The original exception is ``__cause__`` (and ``original``); ``task``,
    ``ssp`` and ``offset`` say where, when known (``ssp``/``offset`` are None for
    a failure in ``window``, ``end_of_stream``, ``init`` or a timer).
    """

    def __init__(
        self,
        task: str,
        ssp: Any = None,
        offset: Any = None,
        original: BaseException | None = None,
        *,
        phase: str = "process",
        detail: str | None = None,
    ) -> None:
        self.task = task
        self.ssp = ssp
        self.offset = offset
        self.original = original
        self.phase = phase
        where = f"task {task!r} failed in {phase}"
        if ssp is not None:
            where += f" of {ssp}"
        if offset is not None:
            where += f" at offset {offset!r}"
        if detail:
            where += f": {detail}"
        elif original is not None:
            where += f": {type(original).__name__}: {original}"
        super().__init__(where)
        if original is not None:
            self.__cause__ = original

    @property
    def partition(self) -> int | None:
        return getattr(self.ssp, "partition", None)


class CallbackError(TaskError):
    """A callback was completed or failed a second time (rule 17)."""


class CallbackTimeoutError(TaskError):
    """A callback was not completed within ``task.callback.timeout.ms`` (rule 16)."""


class CheckpointError(TailraceError):
    """The checkpoint store is unusable: corrupt, locked by another container, unreachable."""


class FencedError(CheckpointError):
    """A checkpoint write was refused because the writer no longer holds the
    partition's lease (another container owns it now), or because it would move
    the committed offset backwards. The writer must stop processing that partition.

    ``partition`` names the partition (``system.stream[p]``) when known.
    """

    def __init__(self, message: str, *, partition: str | None = None) -> None:
        self.partition = partition
        super().__init__(f"{partition}: {message}" if partition else message)


class InputError(TailraceError):
    """Bad input: missing file or directory, unparseable line, partition gap.

    ``source`` names the file (or stream), ``line`` the 1-based line when known.
    """

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None) -> None:
        self.source = source
        self.line = line
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(where + message)


class CoreError(TailraceError):
    """A C core call returned an error status (see ``tr_status_name``)."""

    def __init__(self, status: int, name: str, message: str, context: str | None = None) -> None:
        self.status = status
        self.name = name
        text = f"{name}: {message}"
        if context:
            text = f"{context}: {text}"
        super().__init__(text)


class CoreUnavailableError(TailraceError, ImportError):
    """The compiled core (``tailrace._core``) cannot be imported."""


def fenced_cause(error: BaseException) -> FencedError | None:
    """The FencedError that caused ``error`` (an engine may wrap it in a TaskError), if any."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, FencedError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None
