"""The compiled envelope builder of Kafka readers (_core.kafka_envelopes, used by
KafkaSystem readers without headers) against the Python path (headers=True), over
real confluent-kafka Message objects; no broker needed."""

from __future__ import annotations

from typing import Any

import pytest

import tailrace
from tailrace.errors import InputError
from tailrace.kafka import KafkaRecord, KafkaSystem
from tailrace.types import BadInput, SystemStreamPartition

from .conftest import ck

SSP = SystemStreamPartition("kafka", "t", 3)


def _msg(offset: int, key: bytes | None, value: bytes | None) -> Any:
    return ck.Message(topic="t", partition=3, offset=offset, key=key, value=value)


def _read(system: KafkaSystem, batches: list[list[Any]], start: int = 0) -> list[Any]:
    from tailrace.kafka.system import _KafkaReader

    r = _KafkaReader(system, SSP, system.fetcher)
    r._next = start
    for b in batches:
        r.deliver(b)
    out: list[Any] = []
    while True:
        got = r.poll(1000)
        if not got:
            return out
        out += got


@pytest.mark.parametrize(
    ("key_serde", "value_serde", "key", "value", "decoded"),
    [
        ("str", "json", b"k1", b'{"a": [1, 2]}', ("k1", {"a": [1, 2]})),
        ("bytes", "bytes", b"\x00\xff", b"\x01", (b"\x00\xff", b"\x01")),
        ("int", "str", (7).to_bytes(8, "big", signed=True), "é".encode(), None),
        ("str", "json", None, None, (None, None)),  # null key, tombstone
    ],
)
def test_compiled_envelopes_match_the_python_path(
    key_serde: str, value_serde: str, key: bytes | None, value: bytes | None, decoded: Any
) -> None:
    plain = KafkaSystem("kafka", "127.0.0.1:1", key_serde=key_serde, value_serde=value_serde)
    with_headers = KafkaSystem(
        "kafka", "127.0.0.1:1", key_serde=key_serde, value_serde=value_serde, headers=True
    )
    batch = [_msg(o, key, value) for o in range(5, 9)]
    compiled = _read(plain, [batch])
    python = _read(with_headers, [batch])
    assert [e.offset for e in compiled] == [5, 6, 7, 8]
    for c, p in zip(compiled, python, strict=True):
        assert isinstance(c, tailrace.Envelope) and isinstance(p.message, KafkaRecord)
        assert (c.system, c.stream, c.partition, c.offset, c.key) == (
            p.system,
            p.stream,
            p.partition,
            p.offset,
            p.key,
        )
        assert c.message == p.message.value
    if decoded is not None:
        assert (compiled[0].key, compiled[0].message) == decoded


def test_messages_before_the_position_are_skipped() -> None:
    system = KafkaSystem("kafka", "127.0.0.1:1")
    got = _read(
        system, [[_msg(o, b"k", b"1") for o in range(0, 6)], [_msg(4, b"k", b"1"), _msg(6, b"k", b"2")]], 3
    )
    assert [e.offset for e in got] == [3, 4, 5, 6]


