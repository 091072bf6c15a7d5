# cython: language_level=3, boundscheck=False, wraparound=False
"""The hot path of a task's key-value store, compiled: cache hits of ``get`` / ``put``
(and the mapping dunders) under the store's lock, with no Python-level call.

Everything else (misses, encoding checks, eviction, scans, commits) is plain Python in
``tailrace.stores``, which subclasses :class:`StoreCore`; a miss or a value that needs
checking calls back into it (``_load``, ``_cacheable``, ``_new_key``, ``_unhashable``,
``_decode``, ``delete``) with the lock held where the contract there says so.
``tailrace.stores`` has a pure-Python twin of this module for builds without it; the
tests run both (tests/stores).
"""

from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.pythread cimport (
    NOWAIT_LOCK,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)


cdef class StoreLock:
    """A plain mutex for one store (not reentrant). ``with lock:`` from Python; the
    compiled paths call ``acquire_``/``release_`` directly.

    A contended acquire waits with the GIL released: the holder may need the GIL to
    finish (a backend read, a user's ``__hash__``), so waiting with it would deadlock."""

    cdef PyThread_type_lock _lock

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock is NULL:
            raise MemoryError("cannot allocate a store lock")

    def __dealloc__(self):
        if self._lock is not NULL:
            PyThread_free_lock(self._lock)

    cdef inline void acquire_(self) noexcept:
        if PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            return
        with nogil:
            PyThread_acquire_lock(self._lock, WAIT_LOCK)

    cdef inline void release_(self) noexcept:
        PyThread_release_lock(self._lock)

    def __enter__(self):
        self.acquire_()
        return self

    def __exit__(self, *exc):
        self.release_()
        return False


cdef class Encoded:
    """A cached value kept as its encoded bytes (decoded at each read: value semantics)."""

    cdef readonly bytes data

    def __init__(self, bytes data):
        self.data = data


class _Absent:
    """Cache marker: the key is known not to exist (deleted, or missing in the backend)."""

    __slots__ = ()

    def __repr__(self):
        return "<absent>"


ABSENT = _Absent()
MISSING = object()
cdef object _ABSENT = ABSENT
cdef object _MISSING = MISSING


cdef class StoreCore:
    """Cache hits of a store (see the module docstring). ``_entries`` maps key ->
    value, Encoded or ABSENT in recency order; ``_dirty`` holds the keys written since
    the last commit began."""

    cdef public dict _entries
    cdef public dict _dirty
    cdef public object _trusted
    cdef public bint _int_bits
    cdef public StoreLock _lock

    def __cinit__(self, *args, **kwargs):
        self._entries = {}
        self._dirty = {}
        self._trusted = frozenset()
        self._int_bits = False
        self._lock = StoreLock()

    cdef inline object _lookup(self, object key):
        """The cached value of ``key`` (loaded through on a miss), made most recent. Lock held."""
        cdef dict entries = self._entries
        try:
            value = entries.pop(key, _MISSING)
        except TypeError as e:
            raise self._unhashable(key, e) from None
        if value is _MISSING:
            value = self._load(key)
        entries[key] = value
        return value

    def get(self, key, default=None):
        """The value of ``key``, or ``default`` when absent. Any thread."""
        cdef StoreLock lock = self._lock
        lock.acquire_()
        try:
            value = self._lookup(key)
        finally:
            lock.release_()
        if value is _ABSENT:
            return default
        if type(value) is Encoded:
            return self._decode(key, (<Encoded>value).data)
        return value

    def __getitem__(self, key):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key):
        return self.get(key, _MISSING) is not _MISSING

    cdef inline object _checked(self, object key, object value):
        cdef int overflow = 0
        t = type(value)
        if t in self._trusted:
            if t is int and self._int_bits:
                PyLong_AsLongLongAndOverflow(value, &overflow)
                if overflow:
                    return self._cacheable(key, value)  # raises, naming the range
            return value
        return self._cacheable(key, value)

    cdef inline void _put(self, object key, object value) except *:
        value = self._checked(key, value)
        cdef StoreLock lock = self._lock
        cdef dict entries = self._entries
        lock.acquire_()
        try:
            # an overwrite keeps the key's place in the recency order (reads move it)
            try:
                known = key in entries
            except TypeError as e:
                raise self._unhashable(key, e) from None
            if not known:
                self._new_key(key)
            entries[key] = value
            self._dirty[key] = None
        finally:
            lock.release_()

    def put(self, key, value):
        """Set ``key`` to ``value`` (durable at the task's next commit). Any thread."""
        self._put(key, value)

    def __setitem__(self, key, value):
        self._put(key, value)

    def __delitem__(self, key):
        if not self.delete(key):
            raise KeyError(key)
