# The collector handed to process/window/end_of_stream: compiled, because a task
# that emits calls send once per message (tailrace.collector re-exports it).

import zlib as _zlib

from tailrace.types import parse_system_stream as _parse_system_stream


cpdef Py_ssize_t key_partition(object key, Py_ssize_t partitions) except -1:
    """Stable partition of a key (the same in every process and run)."""
    if partitions <= 0:
        raise ValueError(f"a stream needs at least one partition, got {partitions}")
    if _is_bytes(key):
        data = key
    elif _is_str(key):
        data = (<str>key).encode()
    elif isinstance(key, bytes):
        data = bytes(key)
    elif isinstance(key, str):
        data = str(key).encode()
    else:
        data = repr(key).encode()
    return <Py_ssize_t>(<unsigned long>_zlib.crc32(data) % <unsigned long>partitions)


DEF _PLACED_MAX = 65536  # str keys whose partition a route remembers (then it starts over)


@cython.final
cdef class _Route:
    """Where one ``send`` stream name goes: its producer, stream and partition count."""

    cdef object producer
    cdef object send  # producer.send, bound once
    cdef FileSink sink  # the producer's compiled send (files), or None
    cdef list parts  # sink.parts_of(stream) when sink is set
    cdef dict placed  # str key -> its partition (key_partition is a pure function), bounded
    cdef str stream
    cdef Py_ssize_t partitions
    cdef object name  # the stream name as given to send (the key of Collector._routes)


@cython.final
cdef class Collector:
    """Routes ``send(stream, message, key=None, partition=None)`` to a system's producer.

    ``stream`` is ``"system.stream"`` (or a bare stream name on the default output
    system). The partition is the one given, else the key's stable hash, else
    round robin. ``send`` may block while the output is full (rule 24). Safe to
    call from any thread (producers are thread-safe).
    """

    cdef object _producers
    cdef object _default_system
    cdef dict _routes  # stream name as given -> _Route
    # the route of the last send: a task sends to one stream name object (a literal)
    # over and over, so an identity test spares the lookup
    cdef _Route _last
    cdef Py_ssize_t _rr
    cdef readonly long long sent  # messages handed to producers

    def __init__(self, producers, default_system=None):
        self._producers = producers
        self._default_system = default_system
        self._routes = {}
        self._rr = 0
        self.sent = 0

    cdef _Route _resolve(self, object stream):
        try:
            ss = _parse_system_stream(stream, self._default_system)
        except ValueError as e:
            raise ValueError(f"collector.send: {e}") from None
        producer = self._producers.get(ss.system)
        if producer is None:
            raise ValueError(
                f"collector.send: no system {ss.system!r} for stream {stream!r} "
                f"(systems: {', '.join(sorted(self._producers)) or 'none'})"
            )
        cdef _Route r = _Route.__new__(_Route)
        r.producer = producer
        r.send = producer.send
        sink = getattr(producer, "_tailrace_sink", None)
        r.sink = sink if isinstance(sink, FileSink) else None
        r.stream = ss.stream
        r.parts = r.sink.parts_of(r.stream) if r.sink is not None else None
        r.placed = {}
        r.partitions = producer.partitions(ss.stream)
        r.name = stream
        self._routes[stream] = r
        return r

    def send(self, stream, message, key=None, partition=None):
        """Send ``message`` to ``stream`` (``"system.stream"``), to ``partition`` if given."""
        cdef _Route r = self._last  # one read: another thread may replace it meanwhile
        cdef object found
        cdef Py_ssize_t p
        if r is None or r.name is not stream:
            found = self._routes.get(stream)
            r = self._resolve(stream) if found is None else <_Route>found
            self._last = r
        if partition is None:
            if _is_str(key):
                # a str key's partition, remembered: its hash is cached in the str, so this
                # skips encoding and crc32 for every key seen before
                found = r.placed.get(key)
                if found is None:
                    if len(r.placed) >= _PLACED_MAX:
                        r.placed.clear()
                    p = key_partition(key, r.partitions)
                    r.placed[key] = p
                else:
                    p = <Py_ssize_t>found
            elif key is not None:
                p = key_partition(key, r.partitions)
            else:
                p = self._rr % r.partitions
                self._rr += 1
        else:
            p = partition
            if not 0 <= p < r.partitions:
                raise ValueError(
                    f"collector.send: {stream!r} has no partition {partition} (it has {r.partitions})")
        if r.sink is not None:
            r.sink.send_to(r.parts, r.stream, p, key, message)
        else:
            r.send(r.stream, p, key, message)
        self.sent += 1
