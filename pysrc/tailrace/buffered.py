"""A partition reader's bounded buffer, filled by its system's fetch thread (Redis, Kafka).

The fetch thread appends chunks (a batch as it arrived, of whatever shape the system keeps:
``length`` says how many entries one holds) under the fetcher's condition; the loop thread
takes at most ``max_messages`` at a time in ``poll``. A poll that finds nothing marks the
reader starved (``_starve``), and the next chunk, end or error wakes the loop (``_arrived``);
taking makes room, and a fetch thread holding back for room is notified (``_took``). Each
backend keeps its own ``deliver`` (decoding, errors, the end of its stream) and ``poll``
(how a taken chunk becomes envelopes); the buffer's bookkeeping is here once.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .interfaces import PartitionReader
from .types import SystemStreamPartition

__all__ = ["BufferedPartition"]


class BufferedPartition(PartitionReader):
    """One partition's bounded buffer of chunks (see the module doc). A backend supplies
    ``_raise_failure``, ``_take_out`` and ``_envelopes`` (``poll``'s steps) and fills the
    buffer with ``_append``; the ``_`` methods but ``_envelopes`` run with ``_cond`` held."""

    def __init__(
        self, ssp: SystemStreamPartition, cond: threading.Condition, capacity: int, batch: int
    ) -> None:
        super().__init__(ssp)
        self._cond = cond
        self._chunks: deque[Any] = deque()
        self._head = 0  # entries of chunks[0] already taken
        self._count = 0
        self._capacity = capacity
        self._batch = batch
        self._starved = False
        self._wakeup: Callable[[], None] = lambda: None

    # -- loop thread ---------------------------------------------------------------------
    def poll(self, max_messages: int) -> list[Any]:
        with self._cond:
            if self._count == 0:
                self._raise_failure()
                return self._starve()
            taken = self._take_out(max_messages)
        return self._envelopes(taken)

    def _raise_failure(self) -> None:
        """Raise what stopped this partition's reading, if anything did (the buffer is empty)."""

    def _take_out(self, max_messages: int) -> Any:
        """Take up to ``max_messages`` entries (at least one is buffered): what ``_envelopes``
        turns into the poll's envelopes, outside the lock."""
        raise NotImplementedError

    def _envelopes(self, taken: Any) -> list[Any]:
        """The envelopes of what ``_take_out`` took (default: it took envelopes)."""
        return list(taken)

    # -- fetch thread (``_cond`` held) ------------------------------------------------------
    def _append(self, chunk: Any, entries: int) -> None:
        """Buffer one chunk of ``entries`` entries (fetch thread)."""
        self._chunks.append(chunk)
        self._count += entries

    def _arrived(self, news: bool) -> bool:
        """True when the loop must be woken (outside the lock): it found nothing at its last
        poll, and ``news`` (entries, the end, an error) came since."""
        wake = self._starved and news
        if wake:
            self._starved = False
        return wake

    def _starve(self) -> list[Any]:
        """What a poll that finds nothing returns; the next arrival wakes the loop."""
        self._starved = True
        return []

    def _take(
        self, max_messages: int, length: Callable[[Any], int]
    ) -> tuple[list[tuple[Any, int, int]], int]:
        """Up to ``max_messages`` entries, oldest first: ``([(chunk, first, end), ...], n)``
        (chunks are never changed once buffered: slices of them are the caller's)."""
        chunks = self._chunks
        taken: list[tuple[Any, int, int]] = []
        n = 0
        head = self._head
        while chunks and n < max_messages:
            chunk = chunks[0]
            size = length(chunk)
            end = min(size, head + max_messages - n)
            taken.append((chunk, head, end))
            n += end - head
            if end == size:
                chunks.popleft()
                head = 0
            else:
                head = end
        self._head = head
        return taken, n

    def _took(self, n: int, notify_starving: bool) -> None:
        """Count ``n`` entries taken; notify a fetch thread holding back when the buffer has
        room for a whole batch again (or, with ``notify_starving``, when it fell below one)."""
        had_room = self._capacity - self._count >= self._batch
        was_starving = self._count < self._batch
        self._count -= n
        if (not had_room and self._capacity - self._count >= self._batch) or (
            notify_starving and not was_starving and self._count < self._batch
        ):
            self._cond.notify_all()
