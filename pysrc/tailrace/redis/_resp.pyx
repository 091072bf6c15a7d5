# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: freethreading_compatible=False
"""tailrace.redis._resp: the RESP2 codec of the Redis system's fast path (compiled).

``Replies`` holds the bytes received from one connection and cuts them into
complete replies with a resumable scanner (a reply split over many reads is
scanned once, not again on every read). A complete reply is then decoded
either generically (``reply()``: bytes, int, None, lists; an error reply raises
``ReplyError``) or, for ``XREAD``, straight into the reader's parallel lists
(``xread()``: entry ids as str, keys and messages decoded by the codec), with
no list per entry or per field list: what a batch of entries leaves behind is a
few lists of atomic objects, which the garbage collector never traverses.

``Batch`` encodes a producer's entries as they are sent, per destination
stream, as RESP arguments in growing C buffers; ``take()`` joins them into one
``EVALSHA`` command of the ``XADD_BATCH`` script (see tailrace.redis._io).
``pack()`` encodes any other command.
"""

cimport cython
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport (
    PY_LOCK_ACQUIRED,
    PyLockStatus,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF8
from libc.stdlib cimport free, realloc
from libc.string cimport memchr, memcmp, memcpy, memmove

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    bint _is_str "PyUnicode_CheckExact"(object o)
    bint _is_bytes "PyBytes_CheckExact"(object o)
    char* PyByteArray_AS_STRING(object o)
    Py_ssize_t PyByteArray_GET_SIZE(object o)
    int PyByteArray_Resize(object o, Py_ssize_t size) except -1

cdef extern from "pythread.h":
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock, long long microseconds, int intr_flag) nogil

cdef enum:
    MAX_DEPTH = 32

# Codec kinds of Replies.xread() and Batch: how a message or key is (de)coded.
BYTES = 0
STR = 1
CALL = 2  # a Python callable (json)


from tailrace.types import BadInput as _BadInput


class ReplyError(Exception):
    """An error reply of Redis (``-ERR ...``); args[0] is its text."""


class ProtocolError(ValueError):
    """Bytes that are not a RESP2 reply."""


cdef inline bytes _type_byte(char t):
    """A reply's type byte as bytes (for messages; char is signed, a byte may be >= 0x80)."""
    return PyBytes_FromStringAndSize(&t, 1)


cdef inline Py_ssize_t _find_crlf(const char* buf, Py_ssize_t pos, Py_ssize_t end) noexcept:
    """Index of the '\\r' of the first CRLF at or after pos, or -1 if not all there yet."""
    cdef const char* p
    while pos < end:
        p = <const char*>memchr(buf + pos, c'\r', end - pos)
        if p == NULL:
            return -1
        pos = p - buf
        if pos + 1 >= end:
            return -1
        if buf[pos + 1] == c'\n':
            return pos
        pos += 1
    return -1


cdef inline Py_ssize_t _int_line(const char* buf, Py_ssize_t pos, Py_ssize_t end, long long* out) except -2:
    """Parse the integer at buf[pos] up to its CRLF into out; the index after the CRLF,
    or -1 when the line is not all there yet. (Headers are short: one pass, no memchr.)"""
    cdef Py_ssize_t i = pos
    cdef long long v = 0
    cdef bint neg = False
    cdef char ch
    if i < end and buf[i] == c'-':
        neg = True
        i += 1
    while i < end:
        ch = buf[i]
        if c'0' <= ch <= c'9':
            v = v * 10 + (ch - c'0')
            i += 1
            if i - pos > 19:
                raise ProtocolError("an integer too long in a reply")
            continue
        if ch != c'\r' or i == pos + neg:
            raise ProtocolError(f"bad integer {buf[pos:i + 1]!r} in a reply")
        if i + 1 >= end:
            return -1
        if buf[i + 1] != c'\n':
            raise ProtocolError("a header line does not end with CRLF")
        out[0] = -v if neg else v
        return i + 2
    return -1


