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

cimport cython
from cpython.bytearray cimport PyByteArray_FromObject, PyByteArray_FromStringAndSize
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLong, PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject, PyTypeObject
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.unicode cimport PyUnicode_AsUTF8String


cdef extern from "Python.h":
    ctypedef struct PyMethodDef:
        pass
    ctypedef struct PyMethodDescrObject:
        PyMethodDef *d_method
    object PyDescr_NewMethod(PyTypeObject *tp, PyMethodDef *meth)
    Py_hash_t PyObject_Hash(object o)  # -1: an error is set (checked by the caller)
    void PyErr_Clear()
    bint PyUnicode_IS_ASCII(object o)
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL  # borrowed
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL


# The undo journal of the current invocation on this thread (rule 39: a skipped or
# dead-lettered message of a sync task leaves no partial store write behind). The engine
# binds a list here around a sync task's process calls when task.error.policy can skip;
# each first write of a key then appends (store, key, entry before, dirty before), and
# tailrace.stores.journal_undo puts them back. A strong reference, or NULL (no journal:
# nothing is recorded, the common case costs one thread-local read per put).
cdef extern from *:
    """
    static __thread PyObject *tr_store_journal = NULL;
    static inline PyObject *tr_journal_get(void) { return tr_store_journal; }
    static inline void tr_journal_set(PyObject *j) { tr_store_journal = j; }
    """
    PyObject *tr_journal_get() nogil
    void tr_journal_set(PyObject *j) nogil


@cython.final
cdef class Journal:
    """An undo journal: three references a recorded write (store, key, the key's cache
    entry before it, MISSING: not cached), in a C array that keeps its capacity across
    ``clear``. ``len`` is the number of references (a mark); ``take(mark)`` removes and
    returns the writes recorded after a mark, oldest first, as tuples."""

    cdef PyObject **items
    cdef Py_ssize_t n
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.items = NULL
        self.n = 0
        self.cap = 0

    def __dealloc__(self):
        self._truncate(0)
        PyMem_Free(self.items)

    def __len__(self):
        return self.n

    cdef int push3(self, object a, object b, object c) except -1:
        cdef PyObject **grown
        cdef Py_ssize_t cap
        if self.n + 3 > self.cap:
            cap = self.cap * 2 if self.cap else 256
            grown = <PyObject **>PyMem_Realloc(self.items, cap * sizeof(PyObject *))
            if grown is NULL:
                raise MemoryError()
            self.items = grown
            self.cap = cap
        Py_INCREF(a)
        Py_INCREF(b)
        Py_INCREF(c)
        self.items[self.n] = <PyObject *>a
        self.items[self.n + 1] = <PyObject *>b
        self.items[self.n + 2] = <PyObject *>c
        self.n += 3
        return 0

    def push(self, store, key, entry):
        """Record one write (the pure-Python store's path)."""
        self.push3(store, key, entry)

    cdef void _truncate(self, Py_ssize_t mark):
        cdef PyObject *o
        while self.n > mark:
            self.n -= 1
            o = self.items[self.n]
            self.items[self.n] = NULL
            Py_DECREF(<object>o)

    def clear(self):
        """Forget every recorded write (capacity kept)."""
        self._truncate(0)

    def take(self, Py_ssize_t mark):
        """The writes recorded after ``mark``, oldest first, as (store, key, entry); the
        journal keeps those before it."""
        cdef list out = []
        cdef Py_ssize_t i
        if mark < 0 or mark > self.n:
            raise ValueError(f"journal mark {mark} outside 0..{self.n}")
        i = mark
        while i + 3 <= self.n:
            out.append((<object>self.items[i], <object>self.items[i + 1], <object>self.items[i + 2]))
            i += 3
        self._truncate(mark)
        return out


def journal_bind(Journal journal):
    """Record this thread's store writes into ``journal`` from now on (None: stop)."""
    cdef PyObject *old = tr_journal_get()
    if journal is not None:
        Py_INCREF(journal)
    tr_journal_set(<PyObject *>journal if journal is not None else NULL)
    if old is not NULL:
        Py_DECREF(<object>old)


def journal_current():
    """The journal bound on this thread, or None."""
    cdef PyObject *j = tr_journal_get()
    if j is NULL:
        return None
    return <object>j


cdef extern from "<unistd.h>" nogil:
    int usleep(unsigned int usec)
from cpython.pythread cimport (
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)

import sys

if not getattr(sys, "_is_gil_enabled", lambda: True)():
    # StoreLock's flag is guarded by the GIL; tailrace.stores falls back to its
    # pure-Python twin (threading.Lock) on this ImportError
    raise ImportError("tailrace._stores needs the GIL (StoreLock); this build runs without it")


