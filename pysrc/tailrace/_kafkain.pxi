# Kafka inputs' per-message work (tailrace.kafka.system._KafkaReader.deliver): take
# each confluent-kafka Message of a consumed batch, decode its key and value and
# build its Envelope, once per message, so compiled (as file lines and Redis
# entries are). The reader keeps its position in Python; this loop skips messages
# fetched before a reposition, and a message that cannot be decoded keeps its place
# as an envelope whose message the reader makes (a BadInput naming partition and
# offset, rule 39).

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8

cdef enum:
    _RAW = 0  # the bytes as they are (bytes serde)
    _UTF8 = 1  # UTF-8 text (str serde)


cdef inline object _kafka_decode(object data, int kind, object decode):
    """New reference. ``data`` is the bytes confluent-kafka returned (never None here)."""
    if kind == _RAW and type(data) is bytes:
        return data
    if kind == _UTF8 and type(data) is bytes:
        return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), NULL)
    return decode(data)


def kafka_envelopes(list messages not None, Py_ssize_t next_offset, int key_kind, object decode_key,
                    int value_kind, object decode_value, str system, str stream,
                    Py_ssize_t partition, list out not None, object bad not None):
    """Append an Envelope to ``out`` for each message of ``messages`` (confluent-kafka
    Messages of one partition, in offset order) whose offset is at least ``next_offset``.

    A kind says how to decode a key or value: 0 keeps the bytes, 1 decodes UTF-8, 2
    calls the decoder (the serde's ``decode``); None (a null key, a tombstone) stays
    None. A message whose key or value raises ValueError, TypeError or RecursionError on
    decoding keeps its place: its envelope's key is None and its message
    ``bad(offset, field, error, value bytes)`` (``field``: ``"key"`` or ``"value"``).
    Each envelope's timestamp is the record's (rule 32), where it has one.
    Returns the offset after the last envelope appended.
    """
    cdef object m, k, v, key, value, off_obj, field, ts
    cdef Py_ssize_t off
    cdef Envelope env
    for m in messages:
        off_obj = m.offset()
        off = off_obj
        if off < next_offset:
            continue  # fetched before a reposition (librdkafka filters these too)
        k = m.key()
        v = m.value()
        field = "key"
        try:
            key = None if k is None else _kafka_decode(k, key_kind, decode_key)
            field = "value"
            value = None if v is None else _kafka_decode(v, value_kind, decode_value)
        except (ValueError, TypeError, RecursionError) as e:
            key = None
            value = bad(off_obj, field, e, v)
        env = new_envelope(system, stream, partition, off_obj, key, value)
        ts_type, ts = m.timestamp()
        if ts_type and type(ts) is int and 0 <= ts < 0x7FFFFFFFFFFFFFFF:
            env._ts = <int64_t>ts  # the record's own time (rule 32): create or log-append time
        out.append(env)
        next_offset = off + 1
    return next_offset


def kafka_split(list messages not None):
    """Group a consumed batch by partition: ``({(topic, partition): [message, ...]},
    [message with an error, ...])``, each list in the batch's order (the fetch
    thread's per-message work before its readers' ``deliver``)."""
    cdef dict by_key = {}
    cdef list errors = []
    cdef list lst
    cdef object m, key, last_key = None
    cdef list last = None
    for m in messages:
        if m.error() is not None:
            errors.append(m)
            continue
        key = (m.topic(), m.partition())
        if last is not None and key == last_key:
            lst = last  # consecutive messages of one partition: the common case
        else:
            got = by_key.get(key)
            if got is None:
                lst = []
                by_key[key] = lst
            else:
                lst = <list>got
            last, last_key = lst, key
        lst.append(m)
    return by_key, errors