cdef long long _parse_int(const char* buf, Py_ssize_t start, Py_ssize_t stop) except? -9:
    """The decimal integer buf[start:stop] (an optional '-', then digits)."""
    cdef bint neg = False
    cdef long long v = 0
    cdef Py_ssize_t i = start
    if i < stop and buf[i] == c'-':
        neg = True
        i += 1
    if i == stop or stop - i > 18:
        raise ProtocolError(f"bad integer {buf[start:stop]!r} in a reply")
    while i < stop:
        if buf[i] < c'0' or buf[i] > c'9':
            raise ProtocolError(f"bad integer {buf[start:stop]!r} in a reply")
        v = v * 10 + (buf[i] - c'0')
        i += 1
    return -v if neg else v


@cython.final
cdef class Replies:
    """The unread bytes of one connection, cut into complete RESP2 replies.

    ``feed(sock)`` reads once from a socket; ``ready()`` says whether a whole
    reply is buffered; ``reply()`` / ``xread()`` decode and drop it.
    """

    cdef bytearray _buf
    cdef Py_ssize_t _start  # first byte of the current reply
    cdef Py_ssize_t _end  # end of the bytes received
    cdef Py_ssize_t _pos  # where the scanner goes on
    cdef Py_ssize_t _done  # end of the current reply once scanned whole, else -1
    cdef int _depth
    cdef long long _left[MAX_DEPTH]  # elements still to come in each open array

    def __init__(self, Py_ssize_t size=65536):
        self._buf = bytearray(max(size, 1024))
        self.clear()

    def clear(self):
        """Forget everything buffered (after a connection was dropped)."""
        self._start = self._end = self._pos = 0
        self._done = -1
        self._depth = 1
        self._left[0] = 1

    @property
    def buffered(self):
        """Bytes received and not yet consumed."""
        return self._end - self._start

    def feed(self, sock):
        """Read once from ``sock`` (``recv_into``) into free space; the byte count (0: EOF)."""
        cdef Py_ssize_t cap = PyByteArray_GET_SIZE(self._buf)
        cdef Py_ssize_t n
        cdef char* b
        if cap - self._end < cap // 4:
            if self._start > 0:  # move the partial reply to the front
                b = PyByteArray_AS_STRING(self._buf)
                n = self._end - self._start
                memmove(b, b + self._start, n)
                self._pos -= self._start
                self._end = n
                self._start = 0
            if cap - self._end < cap // 4:
                PyByteArray_Resize(self._buf, cap * 2)
        with memoryview(self._buf) as view:
            n = sock.recv_into(view[self._end:])
        self._end += n
        return n

    cdef int _scan(self) except -1:
        """Scan on; 1 once the current reply is complete (its end in _done), else 0."""
        cdef const char* buf = PyByteArray_AS_STRING(self._buf)
        cdef Py_ssize_t pos = self._pos, end = self._end, eol, need
        cdef long long n
        cdef char t
        if self._done >= 0:
            return 1
        while self._depth > 0:
            if self._left[self._depth - 1] == 0:
                self._depth -= 1
                continue
            if pos >= end:
                break
            t = buf[pos]
            if t == c'$':
                eol = _int_line(buf, pos + 1, end, &n)
                if eol < 0:
                    break
                if n >= 0:
                    need = eol + n + 2
                    if need > end:
                        break
                    if buf[need - 2] != c'\r' or buf[need - 1] != c'\n':
                        raise ProtocolError("a bulk string does not end with CRLF")
                    pos = need
                else:
                    pos = eol
                self._left[self._depth - 1] -= 1
            elif t == c'*':
                eol = _int_line(buf, pos + 1, end, &n)
                if eol < 0:
                    break
                pos = eol
                self._left[self._depth - 1] -= 1
                if n > 0:
                    if self._depth == MAX_DEPTH:
                        raise ProtocolError("a reply nested too deep")
                    self._left[self._depth] = n
                    self._depth += 1
            elif t == c'+' or t == c'-' or t == c':':
                eol = _find_crlf(buf, pos, end)
                if eol < 0:
                    break
                pos = eol + 2
                self._left[self._depth - 1] -= 1
            else:
                raise ProtocolError(f"unexpected reply type byte {_type_byte(t)!r}")
        self._pos = pos
        if self._depth == 0:
            self._done = pos
            return 1
        return 0

    def ready(self):
        """Whether a whole reply is buffered (ProtocolError on bytes that are not RESP2)."""
        return self._scan() == 1

    cdef void _consume(self) noexcept:
        self._start = self._pos = self._done
        self._done = -1
        self._depth = 1
        self._left[0] = 1
        if self._start == self._end:
            self._start = self._end = self._pos = 0

    cdef object _item(self, const char* buf, Py_ssize_t* at):
        cdef Py_ssize_t pos = at[0]
        cdef Py_ssize_t eol = _find_crlf(buf, pos, self._done)
        cdef long long n, _i
        cdef char t = buf[pos]
        cdef list out
        if t == c'$':
            n = _parse_int(buf, pos + 1, eol)
            if n < 0:
                at[0] = eol + 2
                return None
            at[0] = eol + 2 + n + 2
            return PyBytes_FromStringAndSize(buf + eol + 2, n)
        at[0] = eol + 2
        if t == c':':
            return _parse_int(buf, pos + 1, eol)
        if t == c'+':
            return PyBytes_FromStringAndSize(buf + pos + 1, eol - pos - 1)
        if t == c'-':
            return ReplyError(PyUnicode_DecodeUTF8(buf + pos + 1, eol - pos - 1, "replace"))
        n = _parse_int(buf, pos + 1, eol)  # '*' (the scanner let nothing else through)
        if n < 0:
            return None
        out = []
        for _i in range(n):
            out.append(self._item(buf, at))
        return out

    def reply(self):
        """Decode and drop the complete reply (call ready() first): bytes, int, None or a
        list of those; an error reply raises ReplyError (errors nested in a list are
        returned as ReplyError objects)."""
        cdef Py_ssize_t at = self._start
        if self._scan() != 1:
            raise ProtocolError("no complete reply buffered")
        try:
            r = self._item(PyByteArray_AS_STRING(self._buf), &at)
        finally:
            self._consume()
        if isinstance(r, ReplyError):
            raise r
        return r

    def xread(self, int kind, decode=None):
        """Decode and drop a complete XREAD reply (RESP2): None when it timed out,
        else one tuple per stream: ``(key, ids, keys, messages, eos, bad)``.

        ``ids`` (str), ``keys`` and ``messages`` are parallel lists of the entries
        before the first end-of-stream entry (field ``eos``; ``eos`` is then True);
        later entries of that stream are left out. Keys (field ``k``) and messages
        (field ``m``) are decoded by ``kind``: BYTES, STR (UTF-8) or CALL
        (``decode(bytes)``). An entry that cannot be decoded (no field ``m``, or its
        key or message raises ValueError, TypeError or RecursionError) keeps its
        place: its key is None and its message a ``tailrace.types.BadInput`` of the
        exception and the bytes of its field ``m`` (None without one); ``bad`` lists
        ``(index, field)`` of those entries (``field``: ``"k"`` or ``"m"``, the one
        that failed), or is None when there is none. An error reply raises ReplyError.
        """
        cdef Py_ssize_t at = self._start
        if self._scan() != 1:
            raise ProtocolError("no complete reply buffered")
        try:
            return self._xread(PyByteArray_AS_STRING(self._buf), &at, kind, decode)
        finally:
            self._consume()

    cdef object _xread(self, const char* buf, Py_ssize_t* at, int kind, object decode):
        cdef Py_ssize_t pos = at[0], eol, id_pos, id_len, m_pos, m_len, k_pos, k_len, f_pos, f_len
        cdef Py_ssize_t v_pos, v_len
        cdef long long nstreams, nentries, nfields, _s, _e, _f
        cdef list out, ids, keys, messages, bad_at
        cdef bint eos, bad
        cdef object key, message, stream_key, eid, cause, field
        cdef char t = buf[pos]
        if t == c'-':
            eol = _find_crlf(buf, pos, self._done)
            raise ReplyError(PyUnicode_DecodeUTF8(buf + pos + 1, eol - pos - 1, "replace"))
        nstreams = self._array(buf, &pos)
        if nstreams < 0:
            return None
        out = []
        for _s in range(nstreams):
            if self._array(buf, &pos) != 2:
                raise ProtocolError("an XREAD stream is not a [key, entries] pair")
            stream_key = self._bulk_bytes(buf, &pos)
            nentries = self._array(buf, &pos)
            ids = []
            keys = []
            messages = []
            eos = False
            bad_at = None
            for _e in range(nentries):
                if self._array(buf, &pos) != 2:
                    raise ProtocolError("an XREAD entry is not an [id, fields] pair")
                self._bulk(buf, &pos, &id_pos, &id_len)
                nfields = self._array(buf, &pos)
                if eos:  # past the end: skip it
                    for _f in range(max(nfields, 0)):
                        self._bulk(buf, &pos, &f_pos, &f_len)
                    continue
                m_pos = k_pos = -1
                m_len = k_len = 0
                bad = nfields < 0 or nfields % 2 != 0
                for _f in range(max(nfields, 0) // 2):
                    self._bulk(buf, &pos, &f_pos, &f_len)
                    self._bulk(buf, &pos, &v_pos, &v_len)
                    if f_len == 1 and buf[f_pos] == c'm':
                        m_pos, m_len = v_pos, v_len
                    elif f_len == 1 and buf[f_pos] == c'k':
                        k_pos, k_len = v_pos, v_len
                    elif f_len == 3 and memcmp(buf + f_pos, b"eos", 3) == 0:
                        eos = True
                if bad and nfields > 0:  # an odd field count: skip the unpaired one
                    self._bulk(buf, &pos, &f_pos, &f_len)
                if eos:
                    continue
                eid = PyUnicode_DecodeASCII(buf + id_pos, id_len, "replace")
                cause = None
                field = "m"
                if m_pos < 0 or bad:
                    cause = KeyError(b"m")
                else:
                    try:
                        field = "k"
                        key = None if k_pos < 0 else _decode(buf + k_pos, k_len, kind, decode)
                        field = "m"
                        message = _decode(buf + m_pos, m_len, kind, decode)
                    except (ValueError, TypeError, RecursionError) as exc:  # UnicodeDecodeError,
                        cause = exc  # JSONDecodeError and SerdeError included
                if cause is not None:  # the entry keeps its place, as a BadInput (rule 39)
                    key = None
                    message = _BadInput(
                        cause, None if m_pos < 0 else PyBytes_FromStringAndSize(buf + m_pos, m_len))
                    if bad_at is None:
                        bad_at = []
                    bad_at.append((len(ids), field))
                ids.append(eid)
                keys.append(key)
                messages.append(message)
            out.append((stream_key, ids, keys, messages, eos, bad_at))
        at[0] = pos
        return out

    cdef long long _header(self, const char* buf, Py_ssize_t* at, char kind, str what) except? -9:
        """The count of an XREAD reply's array or bulk string header at at[0]; at[0] moves past it."""
        cdef Py_ssize_t pos = at[0], nxt
        cdef long long n
        if buf[pos] != kind:
            raise ProtocolError(f"expected {what} in an XREAD reply, got {_type_byte(buf[pos])!r}")
        nxt = _int_line(buf, pos + 1, self._done, &n)
        if nxt < 0:
            raise ProtocolError("a reply cut short")
        at[0] = nxt
        return n

    cdef long long _array(self, const char* buf, Py_ssize_t* at) except? -9:
        return self._header(buf, at, c'*', "an array")

    cdef int _bulk(self, const char* buf, Py_ssize_t* at, Py_ssize_t* start, Py_ssize_t* size) except -1:
        cdef long long n = self._header(buf, at, c'$', "a bulk string")
        if n < 0:
            raise ProtocolError("a nil bulk string in an XREAD entry")
        start[0] = at[0]
        size[0] = n
        at[0] += n + 2
        return 0

    cdef object _bulk_bytes(self, const char* buf, Py_ssize_t* at):
        cdef Py_ssize_t start, size
        self._bulk(buf, at, &start, &size)
        return PyBytes_FromStringAndSize(buf + start, size)


cdef inline object _decode(const char* p, Py_ssize_t n, int kind, object decode):
    if kind == 1:
        return PyUnicode_DecodeUTF8(p, n, NULL)
    if kind == 0:
        return PyBytes_FromStringAndSize(p, n)
    return decode(PyBytes_FromStringAndSize(p, n))


def envelopes(list out, make, str system, str stream, Py_ssize_t partition,
              list ids, list keys, list messages, Py_ssize_t first, Py_ssize_t end):
    """Append ``make(system, stream, partition, ids[i], keys[i], messages[i])`` to out
    for i in first..end-1 (a reader's poll() making Envelopes from its buffer)."""
    cdef Py_ssize_t i
    if not (0 <= first <= end <= len(ids) and len(keys) >= end and len(messages) >= end):
        raise IndexError(f"entries {first}..{end} of {len(ids)}")
    for i in range(first, end):
        out.append(make(system, stream, partition, ids[i], keys[i], messages[i]))


# -- encoding ----------------------------------------------------------------------

cdef inline void _put(bytearray out, const char* data, Py_ssize_t n) except *:
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, size + n)
    memcpy(PyByteArray_AS_STRING(out) + size, data, n)