cdef class StoreLock:
    """A plain mutex for one store (not reentrant). ``with lock:`` from Python; the
    compiled paths call ``acquire_``/``release_`` directly.

    Every caller holds the GIL (the store is Python code and dict work), so the GIL
    orders ``_held`` and ``_waiters``: an uncontended acquire or release is a flag
    store, no atomic and no system call (the cache-hit path takes the lock twice per
    ``get`` + ``put``). A thread that finds the lock held (its holder released the GIL
    inside: a backend read, a user's ``__hash__``) waits on the ``_wake`` semaphore with
    the GIL released, since the holder may need the GIL to finish; a release with
    waiters posts it once. A waiter that wakes re-checks ``_held`` under the GIL (a
    thread that took the lock meanwhile wins; the waiter waits again).

    The GIL is the guard: a free-threaded build (``Py_GIL_DISABLED``) would need an
    atomic flag here, and is refused at import."""

    cdef PyThread_type_lock _wake
    cdef bint _held  # guarded by the GIL
    cdef Py_ssize_t _waiters  # guarded by the GIL: threads blocked on _wake

    def __cinit__(self):
        self._wake = PyThread_allocate_lock()
        if self._wake is NULL:
            raise MemoryError("cannot allocate a store lock")
        # _wake starts taken: it is a semaphore that releases post and waiters take
        PyThread_acquire_lock(self._wake, WAIT_LOCK)
        self._held = False
        self._waiters = 0

    def __dealloc__(self):
        if self._wake is not NULL:
            PyThread_free_lock(self._wake)

    cdef inline void acquire_(self) noexcept:
        if not self._held:
            self._held = True
            return
        self._wait()

    cdef void _wait(self) noexcept:
        while self._held:
            self._waiters += 1
            with nogil:
                PyThread_acquire_lock(self._wake, WAIT_LOCK)
            self._waiters -= 1
        self._held = True

    cdef inline void release_(self) noexcept:
        self._held = False
        if self._waiters:
            # one post per release with waiters; a post nobody consumed yet (the waiter
            # is between _waiters += 1 and its wait) keeps, so no wake-up is lost
            PyThread_release_lock(self._wake)

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
    value, Encoded or ABSENT in recency order; ``_dirty`` maps each key written since
    the last commit began to what it was set to (the same object as its entry), so that
    a commit takes its snapshot by swapping the dict, with no copy."""

    cdef public dict _entries
    cdef public dict _dirty
    cdef object _trusted_set
    # the same types as C pointers (owned by _trusted_set): put compares, no set lookup
    cdef PyObject* _trusted_types[8]
    cdef int _n_trusted
    cdef public bint _int_bits
    cdef public StoreLock _lock
    # for misses answered here (see _lookup); KeyValueStore keeps them up to date
    cdef public bint _complete  # the cache holds the whole state: a miss is an absent key
    cdef public bint _str_keys  # the key serde is "str"
    cdef public Py_ssize_t _evict_at  # len(_entries) that makes a miss evict first
    cdef public Py_ssize_t _lru_at  # len(_entries) from which a hit makes its key most recent
    cdef public Py_ssize_t misses
    cdef object _jkey  # the key a get found while a journal was bound, and its entry
    cdef object _jentry

    def __cinit__(self, *args, **kwargs):
        self._entries = {}
        self._dirty = {}
        self._trusted_set = frozenset()
        self._n_trusted = 0
        self._int_bits = False
        self._lock = StoreLock()
        self._complete = False
        self._str_keys = False
        self._evict_at = 0
        self._lru_at = 0
        self.misses = 0

    @property
    def _trusted(self):
        """The value types ``put`` caches without encoding them first (a frozenset)."""
        return self._trusted_set

    @_trusted.setter
    def _trusted(self, types):
        trusted = frozenset(types)
        if len(trusted) > 8:
            raise ValueError(f"at most 8 trusted value types, got {len(trusted)}")
        self._trusted_set = trusted
        self._n_trusted = 0
        for t in trusted:
            self._trusted_types[self._n_trusted] = <PyObject*>t
            self._n_trusted += 1

    cdef int _refuse_unhashable(self, object key) except -1:
        """Raise the store's TypeError for a key whose hash just failed (its error is set):
        the hot paths check the hash first, so that they need no ``try``."""
        PyErr_Clear()
        try:
            hash(key)
        except TypeError as e:
            raise self._unhashable(key, e) from None
        return 0  # its hash works now: go on

    cdef inline object _lookup(self, object key):
        """The cached value of ``key`` (loaded through on a miss), made most recent once the
        cache is half full (``_lru_at``). Lock held."""
        cdef dict entries = self._entries
        if type(key) is not str and PyObject_Hash(key) == -1:
            self._refuse_unhashable(key)
        # (no try on this path: each one saves and restores the thread's exception state)
        if len(entries) < self._lru_at:
            # a cache under half full keeps no recency order on hits (a hit is then one
            # lookup, not a pop and an insert): nothing is evicted before the cache fills,
            # and from half full on every hit moves its key to the end
            value = entries.get(key, _MISSING)
            if value is not _MISSING:
                return value
        else:
            value = entries.pop(key, _MISSING)
        if value is _MISSING:
            if (
                self._complete
                and self._str_keys
                and type(key) is str
                and len(entries) < self._evict_at
            ):
                # what _load does for this case, without a Python call (a fresh task's
                # first touch of each key): check the key encodes, count the miss
                try:
                    PyUnicode_AsUTF8String(key)
                except UnicodeEncodeError:
                    value = self._load(key)  # raises the store's SerdeError
                else:
                    self.misses += 1
                    value = _ABSENT
            else:
                value = self._load(key)
        entries[key] = value
        return value

    @cython.binding(False)  # a plain method descriptor: the cheapest call from Python
    def get(self, key, default=None):
        """The value of ``key``, or ``default`` when absent. Any thread."""
        cdef StoreLock lock = self._lock
        lock.acquire_()
        try:
            value = self._lookup(key)
            if tr_journal_get() is not NULL:
                self._jkey = key  # the entry a put of this key may record (_note)
                self._jentry = value
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
        cdef object t = type(value)
        cdef int i
        for i in range(self._n_trusted):
            if self._trusted_types[i] == <PyObject*>t:
                if t is int and self._int_bits:
                    PyLong_AsLongLongAndOverflow(value, &overflow)
                    if overflow:
                        return self._cacheable(key, value)  # raises, naming the range
                elif t is str and not PyUnicode_IS_ASCII(value):
                    # a str with a lone surrogate has no UTF-8: refused here, at the put
                    # (rule 39), not at the commit. The check caches the str's UTF-8, which
                    # the commit's encoding then reuses.
                    try:
                        PyUnicode_AsUTF8AndSize(value, NULL)
                    except UnicodeEncodeError:
                        return self._cacheable(key, value)  # raises, naming store and key
                return value
        return self._cacheable(key, value)

    cdef int _note(self, Journal journal, object key) except -1:
        """Record ``key``'s cache entry before a write (lock held). A ``get`` of the key just
        before (the common read-modify-write) found it already: ``_jkey`` / ``_jentry``,
        forgotten at every write, so no second lookup."""
        cdef PyObject *p
        cdef object entry
        if key is self._jkey:
            entry = self._jentry
        else:
            p = PyDict_GetItemWithError(self._entries, key)
            entry = <object>p if p is not NULL else _MISSING
        self._jkey = None
        self._jentry = None
        return journal.push3(self, key, entry)

    def _journal_note(self, key):
        """``_note`` into this thread's journal, if one is bound (the Python write paths)."""
        cdef PyObject *jp = tr_journal_get()
        self._jkey = None
        self._jentry = None
        if jp is not NULL:
            try:
                self._note(<Journal>jp, key)
            except TypeError:
                pass  # an unhashable key: the write itself refuses it

    cdef inline void _put(self, object key, object value) except *:
        value = self._checked(key, value)
        cdef StoreLock lock = self._lock
        cdef dict entries = self._entries
        cdef Py_ssize_t size
        cdef PyObject *jp
        if type(key) is not str and PyObject_Hash(key) == -1:
            self._refuse_unhashable(key)
        jp = tr_journal_get()
        lock.acquire_()
        try:
            if jp is not NULL:
                self._note(<Journal>jp, key)
            elif self._jkey is not None:
                self._jkey = None  # a write unrecorded: what a get found is stale now
                self._jentry = None
            # an overwrite keeps the key's place in the recency order (reads move it);
            # one dict operation on a hit: a new key shows as a grown dict, and is taken
            # out again until _new_key accepted it (checked, room made)
            size = len(entries)
            entries[key] = value
            if len(entries) != size:
                del entries[key]
                self._new_key(key)
                entries[key] = value
            self._dirty[key] = value
        finally:
            lock.release_()

    @cython.binding(False)
    def put(self, key, value):
        """Set ``key`` to ``value`` (durable at the task's next commit). Any thread."""
        self._put(key, value)

    def __setitem__(self, key, value):
        self._put(key, value)

    def __delitem__(self, key):
        if not self.delete(key):
            raise KeyError(key)


