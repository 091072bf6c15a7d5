"""The compiled RESP2 codec against a reference parser, on generated and damaged bytes.

``tailrace.redis._resp.Replies`` scans bytes as they arrive (in any chunking) and
decodes complete replies with bounds checks turned off, so it is checked here
without a server: every well-formed reply, cut into random chunks, decodes to
what a plain Python RESP2 parser makes of it (generically, and as an XREAD reply
when it has that shape); damaged bytes raise ProtocolError / ReplyError or wait
for more, and never read outside the buffer (that would crash the process).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailrace.redis import _resp
from tailrace.types import BadInput


class _Chunks:
    """A socket stand-in: recv_into hands out the data in the given chunk sizes."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data = data
        self.sizes = sizes

    def recv_into(self, view: Any) -> int:
        size = self.sizes.pop(0) if self.sizes else len(self.data)
        n = min(len(view), len(self.data), max(1, size))
        view[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


# -- a reference RESP2 encoder and parser ----------------------------------------
def _encode(v: Any) -> bytes:
    if v is None:
        return b"$-1\r\n"
    if isinstance(v, int):
        return b":%d\r\n" % v
    if isinstance(v, bytes):
        return b"$%d\r\n%s\r\n" % (len(v), v)
    if isinstance(v, tuple):  # ("+", text) or ("-", text): simple string / error
        return v[0].encode() + v[1] + b"\r\n"
    return b"*%d\r\n" % len(v) + b"".join(_encode(x) for x in v)


def _parse(data: bytes, pos: int = 0) -> tuple[Any, int]:
    """(value, next position); error replies parse as ("-", text)."""
    eol = data.index(b"\r\n", pos)
    t, line = data[pos : pos + 1], data[pos + 1 : eol]
    if t == b"+":
        return line, eol + 2
    if t == b"-":
        return ("-", line), eol + 2
    if t == b":":
        return int(line), eol + 2
    n = int(line)
    if t == b"$":
        return (None, eol + 2) if n < 0 else (data[eol + 2 : eol + 2 + n], eol + 4 + n)
    if n < 0:
        return None, eol + 2
    out, pos = [], eol + 2
    for _ in range(n):
        v, pos = _parse(data, pos)
        out.append(v)
    return out, pos


_line = st.binary(max_size=8).filter(lambda b: b"\r" not in b and b"\n" not in b)
_leaf = st.one_of(
    st.none(),
    st.integers(-(2**40), 2**40),
    st.binary(max_size=40),
    st.tuples(st.just("+"), _line),
    st.tuples(st.just("-"), _line.map(lambda b: b"ERR " + b)),
)
_value = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=5), max_leaves=30)

_field = st.sampled_from([b"m", b"k", b"eos", b"other"])
_entry = st.tuples(
    st.from_regex(rb"\A[0-9]{1,13}-[0-9]{1,4}\Z"),
    st.lists(st.tuples(_field, st.binary(max_size=12)), max_size=3).map(
        lambda fs: [x for f in fs for x in f]
    ),
)
_xread = st.lists(st.tuples(st.binary(min_size=1, max_size=10), st.lists(_entry, max_size=6)), max_size=3)


def _xread_reference(reply: list[Any]) -> list[tuple[Any, ...]]:
    """What Replies.xread(BYTES) gives for a well-formed XREAD reply (see its docstring)."""
    out = []
    for key, entries in reply:
        ids: list[str] = []
        keys: list[Any] = []
        messages: list[Any] = []
        eos, bad = False, None
        for eid, fields in entries:
            f = dict(zip(fields[::2], fields[1::2]))
            if b"eos" in f:
                eos = True
                break
            ids.append(eid.decode())
            if b"m" not in f or len(fields) % 2:  # a bad entry keeps its place
                bad = (bad or []) + [(len(ids) - 1, "m")]
                keys.append(None)
                messages.append(("bad", f.get(b"m")))
                continue
            keys.append(f.get(b"k"))
            messages.append(f[b"m"])
        out.append((key, ids, keys, messages, eos, bad))
    return out


def _errors_as_tuples(v: Any) -> Any:
    """An error inside an array comes back as a ReplyError object (as in redis-py)."""
    if isinstance(v, _resp.ReplyError):
        return ("-", v.args[0])
    if isinstance(v, list):
        return [_errors_as_tuples(x) for x in v]
    return v


def _error_texts(v: Any) -> Any:
    """The reference's ("-", bytes) errors with their text decoded as the codec does."""
    if isinstance(v, tuple):
        return ("-", v[1].decode("utf-8", "replace"))
    if isinstance(v, list):
        return [_error_texts(x) for x in v]
    return v


_chunking = st.lists(st.integers(1, 64), max_size=40)
_fuzz = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _feed_all(replies: _resp.Replies, source: _Chunks) -> bool:
    """Feed until a reply is complete or the data runs out; ready()."""
    while not replies.ready():
        if not source.data:
            return False
        replies.feed(source)
    return True


@_fuzz
@given(values=st.lists(_value, min_size=1, max_size=4), sizes=_chunking)
def test_any_replies_in_any_chunking_decode_as_the_reference_parses_them(
    values: list[Any], sizes: list[int]
) -> None:
    data = b"".join(_encode(v) for v in values)
    replies = _resp.Replies(size=64)
    source = _Chunks(data, sizes)
    pos = 0
    for _ in values:
        assert _feed_all(replies, source)
        expected, pos = _parse(data, pos)
        if isinstance(expected, tuple):  # an error reply
            try:
                replies.reply()
            except _resp.ReplyError as e:
                assert e.args[0] == expected[1].decode("utf-8", "replace")
            else:
                raise AssertionError("an error reply did not raise")
        else:
            assert _errors_as_tuples(replies.reply()) == _error_texts(expected)
    assert replies.buffered == 0 and not source.data


@_fuzz
@given(reply=_xread, sizes=_chunking)
def test_xread_replies_in_any_chunking_decode_into_the_readers_lists(
    reply: list[Any], sizes: list[int]
) -> None:
    wire = [[key, [[eid, fields] for eid, fields in entries]] for key, entries in reply]
    replies = _resp.Replies(size=64)
    assert _feed_all(replies, _Chunks(_encode(wire), sizes))
    got = replies.xread(_resp.BYTES)
    expected = _xread_reference(wire)
    assert got is not None and len(got) == len(expected)
    for g, e in zip(got, expected):
        messages = [("bad", m.raw) if isinstance(m, BadInput) else m for m in g[3]]
        assert (g[0], g[1], g[2], messages, g[4], g[5]) == e


@_fuzz
@given(
    value=st.one_of(_value, _xread.map(lambda r: [[k, [[i, f] for i, f in es]] for k, es in r])),
    cut=st.integers(0, 10**6),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
    sizes=_chunking,
    as_xread=st.booleans(),
)
def test_damaged_bytes_raise_or_wait_and_never_read_past_the_buffer(
    value: Any, cut: int, flips: list[tuple[int, int]], sizes: list[int], as_xread: bool
) -> None:
    data = bytearray(_encode(value))
    for at, byte in flips:
        data[at % len(data)] = byte
    data = data[: cut % (len(data) + 1)]
    replies = _resp.Replies(size=64)
    source = _Chunks(bytes(data), sizes)
    try:
        if not _feed_all(replies, source):
            return  # incomplete: the codec waits for more bytes
        if as_xread:
            replies.xread(_resp.BYTES)
        else:
            replies.reply()
    except (_resp.ProtocolError, _resp.ReplyError):
        pass