cdef inline int _digits(char* tmp, long long v) noexcept:
    """Write v (>= 0) in decimal at the end of tmp[0:24]; the number of digits."""
    cdef int i = 24
    if v == 0:
        tmp[23] = c'0'
        return 1
    while v > 0:
        i -= 1
        tmp[i] = <char>(c'0' + v % 10)
        v //= 10
    return 24 - i


cdef void _put_header(bytearray out, char t, long long n) except *:
    cdef char tmp[27]
    cdef int d = _digits(tmp, n)
    tmp[24 - d - 1] = t
    tmp[24] = c'\r'
    tmp[25] = c'\n'
    _put(out, tmp + 24 - d - 1, d + 3)


cdef void _put_arg(bytearray out, object arg) except *:
    cdef Py_ssize_t n
    cdef const char* p
    if _is_bytes(arg):
        p = PyBytes_AS_STRING(arg)
        n = PyBytes_GET_SIZE(arg)
    elif _is_str(arg):
        p = PyUnicode_AsUTF8AndSize(arg, &n)
    elif isinstance(arg, (bytes, bytearray, memoryview)):
        arg = bytes(arg)
        p = PyBytes_AS_STRING(arg)
        n = PyBytes_GET_SIZE(arg)
    elif isinstance(arg, (int, float)) and not isinstance(arg, bool):
        arg = repr(arg).encode()
        p = PyBytes_AS_STRING(arg)
        n = PyBytes_GET_SIZE(arg)
    else:
        raise TypeError(
            f"a Redis command argument must be bytes, str, int or float, not {type(arg).__name__}")
    _put_header(out, c'$', n)
    _put(out, p, n)
    _put(out, b"\r\n", 2)