def own_methods(type cls, names):
    """Give ``cls``, a Python subclass of :class:`StoreCore`, method descriptors of its own
    for StoreCore's compiled methods ``names`` (the same C functions).

    The interpreter specializes a call of a method descriptor only when the instance is
    of the descriptor's exact type: ``store.get(k)`` on an instance of a subclass takes the
    generic call path instead (a vectorcall through the descriptor, a subtype check along
    the MRO). With its own descriptor the subclass's instances take the specialized one,
    as a dict's ``get`` does; instances of a further subclass take the generic path, as
    before (bench/README.md, "State stores")."""
    if not issubclass(cls, StoreCore):
        raise TypeError(f"{cls.__name__} is not a subclass of StoreCore")
    cdef PyMethodDef *meth
    own = StoreCore.__dict__
    method_descriptor = type(own["get"])
    for name in names:
        d = own[name]
        if type(d) is not method_descriptor:
            raise TypeError(f"StoreCore.{name} is not a method descriptor ({type(d).__name__})")
        meth = (<PyMethodDescrObject *><PyObject *>d).d_method
        setattr(cls, name, PyDescr_NewMethod(<PyTypeObject *>cls, meth))


cdef inline void _int_be(object value, unsigned char *buf) noexcept:
    """The int serde's encoding (8 bytes big-endian of value + 2**63) of an int that
    ``put`` range-checked already, into ``buf``."""
    cdef unsigned long long u = (<unsigned long long>PyLong_AsLongLong(value)) ^ (1ULL << 63)
    cdef int i
    for i in range(8):
        buf[7 - i] = <unsigned char>(u & 0xFF)
        u >>= 8


