"""In-memory checkpoint store: committed offsets and state in dicts, for tests and
examples (survives container restarts within one process)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..config import options_checked
from ..errors import CheckpointError, ConfigError
from ..interfaces import CheckpointStore, CommitOutputs, StateChanges
from ..types import Offset, Offsets, SystemStreamPartition


def decode_state(entries: Mapping[bytes, bytes], key_serde: str, value_serde: str) -> dict[Any, Any]:
    """Encoded store entries as the task reads them, in the order of the encoded keys: each
    key and value decoded by its serde (an array key of json or msgpack as a tuple, as a
    store reads it back)."""
    from ..serdes import serde
    from ..stores import _ARRAY_KEYS, _tuple_keys  # the store's own rule for array keys

    kdecode: Callable[[bytes], Any] = serde(key_serde).decode
    if key_serde in _ARRAY_KEYS:
        kdecode = _tuple_keys(kdecode)
    vdecode = serde(value_serde).decode
    return {kdecode(k): vdecode(v) for k, v in sorted(entries.items())}


class MemoryCheckpointStore(CheckpointStore):
    """Checkpoints and state in dicts; survives container restarts within one process.

    ``history`` records the writes as (task, offsets), oldest first, so tests can
    check the commit sequence. Bounded, so that long runs with frequent commits
    do not grow: once ``history_limit`` writes (default 1000) were recorded it
    holds at least the last ``history_limit`` and fewer than twice that (older
    ones are dropped in chunks). None keeps every write, 0 none.

    State (rules 25-29) is kept per job, task and store as encoded bytes, so a
    test sees exactly what a durable store would read back. One lock makes each
    ``write`` atomic for readers on other threads.
    """

    @options_checked
    def __init__(self, history_limit: int | None = 1000) -> None:
        if history_limit is not None and (
            isinstance(history_limit, bool) or not isinstance(history_limit, int) or history_limit < 0
        ):
            raise ConfigError(
                f"expected an integer >= 0 or None, got {history_limit!r}",
                key="history_limit",
                allowed="an integer >= 0 (0 records no write), or None (records every write)",
            )
        self._data: dict[str, dict[str, dict[SystemStreamPartition, Offset]]] = {}
        # job -> (task, store) -> encoded key -> encoded value
        self._state: dict[str, dict[tuple[str, str], dict[bytes, bytes]]] = {}
        self._marks: dict[str, dict[str, int]] = {}  # job -> exactly-once output file -> committed length
        self._lock = threading.Lock()
        self._job: str | None = None
        self.history_limit = history_limit
        self.history: list[tuple[str, dict[SystemStreamPartition, Offset]]] = []

    def open(self, job_name: str) -> None:
        self._job = job_name
        self._data.setdefault(job_name, {})
        self._state.setdefault(job_name, {})

    def _require_job(self) -> str:
        if self._job is None:
            raise RuntimeError("checkpoint store is not open")
        return self._job

    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        return dict(self._data[self._require_job()].get(task_name, {}))

    def write(
        self,
        task_name: str,
        offsets: Offsets,
        state: StateChanges | None = None,
        outputs: CommitOutputs | None = None,
    ) -> None:
        job = self._require_job()
        if outputs is not None and outputs.records:
            raise CheckpointError("the memory checkpoint store cannot append Redis entries")
        with self._lock:
            if outputs is not None:
                self._marks.setdefault(job, {}).update(outputs.marks)
            self._data[job].setdefault(task_name, {}).update(offsets)
            if state:
                stores = self._state[job]
                for name, changes in state.items():
                    entries = stores.setdefault((task_name, name), {})
                    for key, value in changes.items():
                        if value is None:
                            entries.pop(key, None)
                        else:
                            entries[key] = value
        limit = self.history_limit
        if limit is None or limit > 0:
            history = self.history
            history.append((task_name, dict(offsets)))
            if limit is not None and len(history) >= 2 * limit:
                del history[:limit]  # trimmed in chunks: amortised O(1) per write

    def output_marks(self, paths: Iterable[str] | None = None) -> dict[str, int]:
        job = self._require_job()
        with self._lock:
            marks = self._marks.get(job, {})
            if paths is None:
                return dict(marks)
            return {p: marks[p] for p in paths if p in marks}

    def state_get(self, task_name: str, store: str, key: bytes) -> bytes | None:
        job = self._require_job()
        with self._lock:
            return self._state[job].get((task_name, store), {}).get(key)

    def state_scan(
        self, task_name: str, store: str, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        job = self._require_job()
        with self._lock:
            entries = self._state[job].get((task_name, store), {})
            found = sorted(
                (k, v)
                for k, v in entries.items()
                if (start is None or k >= start) and (end is None or k < end)
            )
        return iter(found)

    def state(
        self,
        task_name: str,
        store: str,
        job_name: str | None = None,
        *,
        raw: bool = False,
        key_serde: str = "json",
        value_serde: str = "json",
    ) -> dict[Any, Any]:
        """A copy of the committed contents of one store of a task (for tests and tools), in
        the order of the encoded keys: keys and values decoded with ``key_serde`` and
        ``value_serde`` (the store's ``key.serde`` / ``value.serde``; json by default, as a
        store's), or, with ``raw=True``, the encoded bytes as the store keeps them."""
        with self._lock:
            entries = dict(self._state.get(job_name or self._job or "", {}).get((task_name, store), {}))
        return entries if raw else decode_state(entries, key_serde, value_serde)

    def reset(self) -> int:
        """Forget the open job's offsets and state; the number of tasks that had offsets."""
        job = self._require_job()
        with self._lock:
            n = len(self._data[job])
            self._data[job] = {}
            self._state[job] = {}
        return n

    def committed(self, job_name: str | None = None) -> dict[SystemStreamPartition, Offset]:
        """Every committed offset of a job, across tasks."""
        tasks = self._data.get(job_name or self._job or "", {})
        return {ssp: off for offsets in tasks.values() for ssp, off in offsets.items()}

    def close(self) -> None:
        self._job = None