def pack(args):
    """One command (a sequence of bytes, str, int or float) as RESP2 bytes."""
    cdef bytearray out = bytearray()
    _put_header(out, c'*', len(args))
    for a in args:
        _put_arg(out, a)
    return bytes(out)


@cython.final
cdef class _Dest:
    """The encoded (message, key) argument pairs for one stream partition."""

    cdef char* data
    cdef Py_ssize_t size, cap, count
    cdef bytes key

    def __dealloc__(self):
        free(self.data)

    cdef int reserve(self, Py_ssize_t more) except -1:
        cdef Py_ssize_t cap = self.cap
        cdef char* p
        if self.size + more <= cap:
            return 0
        cap = max(cap * 2, self.size + more, 4096)
        p = <char*>realloc(self.data, cap)
        if p == NULL:
            raise MemoryError()
        self.data = p
        self.cap = cap
        return 0

    cdef int bulk_header(self, Py_ssize_t n) except -1:
        """Append "$n CRLF" and make room for the n bytes and the CRLF after it."""
        cdef char tmp[27]
        cdef int d = _digits(tmp, n)
        self.reserve(d + 3 + n + 2)
        tmp[24 - d - 1] = c'$'
        tmp[24] = c'\r'
        tmp[25] = c'\n'
        memcpy(self.data + self.size, tmp + 24 - d - 1, d + 3)
        self.size += d + 3
        return 0

    cdef int put(self, const char* p, Py_ssize_t n) except -1:
        """Append one bulk string ($n CRLF p CRLF)."""
        self.bulk_header(n)
        memcpy(self.data + self.size, p, n)
        self.size += n
        self.data[self.size] = c'\r'
        self.data[self.size + 1] = c'\n'
        self.size += 2
        return 0