cdef inline bytes _int_bytes(object value):
    cdef unsigned char buf[8]
    _int_be(value, buf)
    return PyBytes_FromStringAndSize(<char*>buf, 8)


cdef Py_ssize_t _YIELD_EVERY = 4096  # keys encoded between two GIL hand-overs (~1-2 ms)


cdef inline void _yield_now_and_then(bint yield_gil, Py_ssize_t *n) noexcept:
    """With ``yield_gil``, every ``_YIELD_EVERY``-th call lets the GIL go for a moment (see
    ``encode_changes``); ``n`` counts the calls."""
    if yield_gil:
        n[0] += 1
        if n[0] % _YIELD_EVERY == 0:
            with nogil:
                usleep(20)


def encode_changes(
    dict entries, dict dirty, kenc, venc, str key_serde, str value_serde, bint yield_gil=False
):
    """Encoded key -> encoded value (None: deleted) of the ``dirty`` keys of ``entries``:
    a commit's state (a commit's snapshot is both: key -> value, Encoded or ABSENT, as
    ``_dirty`` holds them). ``kenc``/``venc`` are the serdes' raw encoders (every key and
    value was checked at its put); the common cases are encoded here without a Python call:
    str keys or values of the ``str`` serde (UTF-8), ints of the ``int`` serde, bytes of
    the ``bytes`` serde. Same bytes as the serdes'.

    ``yield_gil``: the commit writer's thread encodes while the loop runs; every
    ``_YIELD_EVERY`` keys it lets the GIL go for a moment, so the loop never waits for
    the whole encoding (a bare release is no hand-over: the releasing thread usually
    takes the GIL straight back, so it sleeps a few microseconds with the GIL released).
    Both dicts are then the commit's own snapshot: nothing mutates them meanwhile."""
    cdef bint str_keys = key_serde == "str"
    cdef bint str_values = value_serde == "str"
    cdef bint int_values = value_serde == "int"
    cdef bint bytes_values = value_serde == "bytes"
    cdef dict out = {}
    cdef object value
    cdef object t
    cdef Py_ssize_t n = 0
    for key in dirty:
        _yield_now_and_then(yield_gil, &n)
        if str_keys and type(key) is str:
            kb = PyUnicode_AsUTF8String(key)
        else:
            kb = kenc(key)
        value = entries[key]
        if value is _ABSENT:
            out[kb] = None
            continue
        t = type(value)
        if t is Encoded:
            out[kb] = (<Encoded>value).data
        elif int_values and t is int:
            out[kb] = _int_bytes(value)
        elif str_values and t is str:
            out[kb] = PyUnicode_AsUTF8String(value)
        elif bytes_values and t is bytes:
            out[kb] = value
        else:
            out[kb] = venc(value)
    return out


