# File outputs' per-message path (tailrace.files.FileProducer.send, and the compiled
# Collector's route to it): encode, then append to the partition's buffer. Once per
# emitted message, so compiled, and without a lock: the module keeps the GIL
# (freethreading_compatible=False) and the append below runs no Python code between
# finding the buffer and growing it, so two senders cannot interleave inside one
# append. Everything that writes, opens or fsyncs goes through the FileProducer
# under its lock, and a buffer is swapped out (FileOutput.take) under that lock, so
# the bytes reach the file in the order they were appended.


from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize


cdef inline int _append2(bytearray buf, bytes a, bytes b) except -1:
    """``buf += a + b`` with one resize (amortised like bytearray's own growth)."""
    cdef Py_ssize_t n = PyByteArray_GET_SIZE(buf)
    cdef Py_ssize_t na = PyBytes_GET_SIZE(a), nb = PyBytes_GET_SIZE(b)
    PyByteArray_Resize(buf, n + na + nb)
    cdef char *dst = PyByteArray_AS_STRING(buf) + n
    memcpy(dst, PyBytes_AS_STRING(a), na)
    memcpy(dst + na, PyBytes_AS_STRING(b), nb)
    return 0


@cython.final
cdef class FileOutput:
    """One open output partition file and its encoded lines not yet written.

    The lines are copied into one bytearray rather than kept as bytes objects: an
    encoder's bytes (orjson's especially) can hold far more memory than their length.
    """

    cdef public int fd
    cdef public bytearray buf

    def __init__(self, int fd):
        self.fd = fd
        self.buf = bytearray()

    cpdef bytearray take(self):
        """The buffered bytes, leaving an empty buffer (one step: no sender sees neither)."""
        cdef bytearray fresh = bytearray()
        cdef bytearray data = self.buf
        self.buf = fresh
        return data


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
    cdef str what  # "JSON" or "msgpack", for errors
    cdef dict streams  # stream -> list of FileOutput or None, by partition

    def __init__(self, producer, encode, bytes sep not None, Py_ssize_t limit, str what not None):
        self.producer = producer
        if isinstance(encode, JsonCodec):
            self.codec = <JsonCodec>encode
            encode = self.codec.encode
        self.encode = encode
        self.sep = sep
        self.limit = limit
        self.what = what
        self.streams = {}

    def add(self, str stream not None, Py_ssize_t partition, FileOutput out not None):
        """Register the open file of ``stream``'s ``partition`` (called by the producer, under its lock)."""
        cdef list parts = self.streams.get(stream)
        if parts is None:
            parts = self.streams[stream] = []
        while len(parts) <= partition:
            parts.append(None)
        parts[partition] = out

    def clear(self):
        """Forget every file (the producer is closing): later sends go to the producer, which refuses."""
        self.streams = {}

    cpdef send(self, str stream, Py_ssize_t partition, object key, object message):
        """Encode ``message`` and append it to ``stream``'s ``partition`` buffer."""
        cdef object line
        try:
            line = self.codec.encode(message) if self.codec is not None else self.encode(message)
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(
                f"file output {stream}[{partition}]: message is not {self.what}-serialisable: {e}"
            ) from None
        cdef list parts = self.streams.get(stream)
        cdef object found = None
        if parts is not None and 0 <= partition < len(parts):
            found = parts[partition]
        if found is None:
            found = self.producer._output(stream, partition)
        cdef FileOutput out = <FileOutput?>found
        cdef bytearray buf = out.buf
        if type(line) is bytes:
            _append2(buf, <bytes>line, self.sep)
        else:  # another bytes-like object from a custom encoder
            buf += line
            buf += self.sep
        if len(buf) >= self.limit:
            self.producer._write_full(out)