@cython.final
cdef class Batch:
    """A producer's entries waiting to be written, encoded as they come, and its lock.

    ``add(stream, partition, key, message)`` encodes the message and key with the
    codec (``kind`` STR: str as UTF-8, bytes as is, anything else as ``str()``;
    BYTES: bytes as is, anything else as ``str().encode()``; CALL: ``encode(value)``
    giving str or bytes) and appends them to the partition's arguments; it
    returns the number of entries waiting. ``key_of(stream, partition)`` names a
    partition's Redis stream key (called once per partition). A value that cannot
    be encoded raises before anything is appended.

    ``send(stream, partition, key, message)`` is a whole ``Producer.send``: it adds
    the entry holding the batch's lock and, once ``limit`` entries wait, calls
    ``on_full()`` with the lock still held. The batch is that lock as a context
    manager too (``with batch: ...``; not reentrant), for the producer's flush.
    """

    cdef int _kind
    cdef object _encode
    cdef object _key_of
    cdef dict _streams  # stream name -> list of _Dest (None until used), by partition
    cdef list _active  # the _Dest with entries, in the order of their first entry
    cdef readonly Py_ssize_t count
    cdef Py_ssize_t _limit
    cdef object _on_full
    cdef PyThread_type_lock _lock

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    def __init__(self, int kind, encode, key_of, Py_ssize_t limit=0, on_full=None):
        self._kind = kind
        self._encode = encode
        self._key_of = key_of
        self._streams = {}
        self._active = []
        self.count = 0
        self._limit = limit if limit > 0 else (1 << 62)
        self._on_full = on_full

    cdef int _acquire(self) except -1:
        """Take the lock; waiting (GIL released) stays interruptible by signals.

        The GIL must be released while waiting: the holder needs it to finish
        (on_full writes to a socket in Python). The lock itself orders the
        batch's state between threads; nothing here is read without it.
        """
        cdef PyLockStatus got
        if PyThread_acquire_lock(self._lock, 0):
            return 0
        while True:
            with nogil:
                got = PyThread_acquire_lock_timed(self._lock, 20000, 0)
            if got == PY_LOCK_ACQUIRED:
                return 0
            PyErr_CheckSignals()

    def __enter__(self):
        self._acquire()
        return self

    def __exit__(self, *exc):
        PyThread_release_lock(self._lock)
        return False

    def send(self, str stream, Py_ssize_t partition, key, message):
        """Add one entry under the lock; on_full() (lock held) once ``limit`` entries wait."""
        self._acquire()
        try:
            if self._add(stream, partition, key, message) >= self._limit and self._on_full is not None:
                self._on_full()
        finally:
            PyThread_release_lock(self._lock)

    cdef object _bytes_of(self, object v):
        """v encoded by the codec, as an exact str or bytes."""
        if self._kind == 2:
            v = self._encode(v)
            if not (isinstance(v, (bytes, str))):
                raise TypeError(f"the codec returned {type(v).__name__}, not str or bytes")
        elif not (isinstance(v, bytes) or (self._kind == 1 and isinstance(v, str))):
            v = str(v) if self._kind == 1 else str(v).encode()
        if _is_bytes(v) or _is_str(v):
            return v
        return bytes(v) if isinstance(v, bytes) else (<str>v).encode()

    cdef _Dest _dest(self, str stream, Py_ssize_t partition):
        cdef list parts = self._streams.get(stream)
        cdef _Dest d
        if parts is None:
            parts = self._streams[stream] = []
        if partition < 0:
            raise ValueError(f"no partition {partition} of {stream!r}")
        if partition >= len(parts):
            parts.extend([None] * (partition + 1 - len(parts)))
        d = parts[partition]
        if d is None:
            d = _Dest()
            k = self._key_of(stream, partition)
            d.key = k.encode() if isinstance(k, str) else bytes(k)
            parts[partition] = d
        return d

    def add(self, str stream, Py_ssize_t partition, key, message):
        """Encode and append one entry (the caller holds the lock); the number waiting."""
        return self._add(stream, partition, key, message)

    cdef Py_ssize_t _add(self, str stream, Py_ssize_t partition, key, message) except -1:
        cdef object m = self._bytes_of(message)
        cdef object k = None if key is None else self._bytes_of(key)
        cdef const char* mp
        cdef const char* kp = NULL
        cdef Py_ssize_t mn, kn = 0
        cdef list parts = self._streams.get(stream)
        cdef _Dest d
        if parts is not None and 0 <= partition < len(parts) and parts[partition] is not None:
            d = parts[partition]
        else:
            d = self._dest(stream, partition)
        if _is_str(m):
            mp = PyUnicode_AsUTF8AndSize(m, &mn)
        else:
            mp = PyBytes_AS_STRING(m)
            mn = PyBytes_GET_SIZE(m)
        if k is not None:
            if _is_str(k):
                kp = PyUnicode_AsUTF8AndSize(k, &kn)
            else:
                kp = PyBytes_AS_STRING(k)
                kn = PyBytes_GET_SIZE(k)
        d.put(mp, mn)  # nothing can fail from here on but memory
        if kp == NULL:
            d.put(b"-", 1)
        else:
            _put_prefixed(d, c'=', kp, kn)
        if d.count == 0:
            self._active.append(d)
        d.count += 1
        self.count += 1
        return self.count

    def take(self, bytes sha):
        """The waiting entries as one ``EVALSHA sha nkeys key... n entries...`` command
        (bytes), emptying the batch; None when nothing waits."""
        cdef bytearray out
        cdef _Dest d
        cdef Py_ssize_t nkeys = len(self._active), nargs = 0, total = 0
        if nkeys == 0:
            return None
        for d in self._active:
            nargs += 1 + 2 * d.count
            total += d.size + len(d.key) + 48
        out = bytearray()
        _put_header(out, c'*', 3 + nkeys + nargs)
        _put_arg(out, b"EVALSHA")
        _put_arg(out, sha)
        _put_arg(out, str(nkeys))
        for d in self._active:
            _put_arg(out, d.key)
        for d in self._active:
            _put_arg(out, str(d.count))
            _put(out, d.data, d.size)
            d.size = 0
            d.count = 0
        self._active = []
        self.count = 0
        return bytes(out)

    def take_body(self):
        """The waiting entries as ``(stream keys, argument count, arguments)``: per stream key
        in order, its entry count then its (message, key) pairs, encoded as RESP bulk strings
        (the tail of a command whose header the caller writes), emptying the batch; None when
        nothing waits. The exactly-once commit's OUTPUT_COMMIT call ends with them."""
        cdef bytearray out
        cdef _Dest d
        cdef Py_ssize_t nargs = 0
        cdef list keys = []
        if not self._active:
            return None
        out = bytearray()
        for d in self._active:
            keys.append(d.key)
            nargs += 1 + 2 * d.count
            _put_arg(out, str(d.count))
            _put(out, d.data, d.size)
            d.size = 0
            d.count = 0
        self._active = []
        self.count = 0
        return keys, nargs, bytes(out)


cdef int _put_prefixed(_Dest d, char prefix, const char* p, Py_ssize_t n) except -1:
    """Append one bulk string: the byte prefix, then p[0:n]."""
    d.bulk_header(n + 1)
    d.data[d.size] = prefix
    d.size += 1
    memcpy(d.data + d.size, p, n)
    d.size += n
    d.data[d.size] = c'\r'
    d.data[d.size + 1] = c'\n'
    d.size += 2
    return 0