def encode_rows(
    dict entries, dict dirty, kenc, venc, str key_serde, str value_serde, bint yield_gil=False
):
    """``encode_changes`` and ``split_changes`` in one pass, with no dict between: ``(puts,
    deletes)`` of the ``dirty`` keys of ``entries``, ``puts`` a flat list ``[key, value,
    key, value, ...]`` and ``deletes`` the deleted keys, every one a bytearray (the
    parameters of tailrace.sqlite's multi-row statements; ``split_changes`` says why
    bytearrays). The same bytes as ``encode_changes``; a key written twice under two
    Python keys that encode alike (a NaN) is two rows, the later winning, as the dict's
    later value would. ``yield_gil`` as in ``encode_changes``."""
    cdef bint str_keys = key_serde == "str"
    cdef bint str_values = value_serde == "str"
    cdef bint int_values = value_serde == "int"
    cdef bint bytes_values = value_serde == "bytes"
    cdef list puts = []
    cdef list deletes = []
    cdef object value
    cdef object kb
    cdef object t
    cdef const char *p
    cdef Py_ssize_t size
    cdef Py_ssize_t n = 0
    cdef unsigned char buf[8]
    for key in dirty:
        _yield_now_and_then(yield_gil, &n)
        if str_keys and type(key) is str:
            p = PyUnicode_AsUTF8AndSize(key, &size)  # the str's own UTF-8 (kept with it)
            kb = PyByteArray_FromStringAndSize(p, size)
        else:
            kb = PyByteArray_FromObject(kenc(key))
        value = entries[key]
        if value is _ABSENT:
            deletes.append(kb)
            continue
        puts.append(kb)
        t = type(value)
        if t is Encoded:
            puts.append(PyByteArray_FromObject((<Encoded>value).data))
        elif int_values and t is int:
            _int_be(value, buf)
            puts.append(PyByteArray_FromStringAndSize(<char *>buf, 8))
        elif str_values and t is str:
            p = PyUnicode_AsUTF8AndSize(value, &size)
            puts.append(PyByteArray_FromStringAndSize(p, size))
        elif bytes_values and t is bytes:
            puts.append(PyByteArray_FromObject(value))
        else:
            puts.append(PyByteArray_FromObject(venc(value)))
    return puts, deletes


def evict_clean(dict entries, dict dirty, dict committing, Py_ssize_t excess):
    """Delete up to ``excess`` least recently used entries of ``entries`` that are in
    neither ``dirty`` nor ``committing`` (the store's lock held); the number deleted. The
    eviction pass of ``KeyValueStore._evict``, compiled: after a commit of a store bigger
    than its cache it may drop tens of thousands of entries."""
    cdef list victims = []
    cdef Py_ssize_t n = 0
    if excess <= 0:
        return 0
    for key in entries:
        if key not in dirty and key not in committing:
            victims.append(key)
            n += 1
            if n >= excess:
                break
    for key in victims:
        del entries[key]
    return n


def split_changes(dict changes, bint yield_gil=False):
    """``(puts, deletes)`` of a store's encoded changes (encoded key -> encoded value, None:
    deleted): ``puts`` a flat list ``[key, value, key, value, ...]`` (the parameters of a
    multi-row statement), ``deletes`` the deleted keys. ``yield_gil`` as in
    ``encode_changes`` (every few thousand keys)."""
    cdef list puts = []
    cdef list deletes = []
    cdef Py_ssize_t n = 0
    for key, value in changes.items():
        _yield_now_and_then(yield_gil, &n)  # (three copies a key: as often as encode_changes)
        # bytearray copies (stores.split_changes says why)
        if value is None:
            deletes.append(PyByteArray_FromObject(key))
        else:
            puts.append(PyByteArray_FromObject(key))
            puts.append(PyByteArray_FromObject(value))
    return puts, deletes


def scan_overlay(dict entries, keys, encode_key, bint str_keys, lo, hi):
    """``(encoded key, key, cached value)`` of the cached ``keys`` whose encoding lies in
    ``[lo, hi)`` (None: unbounded), unsorted: the uncommitted part of a range scan (the
    store's lock held). ``encode_key`` encodes (and words errors); exact str keys of the
    ``str`` serde are encoded here as UTF-8 (the same bytes)."""
    cdef list out = []
    for key in keys:
        if str_keys and type(key) is str:
            kb = PyUnicode_AsUTF8String(key)
        else:
            kb = encode_key(key)
        if (lo is None or kb >= lo) and (hi is None or kb < hi):
            out.append((kb, key, entries[key]))
    return out
