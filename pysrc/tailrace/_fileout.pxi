# File outputs' per-message path (tailrace.files.FileProducer.send, and the compiled
# Collector's route to it): encode, then append to the partition's buffer. Once per
# emitted message, so compiled, and without a lock: the module keeps the GIL
# (freethreading_compatible=False) and the append below runs no Python code between
# finding the buffer and growing it, so two senders cannot interleave inside one
# append. Everything that writes, opens or fsyncs goes through the FileProducer
# under its lock, and a buffer is swapped out (FileOutput.take) under that lock, so
# the bytes reach the file in the order they were appended.


from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize


@cython.final
cdef class FileOutput:
    """One open output partition file and its encoded records not yet written.

    The records are copied into one buffer rather than kept as bytes objects (an
    encoder's bytes, orjson's especially, can hold far more memory than their length).
    A buffer keeps its size: only ``used`` bytes of it hold records, and it grows by
    doubling, so filling it copies each record once (a bytearray grown record by
    record from empty would be copied over about eight times per write). Two buffers
    take turns: ``take`` hands the full one to the writer and fills the other, which
    the writer hands back (``give_back``) once written.
    """

    cdef public int fd
    cdef bytearray _buf  # capacity; its first `used` bytes are the records
    cdef bytearray _spare  # the buffer last written, for the next take (or None)
    cdef readonly Py_ssize_t used

    def __init__(self, int fd):
        self.fd = fd
        self._buf = bytearray()
        self._spare = None
        self.used = 0

    cdef int append2(self, const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb,
                     Py_ssize_t size) except -1:
        """Append ``a`` then ``b`` (no Python code runs: one step under the GIL) to a buffer
        of at least ``size`` bytes (made that size at once: one allocation, which for the
        default 256 KiB is an mmap of its own, away from the heap of small objects)."""
        cdef Py_ssize_t need = self.used + na + nb
        cdef Py_ssize_t cap = PyByteArray_GET_SIZE(self._buf)
        if need > cap:
            cap = cap * 2 if cap * 2 > need else need
            if cap < size:
                cap = size
            PyByteArray_Resize(self._buf, cap)
        cdef char *dst = PyByteArray_AS_STRING(self._buf) + self.used
        memcpy(dst, a, na)
        memcpy(dst + na, b, nb)
        self.used = need
        return 0

    cpdef tuple take(self):
        """``(buffer, length)``: the buffered records (its first ``length`` bytes), leaving
        an empty buffer (one step: no sender sees neither); None when there are none.
        The caller owns the buffer until it hands it back with ``give_back``."""
        if self.used == 0:
            return None
        cdef bytearray data = self._buf
        cdef Py_ssize_t n = self.used
        self._buf = self._spare if self._spare is not None else bytearray()
        self._spare = None
        self.used = 0
        return data, n

    def give_back(self, bytearray data not None):
        """A buffer from ``take``, written: filled again after the current one."""
        self._spare = data


@cython.final
cdef class FileSink:
    """The compiled ``send`` of a FileProducer (see the top of this fragment).

    ``producer`` opens a partition's file (``_output(stream, partition)``, which
    registers it here with ``add``) and writes a full buffer (``_write_full(out)``),
    both under its lock. ``encode`` turns a message into bytes (a callable, or a
    JsonCodec), ``sep`` follows each.
    """

    cdef object producer
    cdef object encode
    cdef JsonCodec codec  # encode's own object when it is the compiled JSON codec: called directly
    cdef bytes sep
    cdef Py_ssize_t limit
    cdef Py_ssize_t buf_size  # a new buffer's size (see __init__)
    cdef str what  # "JSON" or "msgpack", for errors
    cdef dict streams  # stream -> list of FileOutput or None, by partition

    def __init__(self, producer, encode, bytes sep not None, Py_ssize_t limit, str what not None,
                 Py_ssize_t initial=-1):
        self.producer = producer
        if isinstance(encode, JsonCodec):
            self.codec = <JsonCodec>encode
            encode = self.codec.encode
        self.encode = encode
        self.sep = sep
        self.limit = limit
        # a buffer is written once it holds `limit` bytes: it never needs more than that
        # and one record, so it is made with room for a quarter more; `initial` (>= 0) starts
        # it smaller, growing by doubling (exactly-once outputs: a task's buffer holds a
        # commit's records, rarely near the limit)
        self.buf_size = initial if initial >= 0 else limit + limit // 4
        self.what = what
        self.streams = {}

    cdef list parts_of(self, str stream):
        """``stream``'s files by partition (None: not open yet), the list ``add`` fills in
        (a collector's route keeps it, saving a lookup per message)."""
        cdef list parts = self.streams.get(stream)
        if parts is None:
            parts = self.streams[stream] = []
        return parts

    def add(self, str stream not None, Py_ssize_t partition, FileOutput out not None):
        """Register the open file of ``stream``'s ``partition`` (called by the producer, under its lock)."""
        cdef list parts = self.parts_of(stream)
        while len(parts) <= partition:
            parts.append(None)
        parts[partition] = out

    def clear(self):
        """Forget every file (the producer is closing): later sends go to the producer, which refuses."""
        cdef list parts
        for parts in self.streams.values():
            del parts[:]  # the routes that keep these lists find no file either
        self.streams = {}

    cpdef send(self, str stream, Py_ssize_t partition, object key, object message):
        """Encode ``message`` and append it to ``stream``'s ``partition`` buffer."""
        self.send_to(self.parts_of(stream), stream, partition, key, message)

    cdef send_to(self, list parts, str stream, Py_ssize_t partition, object key, object message):
        """``send`` with ``parts_of(stream)`` already found."""
        cdef object line
        cdef object found = None
        cdef FileOutput out
        cdef JsonCodec codec = self.codec
        if 0 <= partition < len(parts):
            found = parts[partition]
        if codec is not None and found is not None and codec.plain(message):
            # a plain value, encoded into the codec's buffer and copied from there into
            # the partition's, with no Python code in between (no bytes object either)
            out = <FileOutput>found
            out.append2(codec.w.buf, codec.w.len,
                        PyBytes_AS_STRING(self.sep), PyBytes_GET_SIZE(self.sep), self.buf_size)
            codec.trim()
            if out.used >= self.limit:
                self.producer._write_full(out)
            return
        try:
            line = self.codec.encode(message) if self.codec is not None else self.encode(message)
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(
                f"file output {stream}[{partition}]: message is not {self.what}-serialisable: {e}"
            ) from None
        # looked up again: the encoding may have run Python code (another thread may
        # have closed the producer meanwhile)
        found = parts[partition] if 0 <= partition < len(parts) else None
        if found is None:
            found = self.producer._output(stream, partition)
        out = <FileOutput?>found
        if type(line) is not bytes:  # another bytes-like object from a custom encoder
            line = bytes(line)
        out.append2(PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line),
                    PyBytes_AS_STRING(self.sep), PyBytes_GET_SIZE(self.sep), self.buf_size)
        if out.used >= self.limit:
            self.producer._write_full(out)
