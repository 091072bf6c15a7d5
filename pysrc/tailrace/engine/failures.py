"""Errors that come after a run's first failure, while it stops (both engines).

The first failure stops the run and is what it raises (rule 16). Stopping still commits
(rule 19) and closes, so more errors may come, and one outage usually brings several: a
Redis that is gone fails every task's final commit with the same message but for the
task's name, a Kafka group that does not answer with the same message but for the
partition and offset. Such a repeat says nothing new; it is counted and logged at DEBUG
only. A further error with another cause is a warning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable


class FurtherErrors:
    """Reports the errors after a run's first failure (``report``); ``repeats`` counts
    those with the first one's cause. Called on the loop thread only."""

    def __init__(self, task_names: Iterable[str], log: logging.Logger) -> None:
        names = sorted(set(task_names), key=len, reverse=True)  # "Partition 10" before "Partition 1"
        self._names = re.compile("|".join(map(re.escape, names))) if names else None
        self._log = log
        self.repeats = 0

    def report(self, first: BaseException, error: BaseException) -> None:
        if self.same_cause(first, error):
            self.repeats += 1
            self._log.debug(
                "further error while stopping, the first one's cause (%d so far): %s", self.repeats, error
            )
        else:
            self._log.warning("further error while stopping: %s", error)

    def same_cause(self, first: BaseException, error: BaseException) -> bool:
        """True when ``error`` has ``first``'s cause: one holds the other, or they hold one
        original exception (``__cause__`` chains), or they are, or their originals are, of
        one type with one message but for the task names and numbers (partitions, offsets)
        in it."""
        ours, theirs = _chain(first), _chain(error)
        if any(e is o for e in theirs for o in ours):
            return True
        return self._alike(first, error) or self._alike(ours[-1], theirs[-1])

    def _alike(self, a: BaseException, b: BaseException) -> bool:
        return type(a) is type(b) and self._masked(a) == self._masked(b)

    def _masked(self, error: BaseException) -> str:
        text = str(error)
        if self._names is not None:
            text = self._names.sub("\0", text)
        return _NUMBERS.sub("#", text)


_NUMBERS = re.compile(r"\d+")


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and its causes, outermost first (a cycle ends it)."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and not any(e is c for c in chain):
        chain.append(e)
        e = e.__cause__
    return chain
