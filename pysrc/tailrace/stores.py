"""Key-value state stores of a task (SEMANTICS rules 25-29; docs/state.md).

A :class:`KeyValueStore` belongs to one task. Reads see the task's own writes at
once (rule 25). Writes stay in a per-task write-back cache until the task's next
commit, which hands them, encoded, to the checkpoint store together with the
task's offsets in **one atomic write** (rule 26): after any stop or crash the
task resumes with exactly the state of its last committed offsets.

The cache holds decoded keys and values (a hit costs no serde work). Entries
written since the last commit (*dirty*) stay in memory until that commit
succeeds; clean entries are evicted least recently used beyond ``cache.size``
entries, and a read that misses asks the backend (``state_get``), so the state
of a task may be far larger than memory (rule 29). Range scans merge the dirty
entries with the backend's committed entries in the order of the encoded keys.

Values keep value semantics: an immutable scalar the serde round-trips exactly
(``str``, ``int``, ``float``, ``bool``, ``None`` for json...) is cached as is;
anything else is encoded at ``put`` and decoded at each ``get``, so mutating an
object after ``put`` (or one returned by ``get``) never changes the store.

Thread-safety: every method may be called from the task's pool threads,
callbacks and coroutines; one lock per store keeps the store consistent. A
read-modify-write (``store[k] = store.get(k, 0) + 1``) spanning concurrent
calls of one task is the user's to guard (rule 21).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Generic, TypeVar

from .config import StoreSpec
from .errors import ConfigError
from .interfaces import CheckpointStore, EncodedRows, StateChanges
from .serdes import Serde, SerdeError, serde

__all__ = ["KeyValueStore", "TaskStores", "split_changes"]

K = TypeVar("K")
V = TypeVar("V")


# serdes whose arrays decode to lists: a store key read back from one is a tuple (a list
# is no key: unhashable), so a tuple key reads back as the tuple it was, committed or not
_ARRAY_KEYS = frozenset({"json", "msgpack"})


def _as_key(obj: Any) -> Any:
    return tuple(_as_key(x) for x in obj) if type(obj) is list else obj


def _tuple_keys(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode_key(data: bytes) -> Any:
        key = decode(data)
        return _as_key(key) if type(key) is list else key

    return decode_key


class _PyAbsent:
    """Cache marker: the key is known not to exist (deleted, or missing in the backend)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