@pytest.mark.parametrize("headers", [False, True])
def test_a_message_that_cannot_be_decoded_keeps_its_place_and_the_next_ones_decode(headers: bool) -> None:
    # rule 39: a record whose key or value serde cannot decode is an envelope at its offset
    # whose message is a BadInput (the error names partition, offset and serdes; the value's
    # bytes kept), and the records after it decode as usual, in both paths
    system = KafkaSystem("kafka", "127.0.0.1:1", key_serde="str", value_serde="json", headers=headers)
    from tailrace.kafka.system import _KafkaReader

    r = _KafkaReader(system, SSP, system.fetcher)
    r.deliver([_msg(0, b"k", b"1"), _msg(1, b"\xff", b"2"), _msg(2, b"k", b"{nope"), _msg(3, b"k", b"3")])
    r.deliver([_msg(4, None, b"\xfe"), _msg(5, b"k", b"5")])
    got = r.poll(10) + r.poll(10)
    assert [e.offset for e in got] == [0, 1, 2, 3, 4, 5]
    values = [e.message.value if isinstance(e.message, KafkaRecord) else e.message for e in got]
    assert [values[i] for i in (0, 3, 5)] == [1, 3, 5]
    for i, field, raw in ((1, "key", b"2"), (2, "value", b"{nope"), (4, "value", b"\xfe")):
        env = got[i]
        assert type(env.message) is BadInput and env.key is None and env.message.raw == raw
        error = env.message.error
        assert isinstance(error, InputError) and error.__cause__ is not None
        text = str(error)
        assert f"offset {i} cannot be decoded" in text and "kafka.t[3]" in text and f"its {field}" in text
        assert "'str'" in text and "'json'" in text and "task.error.policy" in text
    assert r._next == 6


def test_a_consumed_batch_is_split_by_partition_in_order() -> None:
    # the fetch thread's grouping (_core.kafka_split): per partition in the batch's order,
    # error events apart
    from tailrace._core import kafka_split

    eof = ck.Message(topic="t", partition=0, error=ck.KafkaError(ck.KafkaError._PARTITION_EOF))
    order = [("t", 0, 0), ("t", 1, 0), ("t", 0, 1), ("t", 0, 2), ("u", 0, 0), ("t", 1, 1)]
    batch = [ck.Message(topic=t, partition=p, offset=o) for t, p, o in order]
    groups, errors = kafka_split([*batch[:3], eof, *batch[3:]])
    assert {k: [m.offset() for m in v] for k, v in groups.items()} == {
        ("t", 0): [0, 1, 2],
        ("t", 1): [0, 1],
        ("u", 0): [0],
    }
    assert errors == [eof]


def test_a_reader_gets_nothing_fetched_before_its_position_is_applied() -> None:
    # rules 6, 13: a container restarted over a partition registers a new reader at the
    # committed offset + 1 (274) while the fetch thread may already hold a batch fetched from
    # the partition's previous position (475..): delivered, it would leave a gap (274..474
    # skipped, then refused as "before the position" once re-read): nothing is lost
    from tailrace.kafka.system import _KafkaReader

    system = KafkaSystem("kafka", "127.0.0.1:1")
    fetcher = system.fetcher
    r = _KafkaReader(system, SSP, fetcher)
    r._next = 274
    fetcher.position(r, 274)  # what start() does; the fetch thread has not applied it yet
    fetcher.deliver({("t", 3): [_msg(o, b"k", b"1") for o in range(475, 480)]})
    assert r.poll(100) == []
    with fetcher.cond:  # what the fetch thread does once the consumer is repositioned
        fetcher._pending.clear()
        fetcher._unpositioned.discard(("t", 3))
    fetcher.deliver({("t", 3): [_msg(o, b"k", b"1") for o in range(274, 280)]})
    assert [e.offset for e in r.poll(100)] == list(range(274, 280))


def test_rule32_an_envelope_has_its_records_timestamp_on_both_paths() -> None:
    plain = KafkaSystem("kafka", "127.0.0.1:1", value_serde="json")
    with_headers = KafkaSystem("kafka", "127.0.0.1:1", value_serde="json", headers=True)
    batch = [
        ck.Message(
            topic="t", partition=3, offset=0, key=None, value=b"1", timestamp=(ck.TIMESTAMP_CREATE_TIME, 1234)
        ),
        ck.Message(
            topic="t",
            partition=3,
            offset=1,
            key=None,
            value=b"2",
            timestamp=(ck.TIMESTAMP_LOG_APPEND_TIME, 99),
        ),
        ck.Message(topic="t", partition=3, offset=2, key=None, value=b"3"),  # no timestamp
    ]
    for system in (plain, with_headers):
        assert [e.timestamp for e in _read(system, [batch])] == [1234, 99, None]
