# File inputs' per-line work (tailrace.files.FileReader.poll): find each line of a
# chunk, decode it and build its Envelope, once per message, so compiled. The
# reader keeps the chunk, its file offset and the line number in Python; this loop
# only walks the chunk and stops at the first bad line, which the reader reports
# (file and line) or skips.

from libc.string cimport memchr
from cpython.bytes cimport PyBytes_FromStringAndSize


def file_decode_lines(bytes data not None, Py_ssize_t at, Py_ssize_t end, Py_ssize_t base,
                      Py_ssize_t want, object decode, str system, str stream,
                      Py_ssize_t partition, object key_field, list out not None):
    """Decode the lines of ``data[at:end]`` (each ends with a newline) into ``out``.

    ``base`` is the file offset of ``data[0]``; an envelope's offset is the byte
    offset of its line (a trailing ``\\r`` is not part of the message); its key is
    ``message[key_field]`` for a dict message when ``key_field`` is set. Appends at
    most ``want`` envelopes and stops after the first line whose ``decode`` raises
    ValueError (or RecursionError). Returns ``(at, lines, error, start)``: where it
    stopped, how many lines it consumed, that error (or None) and the offset of the bad line. ``decode`` is
    a callable or a JsonCodec (then its ``decode``).
    """
    if at < 0 or end > len(data) or at > end:
        raise ValueError(f"file_decode_lines: range {at}:{end} outside {len(data)} bytes")
    cdef const char *buf = <const char *>data
    cdef const char *nl
    cdef Py_ssize_t lines = 0, got = 0, start, n
    cdef object raw, message, key
    cdef Envelope env
    cdef bint keyed = key_field is not None
    cdef JsonCodec codec = <JsonCodec>decode if isinstance(decode, JsonCodec) else None
    while at < end and got < want:
        nl = <const char *>memchr(buf + at, 10, <size_t>(end - at))
        if nl == NULL:
            raise ValueError("file_decode_lines: the last line has no newline")
        start = at
        n = nl - (buf + at)
        at += n + 1
        lines += 1
        if n and buf[start + n - 1] == 13:  # \r\n
            n -= 1
        # a plain JSON text is read straight from the chunk; any other line is made bytes
        message = codec.read(buf + start, n) if codec is not None else _NOT_READ
        if message is _NOT_READ:
            raw = PyBytes_FromStringAndSize(buf + start, n)
            try:
                message = codec.decode_other(raw) if codec is not None else decode(raw)
            except (ValueError, RecursionError) as e:  # RecursionError: nested too deep to read
                return at, lines, e, base + start
        key = message.get(key_field) if keyed and type(message) is dict else None
        env = new_envelope_at(system, stream, partition, base + start, key, message)
        out.append(env)
        got += 1
    return at, lines, None, 0