class _PyEncoded:
    """A cached value kept as its encoded bytes (decoded at each read: value semantics)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _PyStoreCore:
    """The pure-Python twin of ``tailrace._stores.StoreCore`` (cache hits of get/put
    under the store's lock); used where the compiled module is missing, and by the tests.
    KeyValueStore.__init__ sets the attributes."""

    _entries: dict[Any, Any]
    _dirty: dict[Any, Any]
    _trusted: frozenset[type]
    _int_bits: bool
    _lock: Any
    _lru_at: int

    def _journal_note(self, key: Any) -> None:
        _journal_note(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when absent. Any thread."""
        with self._lock:
            entries = self._entries
            lazy = len(entries) < self._lru_at  # no recency order on hits below half full
            try:
                value = entries.get(key, _MISSING) if lazy else entries.pop(key, _MISSING)
            except TypeError as e:
                raise self._unhashable(key, e) from None  # type: ignore[attr-defined]
            if value is _MISSING:
                value = self._load(key)  # type: ignore[attr-defined]
                entries[key] = value
            elif not lazy:
                entries[key] = value  # most recently used last
        if value is _ABSENT:
            return default
        if type(value) is _Encoded:
            return self._decode(key, value.data)  # type: ignore[attr-defined]
        return value

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (durable at the task's next commit). Any thread."""
        t = type(value)
        if (
            t not in self._trusted
            or (t is int and self._int_bits and not _INT_MIN <= value < _INT_MAX)
            or (t is str and not value.isascii())
        ):
            value = self._cacheable(key, value)  # type: ignore[attr-defined]
        with self._lock:
            entries = self._entries
            self._journal_note(key)
            # an overwrite keeps the key's place in the recency order (reads move it)
            try:
                known = key in entries
            except TypeError as e:
                raise self._unhashable(key, e) from None  # type: ignore[attr-defined]
            if not known:
                self._new_key(key)  # type: ignore[attr-defined]
            entries[key] = value
            self._dirty[key] = value

    __setitem__ = put

    def __delitem__(self, key: Any) -> None:
        if not self.delete(key):  # type: ignore[attr-defined]
            raise KeyError(key)


def _py_evict_clean(
    entries: dict[Any, Any], dirty: dict[Any, Any], committing: dict[Any, Any], excess: int
) -> int:
    """``tailrace._stores.evict_clean`` in Python: delete up to ``excess`` least recently used
    entries that are neither dirty nor committing; the number deleted."""
    victims = []
    for key in entries:
        if key not in dirty and key not in committing:
            victims.append(key)
            if len(victims) >= excess:
                break
    for key in victims:
        del entries[key]
    return len(victims)


_PY_ABSENT: Final = _PyAbsent()
_PY_MISSING: Final = object()


try:
    from ._stores import ABSENT as _ABSENT
    from ._stores import MISSING as _MISSING
    from ._stores import Encoded as _Encoded
    from ._stores import Journal, journal_bind, journal_current
    from ._stores import StoreCore as _StoreCore
    from ._stores import StoreLock as _StoreLock
    from ._stores import encode_changes as _encode_changes_c
    from ._stores import encode_rows as _encode_rows_c
    from ._stores import evict_clean as _evict_clean
    from ._stores import own_methods as _own_methods
    from ._stores import scan_overlay as _scan_overlay_c
    from ._stores import split_changes as _split_changes_c
except ImportError:  # pragma: no cover - a build without the compiled store path
    _ABSENT = _PY_ABSENT
    _MISSING = _PY_MISSING
    _Encoded = _PyEncoded  # type: ignore[assignment, misc]
    _StoreCore = _PyStoreCore  # type: ignore[assignment, misc]
    _StoreLock = threading.Lock  # type: ignore[assignment, misc]
    _encode_changes_c = None  # type: ignore[assignment]
    _encode_rows_c = None  # type: ignore[assignment]
    _scan_overlay_c = None  # type: ignore[assignment]
    _split_changes_c = None  # type: ignore[assignment]
    _evict_clean = _py_evict_clean
    _journals = threading.local()

    class Journal:  # type: ignore[no-redef]
        """The pure-Python twin of ``tailrace._stores.Journal``."""

        def __init__(self) -> None:
            self._items: list[Any] = []

        def __len__(self) -> int:
            return len(self._items)

        def push(self, store: Any, key: Any, entry: Any) -> None:
            self._items += (store, key, entry)

        def clear(self) -> None:
            self._items.clear()

        def take(self, mark: int) -> list[tuple[Any, Any, Any]]:
            items = self._items
            out = [tuple(items[i : i + 3]) for i in range(mark, len(items) - 2, 3)]
            del items[mark:]
            return out

    def journal_bind(journal: Journal | None) -> None:
        """Record this thread's store writes into ``journal`` from now on (None: stop)."""
        _journals.current = journal

    def journal_current() -> Journal | None:
        """The journal bound on this thread, or None."""
        return getattr(_journals, "current", None)


COMPILED: Final = _StoreCore is not _PyStoreCore


def journal_undo(journal: Journal, mark: int = 0) -> int:
    """Undo the store writes recorded in ``journal`` after ``mark`` (newest first; a write is
    recorded as its store, its key and the key's cache entry before it), and drop them from
    the journal: each key's value is what it was before the first of those writes (rule 39:
    a skipped message of a sync task leaves no partial write). The number of writes undone.

    A key that was not cached is dropped from the cache and from the writes the next commit
    carries (it cannot have been one of them: a written key stays cached until its commit).
    A cached key gets its entry back and is marked written: if it was not, the next commit
    writes the value it already has. The writes are the invocation's own (the engine binds a
    journal per sync invocation's thread), so nothing else moved those keys meanwhile."""
    writes = journal.take(mark)
    for store, key, entry in reversed(writes):
        with store._lock:
            if entry is _MISSING:
                store._entries.pop(key, None)
                store._dirty.pop(key, None)
            else:
                store._entries[key] = entry
                store._dirty[key] = entry
    return len(writes)


def _journal_note(store: Any, key: Any) -> None:
    """The twin's record of a write (see ``tailrace._stores``), lock held."""
    journal = journal_current()
    if journal is None:
        return
    try:
        entry = store._entries.get(key, _MISSING)
    except TypeError:
        return  # an unhashable key: the write itself refuses it
    journal.push(store, key, entry)


def split_changes(
    changes: Mapping[bytes, bytes | None], yield_gil: bool = False
) -> tuple[list[bytearray], list[bytearray]]:
    """``(puts, deletes)`` of a store's encoded changes: ``puts`` a flat list ``[key, value,
    ...]`` (a multi-row statement's parameters), ``deletes`` the deleted keys. Compiled where
    built (``yield_gil``: let the GIL go now and then, on the commit writer's thread).

    Each key and value is a bytearray copy: the sqlite3 module binds a bytearray as a blob
    directly, but looks a bytes parameter up in its adapters first (an AttributeError made
    and cleared for each, about 300 ns on 3.11, 110 ns on 3.12 and 3.13; the copy costs
    tens)."""
    if _split_changes_c is not None and type(changes) is dict:
        return _split_changes_c(changes, yield_gil)
    puts: list[bytearray] = []
    deletes: list[bytearray] = []
    for key, value in changes.items():
        if value is None:
            deletes.append(bytearray(key))
        else:
            puts += (bytearray(key), bytearray(value))
    return puts, deletes


# Types a serde round-trips to an equal object of the same type: cached as is.
_EXACT: Final[dict[str, frozenset[type]]] = {
    "json": frozenset({str, int, float, bool, type(None)}),
    "str": frozenset({str}),
    "bytes": frozenset({bytes}),
    "int": frozenset({int}),
    "pickle": frozenset({str, int, float, bool, type(None), bytes}),
    "msgpack": frozenset({str, int, float, bool, type(None), bytes}),
}
# Of those, the types ``put`` may cache without encoding first (encoding cannot fail).
_TRUSTED: Final[dict[str, frozenset[type]]] = {
    "json": frozenset({str, int, float, bool, type(None)}),
    "str": frozenset({str}),
    "bytes": frozenset({bytes}),
    "int": frozenset({int}),  # range-checked in put
    "pickle": frozenset({str, int, float, bool, type(None), bytes}),
    "msgpack": frozenset({str, float, bool, type(None), bytes}),  # ints are range-limited
}


def _utf8(text: str) -> bool:
    """True when ``text`` has a UTF-8 encoding (no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = 1 << 63  # the int serde's range (msgpack's is wider: it encodes or refuses)


class KeyValueStore(_StoreCore, Generic[K, V]):
    """A task's key-value store: the mapping protocol, bulk writes and ordered range scans.

    ``store[k]`` (KeyError when absent), ``store.get(k, default)``, ``store[k] = v``,
    ``del store[k]`` (KeyError when absent), ``k in store``, ``put_all``,
    ``delete_all`` and ``items(start, end)`` / ``keys`` / ``values`` in the order of
    the encoded keys. Errors name the store and the key: SerdeError for a key or
    value the serde cannot encode (or stored bytes it cannot decode), TypeError
    for an unhashable key. Safe from any thread (see the module docstring).
    """

    # the commit's encoding of the common serdes in C (tailrace._stores.encode_changes)
    _compiled_encode: Callable[..., dict[bytes, bytes | None]] | None = (
        None if _encode_changes_c is None else staticmethod(_encode_changes_c)
    )
    _compiled_rows: Callable[..., tuple[list[bytearray], list[bytearray]]] | None = (
        None if _encode_rows_c is None else staticmethod(_encode_rows_c)
    )
    _compiled_overlay: Callable[..., list[tuple[bytes, Any, Any]]] | None = (
        None if _scan_overlay_c is None else staticmethod(_scan_overlay_c)
    )
    _evict_pass: Callable[[dict[Any, Any], dict[Any, Any], dict[Any, Any], int], int] = staticmethod(
        _evict_clean
    )

    def __init__(self, name: str, task_name: str, spec: StoreSpec, backend: CheckpointStore) -> None:
        self.name = name
        self.task_name = task_name
        self.spec = spec
        self._kserde: Serde = serde(spec.key_serde)
        self._kenc: Callable[[Any], bytes] = self._kserde._encode
        self._vserde: Serde = serde(spec.value_serde)
        self._exact = _EXACT.get(spec.value_serde, frozenset())
        self._trusted = _TRUSTED.get(spec.value_serde, frozenset())
        self._int_bits = spec.value_serde == "int"  # trusted ints still need the range check
        self._str_keys = spec.key_serde == "str"  # (the compiled miss of a complete store)
        # get/put/[]/in/del on cache hits: tailrace._stores.StoreCore (or _PyStoreCore)
        self._backend = backend
        self._cache_size = spec.cache_size
        self._lock = _StoreLock()
        # key -> value, _Encoded or _ABSENT; insertion order is recency (LRU first).
        self._entries: dict[Any, Any] = {}
        # key -> its value (the object in _entries, _Encoded or _ABSENT) of every key written
        # since the last commit began: a commit's snapshot is this dict, swapped out whole
        self._dirty: dict[Any, Any] = {}
        self._committing: dict[Any, Any] = {}  # the snapshot of the commit in flight
        self._evict_at = spec.cache_size  # len(_entries) that triggers an eviction pass
        # len(_entries) from which a hit makes its key the most recent: below half full no
        # recency order is kept on hits (nothing is evicted before the cache fills)
        self._lru_at = spec.cache_size // 2
        self.misses = 0  # reads that missed the cache (tests, tuning cache.size)
        # a working copy kept above the store by its owner (tailrace.windows): its ``_dirty``
        # counts as this store's, and ``flush()`` writes it into the store before a commit
        # takes the store's changes
        self._overlay: Any = None
        # True while the cache holds the whole state: the backend's state of this store
        # fitted the cache at start and was read into it whole (or there was none), and
        # nothing was evicted since (what a commit wrote stays cached until evicted). A
        # miss is then a key that does not exist: no backend read (a fresh task's first
        # touch of each key costs no query, nor does a restarted task's first touch of
        # a key it never had).
        self._complete = self._preload()

    def __repr__(self) -> str:
        return f"KeyValueStore({self.name!r}, task={self.task_name!r})"

    def _preload(self) -> bool:
        """Read the committed state into the cache when it fits with room to spare (fewer
        entries than ``cache.size``); True when the cache then holds the whole state. One
        ordered scan costs far less than a point read per key on first touch. A bigger
        state is read through on misses (rule 29), as one with a key the scan could not
        decode: nothing cached."""
        limit = self._cache_size - 1
        rows: list[tuple[bytes, bytes]] = []
        for row in self._backend.state_scan(self.task_name, self.name):
            if len(rows) >= limit:
                return False
            rows.append(row)
        kdecode: Callable[[bytes], Any] = self._kserde.decode
        if self._kserde.name in _ARRAY_KEYS:
            kdecode = _tuple_keys(kdecode)
        exact, entries = self._exact, {}
        try:
            for kb, vb in rows:
                key = kdecode(kb)
                try:
                    obj = self._vserde.decode(vb)
                except SerdeError:
                    obj = None  # kept encoded: the get that reads it reports it, as before
                    entries[key] = _Encoded(vb)
                    continue
                entries[key] = obj if type(obj) in exact else _Encoded(vb)
        except (SerdeError, TypeError):  # an undecodable or unhashable key: read through
            return False
        self._entries = entries
        return True

    # -- errors -----------------------------------------------------------------------
    def _where(self, key: Any) -> str:
        return f"store {self.name!r} of task {self.task_name!r}, key {key!r}"

    def _encode_key(self, key: Any) -> bytes:
        try:
            return self._kenc(key)  # the raw encoder (one call less on every miss and scan)
        except Exception:  # noqa: BLE001 - the serde's own call words the error
            pass
        try:
            return self._kserde.encode(key)
        except SerdeError as e:
            raise SerdeError(f"{self._where(key)}: {e}") from e

    def _unhashable(self, key: Any, e: TypeError) -> TypeError:
        return TypeError(f"{self._where(key)}: keys must be hashable ({e})")

    # -- reads --------------------------------------------------------------------------
    def _load(self, key: Any) -> Any:
        """A cache miss (lock held): read the committed value through, cache it (rule 29).

        The lock stays held so that no write or commit of this key can slip between
        the backend read and the cache insert."""
        kb = self._encode_key(key)
        try:
            hash(key)  # a pop from an empty dict does not hash
        except TypeError as e:
            raise self._unhashable(key, e) from None
        self.misses += 1
        data = None if self._complete else self._backend.state_get(self.task_name, self.name, kb)
        if data is None:
            value: Any = _ABSENT
        else:
            obj = self._decode(key, data)
            value = obj if type(obj) in self._exact else _Encoded(data)
        if len(self._entries) >= self._evict_at:
            self._evict()
        return value

    def _decode(self, key: Any, data: bytes) -> Any:
        try:
            return self._vserde.decode(data)
        except SerdeError as e:
            raise SerdeError(f"{self._where(key)}: {e}") from e

    # -- writes -------------------------------------------------------------------------
    def _cacheable(self, key: Any, value: Any) -> Any:
        """What the cache keeps for ``value``; raises SerdeError naming store and key."""
        t = type(value)
        if t in self._trusted and t is not int and (t is not str or _utf8(value)):
            return value
        if t is int and self._int_bits and _INT_MIN <= value < _INT_MAX:
            return value
        try:
            data = self._vserde.encode(value)
        except SerdeError as e:
            raise SerdeError(f"{self._where(key)}: {e}") from e
        return value if t in self._exact else _Encoded(data)

    def _new_key(self, key: Any) -> None:
        """A key not cached (lock held): refuse one the serde cannot encode or dict
        cannot hash now, not at the commit; make room."""
        self._encode_key(key)
        try:
            hash(key)
        except TypeError as e:
            raise self._unhashable(key, e) from None
        if len(self._entries) >= self._evict_at:
            self._evict()

    def delete(self, key: K) -> bool:
        """Remove ``key``; True if it existed. Durable at the task's next commit. Any thread."""
        with self._lock:
            entries = self._entries
            self._journal_note(key)
            try:
                value = entries.pop(key, _MISSING)
            except TypeError as e:
                raise self._unhashable(key, e) from None
            if value is _MISSING:
                value = self._load(key)
            entries[key] = _ABSENT
            if value is not _ABSENT:
                self._dirty[key] = _ABSENT
            return value is not _ABSENT

    def put_all(self, items: Mapping[K, V] | Iterable[tuple[K, V]]) -> None:
        """``put`` of every pair (a mapping or an iterable of pairs), under one lock."""
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        cached = [(k, self._cacheable(k, v)) for k, v in pairs]
        with self._lock:
            entries = self._entries
            for key, value in cached:
                self._journal_note(key)
                try:
                    known = entries.pop(key, _MISSING)
                except TypeError as e:
                    raise self._unhashable(key, e) from None
                if known is _MISSING:
                    self._new_key(key)
                entries[key] = value
                self._dirty[key] = value

    def delete_all(self, keys: Iterable[K]) -> None:
        """Remove every key of ``keys`` (absent ones are ignored)."""
        with self._lock:
            entries = self._entries
            for key in keys:
                self._journal_note(key)
                try:
                    known = entries.pop(key, _MISSING)
                except TypeError as e:
                    raise self._unhashable(key, e) from None
                if known is _MISSING:
                    self._new_key(key)
                # a delete of a key absent from the backend writes a harmless tombstone
                entries[key] = _ABSENT
                self._dirty[key] = _ABSENT

    # -- range scans -------------------------------------------------------------------
    def items(self, start: K | None = None, end: K | None = None) -> Iterator[tuple[K, V]]:
        """``(key, value)`` pairs with ``start <= key < end`` (None: unbounded), in the
        order of the encoded keys, merging uncommitted writes with the committed
        state. Writes after the call may or may not be seen."""
        lo = None if start is None else self._encode_key(start)
        hi = None if end is None else self._encode_key(end)
        with self._lock:
            keys = (*self._committing, *self._dirty)
            if self._compiled_overlay is not None:
                overlay = self._compiled_overlay(
                    self._entries, keys, self._encode_key, self._str_keys, lo, hi
                )
            else:
                overlay = []
                entries = self._entries
                for key in keys:
                    kb = self._encode_key(key)
                    if (lo is None or kb >= lo) and (hi is None or kb < hi):
                        overlay.append((kb, key, entries[key]))
        overlay.sort(key=lambda t: t[0])
        return self._merge(overlay, self._backend.state_scan(self.task_name, self.name, lo, hi))

    def _merge(
        self, overlay: list[tuple[bytes, Any, Any]], committed: Iterator[tuple[bytes, bytes]]
    ) -> Iterator[tuple[Any, Any]]:
        i, n = 0, len(overlay)
        kdecode: Callable[[bytes], Any] = self._kserde.decode
        absent, encoded = _ABSENT, _Encoded
        if self._kserde.name in _ARRAY_KEYS:
            kdecode = _tuple_keys(kdecode)
        for kb, vb in committed:
            while i < n and overlay[i][0] <= kb:
                okb, key, value = overlay[i]
                i += 1
                if value is not absent:
                    yield key, (self._decode(key, value.data) if type(value) is encoded else value)
                if okb == kb:  # the uncommitted entry replaces the committed one
                    break
            else:
                try:
                    key = kdecode(kb)
                except SerdeError as e:
                    raise SerdeError(f"store {self.name!r} of task {self.task_name!r}: {e}") from e
                yield key, self._decode(key, vb)
        for _, key, value in overlay[i:]:
            if value is not absent:
                yield key, (self._decode(key, value.data) if type(value) is encoded else value)

    def keys(self, start: K | None = None, end: K | None = None) -> Iterator[K]:
        """Keys of ``items(start, end)``."""
        return (k for k, _ in self.items(start, end))

    def values(self, start: K | None = None, end: K | None = None) -> Iterator[V]:
        """Values of ``items(start, end)``."""
        return (v for _, v in self.items(start, end))

    def __iter__(self) -> Iterator[K]:
        return self.keys()

    # -- cache --------------------------------------------------------------------------
    def _evict(self) -> None:
        """Drop least recently used clean entries down to 90% of ``cache.size`` (lock held).

        Dirty entries stay until their commit; when they alone exceed the cache the
        next pass waits until the cache grew by a tenth again (amortised O(1) per write)."""
        size = self._cache_size
        target = size - max(1, size // 10)  # room for the entry about to come in
        entries = self._entries
        excess = len(entries) - target
        if excess > 0 and self._evict_pass(entries, self._dirty, self._committing, excess):
            self._complete = False  # evicted entries live only in the backend now
        if len(entries) < size:
            self._evict_at = size  # (a cache under 10 entries has no tenth to grow by)
        else:  # dirty entries alone fill it: the next pass once it grew by a tenth (or one)
            self._evict_at = len(entries) + max(1, size // 10)

    def cached(self) -> int:
        """Entries in the cache now (dirty ones included)."""
        return len(self._entries)

    def dirty(self) -> int:
        """Entries written since the last commit began."""
        return len(self._dirty)

    # -- commit (engine side) ------------------------------------------------------------
    def _begin_commit(self) -> dict[Any, Any]:
        """The changes since the last commit, key -> value (``_Encoded``, ``_ABSENT``: deleted),
        taken in O(1) on the loop thread: the dirty dict itself, swapped for an empty one.
        Its keys stay pinned in the cache until ``_end_commit``; nothing mutates it after."""
        with self._lock:
            dirty = self._dirty
            if not dirty:
                return {}
            self._dirty = {}
            if self._committing:  # a failed commit's leftovers (cannot happen: _end_commit clears)
                dirty = {**self._committing, **dirty}
            self._committing = dirty
            return dirty

    def _encode(self, snapshot: dict[Any, Any], yield_gil: bool = False) -> dict[bytes, bytes | None]:
        """Encoded key -> encoded value (None: deleted) of a snapshot of ``_begin_commit``.
        Any thread, without the store's lock: the snapshot is the commit's own.
        ``yield_gil``: let the GIL go now and then (the commit writer's thread)."""
        if not snapshot:
            return {}
        try:
            if self._compiled_encode is not None:
                return self._compiled_encode(*self._compiled_args(snapshot, yield_gil))
            return self._encode_changes(snapshot, self._kserde._encode, self._vserde._encode)
        except Exception:  # noqa: BLE001 - cannot happen (put checked them); say which
            return self._encode_changes(snapshot, self._encode_key, self._encode_value)

    def _compiled_args(self, snapshot: dict[Any, Any], yield_gil: bool) -> tuple[Any, ...]:
        """The arguments of the compiled encodings (``encode_changes``, ``encode_rows``)."""
        kser, vser = self._kserde, self._vserde
        return (
            snapshot,
            snapshot,
            kser._encode,
            vser._encode,
            self.spec.key_serde,
            self.spec.value_serde,
            yield_gil,
        )

    def _encode_rows(self, snapshot: dict[Any, Any], yield_gil: bool = False) -> EncodedRows:
        """``_encode`` as the rows of a table (``EncodedRows``): compiled in one pass where
        built, else split from ``_encode``'s dict."""
        if self._compiled_rows is not None:
            try:
                return EncodedRows(*self._compiled_rows(*self._compiled_args(snapshot, yield_gil)))
            except Exception:  # noqa: BLE001 - cannot happen (put checked them): _encode says which
                pass
        return EncodedRows(*split_changes(self._encode(snapshot, yield_gil), yield_gil))

    def _encode_value(self, value: Any) -> bytes:
        try:
            return self._vserde.encode(value)
        except SerdeError as e:
            raise SerdeError(f"store {self.name!r} of task {self.task_name!r}: {e}") from e

    def _encode_changes(
        self, snapshot: dict[Any, Any], kenc: Callable[[Any], bytes], venc: Callable[[Any], bytes]
    ) -> dict[bytes, bytes | None]:
        """Encoded key -> encoded value (None: deleted) of ``snapshot``. The raw serde
        functions on the commit path: every key and value was checked at its put."""
        changes: dict[bytes, bytes | None] = {}
        for key, value in snapshot.items():
            if value is _ABSENT:
                changes[kenc(key)] = None
            elif type(value) is _Encoded:
                changes[kenc(key)] = value.data
            else:
                changes[kenc(key)] = venc(value)
        return changes

    def _end_commit(self, ok: bool) -> None:
        """After the atomic write: on success the committed entries turn clean; on failure
        they are dirty again and go into the next commit."""
        with self._lock:
            committing = self._committing
            self._committing = {}
            if not ok:
                self._dirty = {**committing, **self._dirty}
            elif len(self._entries) > self._cache_size:
                self._evict_at = self._cache_size
                self._evict()


if COMPILED:
    # store.get / store.put as fast as a dict's get: a call the interpreter specializes
    _own_methods(KeyValueStore, ("get", "put"))


class _PyPaths:
    """The pure-Python commit encoding, overlay and eviction (see ``_PyKeyValueStore``)."""

    _compiled_encode: Callable[..., dict[bytes, bytes | None]] | None = None
    _compiled_overlay: Callable[..., list[tuple[bytes, Any, Any]]] | None = None
    _compiled_rows: Callable[..., tuple[list[bytearray], list[bytearray]]] | None = None
    _evict_pass = staticmethod(_py_evict_clean)


if COMPILED:

    class _PyKeyValueStore(_PyPaths, _PyStoreCore, KeyValueStore[K, V]):
        """KeyValueStore on the pure-Python hot path and commit encoding (the tests run both)."""

else:  # KeyValueStore is on the pure-Python hot path already (an MRO of _PyStoreCore twice fails)

    class _PyKeyValueStore(_PyPaths, KeyValueStore[K, V]):  # type: ignore[no-redef]
        """KeyValueStore on the pure-Python hot path and commit encoding (the tests run both)."""


class TaskStores:
    """The stores of one task, by name, and their part of the task's commit."""

    def __init__(
        self,
        task_name: str,
        specs: Mapping[str, StoreSpec],
        backend: CheckpointStore,
        store_class: type[KeyValueStore[Any, Any]] | None = None,
    ) -> None:
        self.task_name = task_name
        cls = store_class or KeyValueStore
        self.stores: dict[str, KeyValueStore[Any, Any]] = {
            name: cls(name, task_name, spec, backend) for name, spec in specs.items()
        }

    def __bool__(self) -> bool:
        return bool(self.stores)

    def get(self, name: str) -> KeyValueStore[Any, Any]:
        """The store called ``name``; ConfigError naming the declared ones when there is none."""
        store = self.stores.get(name)
        if store is None:
            raise ConfigError(
                f"task {self.task_name!r} has no store {name!r}",
                key=f"stores.{name}",
                allowed=", ".join(sorted(self.stores))
                or "no stores declared ([stores.NAME] in the job file)",
            )
        return store

    def dirty(self) -> bool:
        """True when some store has writes its commit has not carried yet."""
        return any(s._dirty or (s._overlay is not None and s._overlay._dirty) for s in self.stores.values())

    def begin_commit(self) -> StateChanges:
        """Every store's encoded changes (only stores with changes appear): ``encode`` of
        ``snapshot``, at once."""
        return self.encode(self.snapshot())

    def snapshot(self) -> dict[str, dict[Any, Any]]:
        """Every store's snapshot of its changes (only stores with changes appear): O(1)
        per store, on the loop thread. ``encode`` turns it into the commit's state; the
        keys stay pinned in the caches until ``end_commit``."""
        snapshots: dict[str, dict[Any, Any]] = {}
        for name, store in self.stores.items():
            if store._overlay is not None:
                store._overlay.flush()
            snapshot = store._begin_commit()
            if snapshot:
                snapshots[name] = snapshot
        return snapshots

    def encode(
        self, snapshots: Mapping[str, dict[Any, Any]], yield_gil: bool = False, rows: bool = False
    ) -> StateChanges:
        """The encoded state of ``begin_commit``'s snapshots (any thread); ``rows``: each
        store's as ``EncodedRows`` (for a checkpoint store that ``takes_rows``)."""
        if rows:
            return {
                name: self.stores[name]._encode_rows(snapshot, yield_gil)
                for name, snapshot in snapshots.items()
            }
        return {name: self.stores[name]._encode(snapshot, yield_gil) for name, snapshot in snapshots.items()}

    def end_commit(self, ok: bool) -> None:
        for store in self.stores.values():
            store._end_commit(ok)
