"""tailrace._core.JsonCodec, the compiled ``json`` serde: every fast path (orjson, json's C
scanner and C encoder called below json's Python layer) gives the standard library's bytes,
values and errors, with and without orjson."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import random
import struct
import sys
import threading
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailrace import serdes
from tailrace._core import JsonCodec

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)

STD = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True)


def _std_bytes(obj: Any) -> bytes:
    return STD.encode(obj).encode()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _std_only() -> JsonCodec:
    """The codec as serdes builds it, without orjson (the standard library's fast paths only)."""
    import json.encoder

    markers: dict[int, Any] = {}
    c_encoder = json.encoder.c_make_encoder(
        markers, STD.default, json.encoder.encode_basestring, None, ":", ",", False, False, True
    )
    return JsonCodec(STD.encode, json.loads, json.decoder.JSONDecoder().scan_once, c_encoder, markers)


CODECS = {"serdes": lambda: serdes._json_codec, "std-only": _std_only}


@pytest.fixture(params=sorted(CODECS))
def codec(request: pytest.FixtureRequest) -> JsonCodec:
    c = CODECS[request.param]()
    assert c is not None
    return c


def test_serdes_uses_the_compiled_codec_with_every_fast_path() -> None:
    assert serdes._json_codec is not None
    assert serdes._json_encode == serdes._json_codec.encode
    assert serdes._json_decode == serdes._json_codec.decode
    orjson, scanner, encoder = serdes._json_codec.fast
    assert scanner and encoder
    assert orjson == (serdes._orjson is not None)
    assert _std_only().fast == (False, True, True)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_same_bytes_and_values_as_the_standard_library(value: Any) -> None:
    for c in (serdes._json_codec, _std_only()):
        assert c is not None
        out = c.encode(value)
        assert out == _std_bytes(value)
        assert c.encode_std(value) == out
        for data in (out, out.decode(), b" " + out, out + b"\n ", out.decode() + " "):
            assert _same(c.decode(data), json.loads(data)), data
            assert _same(c.decode_std(data), json.loads(data)), data
    # serdes' pure-Python codec (where the compiled core is missing) says the same
    assert serdes._py_json_encode(value) == _std_bytes(value)
    assert _same(serdes._py_json_decode(_std_bytes(value)), json.loads(_std_bytes(value)))


def _error(fn: Any, arg: Any) -> tuple[type[BaseException], str] | None:
    try:
        fn(arg)
    except Exception as e:  # noqa: BLE001 - compared below
        return type(e), str(e)
    return None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b"[1,2",
        b'{"a":1}x',
        b'{"a":1} {"b":2}',
        b'{"a":1,}',
        b'{"a":\xff}',
        b'{"a":"\xc3"}',
        b"\xef\xbb\xbf{}",
        "\ufeff{}",
        b"{\x00}",
        b"[NaN, Infinity, -Infinity]",
        b'{"n": 12345678901234567890123}',
        b"[" * 100000 + b"]" * 100000,
        "{'a': 1}",
        b"nul",
        b"  ",
    ],
)
def test_bad_and_odd_input_is_read_or_refused_as_json_loads_does(codec: JsonCodec, data: Any) -> None:
    want = _error(json.loads, data)
    got = _error(codec.decode, data)
    assert got == want
    if want is None:
        assert _same(codec.decode(data), json.loads(data))
        assert _same(codec.decode_std(data), json.loads(data))


def test_an_encoding_error_leaves_no_circular_reference_marker_behind(codec: JsonCodec) -> None:
    inner: dict[str, Any] = {"ok": 1, "bad": object()}
    outer = [inner]
    with pytest.raises(TypeError) as e:
        codec.encode(outer)
    assert str(e.value) == "Object of type object is not JSON serializable"
    del inner["bad"]
    assert codec.encode(outer) == b'[{"ok":1}]'  # not "Circular reference detected"
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="Circular reference detected"):
        codec.encode(cyclic)
    assert codec.encode([1, [2]]) == b"[1,[2]]"


def test_an_encoding_that_runs_python_code_may_encode_again(codec: JsonCodec) -> None:
    # a dict subclass's items() runs while the C encoder is busy with it: encoding the
    # same object again there must not trip over the first encoding's markers
    depth = []

    class Items(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            if not depth:
                depth.append(1)
                assert codec.encode_std(self) == b'{"a":1}'
            return super().items()

    assert codec.encode_std(Items(a=1)) == b'{"a":1}'
    assert depth == [1]


def test_threads_encoding_the_same_values_get_the_same_bytes(codec: JsonCodec) -> None:
    values = [{"user": f"u{i}", "n": i, "f": i / 7, "l": [i, {"x": None}]} for i in range(300)]
    want = [_std_bytes(v) for v in values]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                assert [codec.encode_std(v) for v in values] == want
                assert [codec.encode(v) for v in values] == want
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_flat_dict_of_plain_values_is_written_as_the_standard_library_writes_it() -> None:
    # records of str keys and str/int/bool/None values: the plain encoder's common case
    strings = [chr(c) for c in range(0x80)] + ["\u2028\u2029", "é\U0001f600", "null", "1e5", "0.00001", ""]
    ints = [0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**64), 2**100]
    values: list[Any] = [None, True, False, *strings, *ints]
    records = [{s: v for s, v in zip(strings, values[i:] + values[:i])} for i in range(0, len(values), 7)]
    records += [{"user": "u", "seq": 1, "total": 2, "note": None}, {}, {"a": 1.5}, {"a": [1.0e16]}]
    for c in (serdes._json_codec, _std_only()):
        assert c is not None
        for r in records:
            assert c.encode(r) == _std_bytes(r), r


def test_what_orjson_writes_but_the_standard_library_refuses_is_refused() -> None:
    # orjson writes UUIDs and enum members natively; the json serde is the standard
    # library's, whether orjson is installed or not: refused, with its error
    import enum
    import uuid

    class Color(enum.Enum):
        RED = 1

    class Level(enum.IntEnum):
        HIGH = 3

    @dataclasses.dataclass
    class Point:
        x: int

    u = uuid.UUID(int=7)
    when = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
    # orjson (called without options) writes dataclasses and datetimes too
    refused = (
        u,
        Color.RED,
        {"id": u},
        [1, {"c": Color.RED}],
        {"a": 1.5, "b": (u,)},
        Point(1),
        {"p": [Point(2)]},
        when,
        {"at": when.date()},
        [datetime.time(1, 2)],
    )
    for value in refused:
        want = _error(_std_bytes, value)
        assert want is not None and want[0] is TypeError, value
        for encode in (serdes._json_codec.encode, _std_only().encode, serdes._py_json_encode):
            assert _error(encode, value) == want, (encode, value)

    class Name(str):
        pass

    class Row(dict):
        pass

    class Items(list):
        pass

    # what it writes, it writes the same: an IntEnum is an int, subclasses are their base
    subclassed = ({"n": Name("ann")}, Row(a=1, b=[Name("x")]), Items([1, Row(c=2.5)]), OrderedDict(z=1, a=2))
    for value in ({"level": Level.HIGH}, [Level.HIGH, ("t", None, 2.5e-7)], *subclassed):
        for encode in (serdes._json_codec.encode, _std_only().encode, serdes._py_json_encode):
            assert encode(value) == _std_bytes(value), value


ODD_FOR_ORJSON = [
    b"[" * 400 + b"]" * 400,  # deep, read by both
    b"[" * 1000 + b"]" * 1000,  # deeper than the standard library reads; orjson read it
    b'{"a":' * 1000 + b"1" + b"}" * 1000,
    b"[" + b"[1]," * 700 + b"[1]]",  # many brackets, shallow
    '"\ud800"',  # a str with a lone surrogate: orjson's path failed to encode it
    '["\udcff"]',
    memoryview(b'{"a":1}'),  # orjson reads a memoryview; json.loads refuses it
    memoryview(b"123456789012345678901234"),
    bytearray(b'{"a": 1}'),
]


@pytest.mark.parametrize("data", ODD_FOR_ORJSON, ids=range(len(ODD_FOR_ORJSON)))
def test_what_orjson_reads_but_the_standard_library_does_not_is_read_as_json_loads_does(
    codec: JsonCodec, data: Any
) -> None:
    # identical values and errors on both paths (the serde fuzz found these three)
    for decode in (codec.decode, serdes._py_json_decode):
        want = _error(json.loads, data)
        got = _error(decode, data)
        assert got == want, decode
        if want is None:  # (repr: _same would recurse twice per level)
            assert repr(decode(data)) == repr(json.loads(data))


def test_the_serde_names_undecodable_str_input_in_its_error() -> None:
    with pytest.raises(serdes.SerdeError, match="cannot decode '0\\\\x0c'"):
        serdes.serde("json").decode("0\x0c")  # type: ignore[arg-type]


# -- the plain encoder (_jsonenc.h): tailrace's own writer of the standard library's bytes --

# every character, lone surrogates included (the standard library's encode refuses those)
any_text = st.text(st.characters(exclude_categories=()), max_size=12)
plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64) | st.floats() | any_text,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(any_text | st.sampled_from(["user", "seq", "total"]), children, max_size=4)
    ),
    max_leaves=16,
)


def _same_outcome(encode: Any, value: Any) -> None:
    want, got = _error(_std_bytes, value), _error(encode, value)
    assert got == want, value
    if want is None:
        assert encode(value) == _std_bytes(value), value


@settings(max_examples=500, deadline=None)
@given(plain_values)
def test_the_plain_encoder_writes_the_standard_librarys_bytes_or_its_error(value: Any) -> None:
    for c in (serdes._json_codec, _std_only()):
        assert c is not None
        _same_outcome(c.encode, value)


def test_every_ascii_character_at_every_place_of_every_kind_of_str() -> None:
    # the ASCII path copies 8 bytes at a time until a word may hold one to escape; the
    # other kinds (1, 2 and 4 bytes a character) go a character at a time
    codec = _std_only()
    for kind_char in ("", "é", "\u20ac", "\U0001f600"):
        for n in range(0, 19):
            for c in [chr(i) for i in range(0x80)]:
                for at in {0, n // 2, n}:
                    s = "a" * at + c + "b" * (n - at) + kind_char
                    assert codec.encode(s) == _std_bytes(s), (s, kind_char)
                    assert codec.encode({s: s}) == _std_bytes({s: s}), s


def test_ints_floats_and_literals_at_their_edges() -> None:
    import sys

    codec = _std_only()
    ints = [0, 1, -1, 9, 10, 99, 100, 2**31, -(2**31), 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64]
    ints += [s * 10**k + d for k in range(20) for d in (-1, 0, 1) for s in (1, -1)]
    floats = [0.0, -0.0, 1.0, 1.5, 1e16, 1e-7, 1e22, 1e300, 5e-324, 2.2250738585072014e-308, 0.1, 1 / 3]
    floats += [float("nan"), float("inf"), float("-inf"), sys.float_info.max, -sys.float_info.min]
    for v in [*ints, *floats, True, False, None, [True, False, None], (1, 2.5), ()]:
        assert codec.encode(v) == _std_bytes(v), v
        assert codec.encode({"v": [v]}) == _std_bytes({"v": [v]}), v


def test_nesting_up_to_and_past_the_encoders_depth_and_cycles() -> None:
    codec = _std_only()
    for depth in (254, 255, 256, 257, 300, 900):
        nested: Any = 1
        for i in range(depth):
            nested = [nested] if i % 2 else {"k": nested}
        assert codec.encode(nested) == _std_bytes(nested), depth
    too_deep: Any = []
    for _ in range(100_000):
        too_deep = [too_deep]
    assert _error(codec.encode, too_deep) == _error(_std_bytes, too_deep)
    cyclic: dict[str, Any] = {"a": 1}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="Circular reference detected"):
        codec.encode(cyclic)


def _nested_value(depth: int, kind: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == 0 else {"k": value} if kind == 1 else (value,)
    return value


def _write_at(stack: int, encode: Any, value: Any) -> tuple[type[BaseException], str] | None:
    """``_error(encode, value)`` called ``stack`` Python frames further down."""
    return _write_at(stack - 1, encode, value) if stack else _error(encode, value)


@pytest.mark.parametrize("stack", [0, 1, 3, 40])
def test_values_nested_about_as_deep_as_the_standard_library_writes_are_written_or_refused_as_it_does(
    codec: JsonCodec, stack: int
) -> None:
    # json's C encoder stops at the recursion limit: on 3.11 it counts the Python frames
    # below it, and called by the codec it had the encoder's two (encode, iterencode)
    # fewer, so it wrote values two levels deeper than JSONEncoder.encode (issue 36)
    lo, hi = 1, 1 << 16
    while lo < hi:  # the least depth the standard library refuses from here
        mid = (lo + hi) // 2
        if _write_at(stack, STD.encode, _nested_value(mid, 0)) is None:
            lo = mid + 1
        else:
            hi = mid
    for depth in sorted({*range(990, 1006), *range(lo - 8, lo + 8)}):
        for kind in range(3):
            value = _nested_value(depth, kind)
            want = _write_at(stack, STD.encode, value)
            assert _write_at(stack, codec.encode, value) == want, (depth, lo, kind)
            assert _write_at(stack, codec.encode_std, value) == want, (depth, lo, kind)


def test_the_key_cache_never_writes_a_key_it_did_not_see() -> None:
    # interned keys are cached by address (with a reference held): many keys, keys that
    # come and go (a freed key's address may be reused by another str), equal keys that
    # are not the cached object, and a key that is a str subclass
    import gc
    import sys

    codec = _std_only()
    for round_ in range(6):
        keys = [sys.intern(f"k{round_}-{i}-" + "x" * (i % 50)) for i in range(700)]
        records = [{keys[j]: j, keys[(j * 7) % 700]: "v", keys[(j * 13) % 700]: None} for j in range(700)]
        for r in records:
            assert codec.encode(r) == _std_bytes(r)
        del keys, records
        gc.collect()
    probe = sys.intern("probe-key")
    before = sys.getrefcount(probe)
    counted = before < 2**30  # since 3.12 an interned str is immortal: its count stays put
    c2 = _std_only()
    assert c2.encode({probe: 1}) == b'{"probe-key":1}'
    assert sys.getrefcount(probe) == before + counted  # the cache holds it
    del c2
    gc.collect()
    assert sys.getrefcount(probe) == before  # and lets it go with the codec
    fresh = "".join(["probe", "-key"])  # equal, not the cached object
    assert fresh is not probe and codec.encode({fresh: 2, probe: 3}) == _std_bytes({fresh: 2, probe: 3})

    class Key(str):
        pass

    assert codec.encode({Key("probe-key"): 1}) == _std_bytes({Key("probe-key"): 1})


def test_a_huge_value_then_small_ones() -> None:
    codec = _std_only()
    big = {"s": "é" * 300_000 + "x" * 300_000, "l": list(range(50_000))}
    assert codec.encode(big) == _std_bytes(big)
    for v in ({"a": 1}, "b", [1.5]):
        assert codec.encode(v) == _std_bytes(v)


def test_a_file_output_writes_the_standard_librarys_lines_for_every_kind_of_value(tmp_path: Any) -> None:
    # FileSink encodes a plain value straight into the partition's buffer (no bytes object)
    # and anything else through the standard library: the file holds the same lines
    import enum

    from tailrace.files import FileProducer

    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    values: list[Any] = [
        {"user": "u1", "seq": 1, "total": 2},
        {"n": Level.HIGH, "s": Name("x")},
        {"big": 2**70, "f": 1e16, "nan": float("nan")},
        [1, (2, "é\u2028\U0001f600")],
        "x" * 5000,
        {"k\n": '\x00\x1f"\\'},
    ] * 40
    p = FileProducer(tmp_path, lambda stream: 1, buffer_bytes=256)
    for v in values:
        p.send("o", 0, None, v)
    with pytest.raises(ValueError, match=r"file output o\[0\]: message is not JSON-serialisable"):
        p.send("o", 0, None, {"bad": "\ud800"})
    p.close()
    data = (tmp_path / "o" / "partition-0.jsonl").read_bytes()
    assert data == b"".join(_std_bytes(v) + b"\n" for v in values)


# -- the plain reader (_jsondec.h): tailrace's own reader of json.loads' values ----------


def _texts_of(value: Any) -> list[bytes]:
    """``value`` as the JSON texts producers write: compact, with spaces, indented, ASCII-only."""
    out = []
    for kw in (
        {"ensure_ascii": False, "separators": (",", ":")},
        {"ensure_ascii": False},
        {"ensure_ascii": True},
        {"ensure_ascii": False, "indent": 2},
    ):
        out.append(json.dumps(value, **kw).encode("utf-8", "surrogatepass"))  # type: ignore[arg-type]
    return out


# bytes that damage a JSON text in the ways that matter to a reader
DAMAGE = b'"\\{}[],:-+.0159eE \t\n\r\x00\x1f\x7f\x80\xbf\xc2\xe0\xed\xf0\xf4\xff'


def _same_read(codec: JsonCodec, data: bytes) -> None:
    want, got = _error(json.loads, data), _error(codec.decode, data)
    assert got == want, data
    if want is None:  # repr: types (int or float, -0.0) and order of keys too
        assert repr(codec.decode(data)) == repr(json.loads(data)), data


@settings(max_examples=500, deadline=None)
@given(plain_values)
def test_the_plain_reader_reads_json_loads_values_from_every_way_of_writing_them(value: Any) -> None:
    codec = serdes._json_codec
    assert codec is not None
    for data in _texts_of(value):
        for text in (data, b" \t" + data + b"\r\n ", data + b" x"):
            _same_read(codec, text)


@settings(max_examples=500, deadline=None)
@given(plain_values, st.data())
def test_the_plain_reader_reads_or_refuses_damaged_texts_as_json_loads_does(
    value: Any, data: st.DataObject
) -> None:
    # bytes changed, cut, doubled or inserted anywhere: the same value or the same error
    codec = serdes._json_codec
    assert codec is not None
    text = bytearray(data.draw(st.sampled_from(_texts_of(value))))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        how = data.draw(st.sampled_from(["set", "cut", "insert"]))
        byte = data.draw(st.sampled_from(DAMAGE))
        if how == "set" and at < len(text):
            text[at] = byte
        elif how == "cut":
            del text[at:]
        else:
            text.insert(at, byte)
    _same_read(codec, bytes(text))


READER_EDGES = [
    b"0",
    b"-0",
    b"-0.0",
    b"0.0",
    b"1e5",
    b"1E+5",
    b"1e-5",
    b"-1.5e-3",
    b"01",
    b"1.",
    b".5",
    b"-",
    b"--1",
    b"1e",
    b"1e+",
    b"+1",
    b"123456789012345678",
    b"-123456789012345678",
    b"1234567890123456789",
    b"-9223372036854775808",
    b"9223372036854775807",
    b"9223372036854775808",
    b"9999999999999999999",
    b"-9999999999999999999",
    b"[18446744073709551616]",
    b"1.7976931348623157e308",
    b"1.8e308",
    b"1e400",
    b"-1e400",
    b"4.9e-324",
    b"2e-400",
    b"0." + b"1" * 80,
    b"1" + b"0" * 30 + b".5",
    b"[1,2,]",
    b"[,]",
    b"{,}",
    b'{"a"}',
    b'{"a":}',
    b'{"a" : 1, "b" :[ ] ,"c":{ }}',
    b'{"a":1,"a":2,"b":3,"a":4}',
    b"true",
    b"false",
    b"null",
    b"tru",
    b"nul",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"[NaN]",
    b'"a\\nb"',
    b'"\\u00e9"',
    b'"\\ud800"',
    b'"a\x00b"',
    b'"a\x1fb"',
    b'"a\x7fb"',
    b'"\xc2\x80"',
    b'"\xc0\x80"',
    b'"\xc1\xbf"',
    b'"\xe0\x80\x80"',
    b'"\xe0\x82\x80"',
    b'"\xe0\x9f\xbf"',
    b'"\xe0\xa0\x80"',
    b'"\xf0\x8f\xbf\xbf"',
    b'"\xed\xa0\x80"',
    b'"\xed\xa0\x80\xed\xb0\x80"',
    b'"\xef\xbf\xbf"',
    b'"\xf0\x90\x80\x80"',
    b'"\xf4\x8f\xbf\xbf"',
    b'"\xf4\x90\x80\x80"',
    b'"\xf5\x80\x80\x80"',
    b'"\xff"',
    b'"\xe9"',
    b'"\xc3"',
    b'"\xe2\x82"',
    b'{"\xc3\xa9":"\xc3\xa9"}',
    b'{"\xff":1}',
    b"\xef\xbb\xbf{}",
    b"{\x00}",
    b"\x00{}",
    b'\x00"\x00',
    b"[1]\x00",
    b"[1]\x0c",
    b"\x0b[1]",
    b"\xc2\xa0[1]",
    b"",
    b" ",
    b"[]  x",
    b"{}{}",
    b'["' + b"x" * 5000 + b'"]',
    b'"\\u12"',
    b'"\\u12G4"',
    b'"\\u00E9\\uD83D\\uDE00"',
    b'"\\U00e9"',
    b'"\\ud800\\u12"',
    b'"\\ud800\\u12G4"',
    b'"\\ud800\\udbff"',
    b'"\\udc00\\ud800"',
    b'"\\ud800\\n"',
    b'"\\ud800\\"',
    b'"\\ud800\\udc00',
    b'"\\ud800',
    b'"a\\"',
    b'"\\',
    b'"\\x"',
    b'"\\\x00"',
    b'"\\/\\b\\f"',
    b'{"\\ud83d\\ude00": "\\ud83d\\ude00", "\\n": 1}',
    b'"' + b"\\u00e9" * 500 + b"\\ud83d\\ude00" * 300 + "é€😀\\t".encode() * 200 + b'"',
    b'"\\u00e9\xff"',
    b'"\\u00e9\x1f"',
    b'"' + "é€😀".encode() * 1000 + b'"',
]


@pytest.mark.parametrize("data", READER_EDGES, ids=range(len(READER_EDGES)))
def test_the_plain_reader_at_the_edges_of_what_it_takes(data: bytes) -> None:
    codec = serdes._json_codec
    assert codec is not None
    _same_read(codec, data)
    _same_read(_std_only(), data)


def test_the_plain_reader_nests_to_its_depth_then_leaves_it_to_the_others() -> None:
    codec = _std_only()
    for depth in (1, 199, 200, 201, 900):
        for opened, closed in ((b"[", b"]"), (b'{"k":', b"}")):
            _same_read(codec, opened * depth + b"1" + closed * depth)


def _nested(depth: int, opened: bytes, closed: bytes) -> bytes:
    return opened * depth + b"1" + closed * depth


def _read_at(stack: int, decode: Any, data: Any) -> tuple[type[BaseException], str] | None:
    """``_error(decode, data)`` called ``stack`` Python frames further down."""
    return _read_at(stack - 1, decode, data) if stack else _error(decode, data)


def _first_refused(stack: int) -> int:
    """The least depth json.loads refuses (RecursionError) ``stack`` frames further down."""
    lo, hi = 1, 1 << 16
    while lo < hi:
        mid = (lo + hi) // 2
        if _read_at(stack, json.loads, _nested(mid, b"[", b"]")) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


@pytest.mark.parametrize("stack", [0, 1, 3, 40])
def test_texts_nested_about_as_deep_as_json_loads_reads_are_read_or_refused_as_it_does(
    codec: JsonCodec, stack: int
) -> None:
    # json.loads stops at the recursion limit: on 3.11 a RecursionError about 1000 levels
    # less the caller's frames deep. The codec called json's C scanner three frames higher
    # than json.loads does and read three levels more (994-996 from a shallow stack; issue
    # 36). From the same caller both agree: at 990-1005 levels and around where json.loads
    # stops under this test's own frames (pytest's run many).
    edge = _first_refused(stack)
    for depth in sorted({*range(990, 1006), *range(edge - 8, edge + 8)}):
        for opened, closed in ((b"[", b"]"), (b'{"k":', b"}")):
            text = _nested(depth, opened, closed)
            for data in (text, text.decode()):
                want = _read_at(stack, json.loads, data)
                assert _read_at(stack, codec.decode, data) == want, (depth, edge, opened, type(data))
                assert _read_at(stack, codec.decode_std, data) == want, (depth, edge, opened, type(data))


def test_the_key_cache_tells_keys_apart_that_share_a_set() -> None:
    # the cache hashes a key's length and first, middle and last bytes: these keys share
    # one set (two ways), so they push each other out, and must still read as themselves
    codec = _std_only()
    keys = ["aXcYe", "aZcWe", "aQcRe", "a\u00e9ce", "abcde"]
    for i in range(200):
        record = {keys[(i + j) % len(keys)]: j for j in range(3)}
        data = json.dumps(record, ensure_ascii=False).encode()
        assert repr(codec.decode(data)) == repr(json.loads(data))
    many = [{f"key-{i}-{j}": j for j in range(5)} for i in range(2000)]
    for r in many:
        assert codec.decode(json.dumps(r).encode()) == r


def test_threads_and_finalizers_reading_at_once_get_json_loads_values() -> None:
    # a new dict or list may start a garbage collection that runs finalizers (which read
    # too, here) and lets other threads in: the key cache is never left half-changed
    import gc

    codec = serdes._json_codec
    assert codec is not None
    records = [{f"k{i % 300}": [i, f"v{i}", {"n": None}], f"x{i % 7}": 1.5} for i in range(3000)]
    texts = [json.dumps(r).encode() for r in records]
    want = [json.loads(t) for t in texts]
    errors: list[BaseException] = []

    class Reads:
        def __del__(self) -> None:
            try:
                assert codec.decode(texts[5]) == want[5]
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

    def work() -> None:
        try:
            for _ in range(3):
                for t, w in zip(texts, want):
                    cyc: list[Any] = [Reads()]
                    cyc.append(cyc)
                    assert codec.decode(t) == w
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    old = gc.get_threshold()
    gc.set_threshold(50)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*old)
    assert errors == []


def test_texts_are_read_by_the_plain_reader_escapes_and_all() -> None:
    # the plain reader's object keys come from its cache: the same str object from one
    # text to the next (json.loads makes new ones each time), so a shared key shows that
    # the reader read the text, escaped values included; an escaped key is read, not kept
    codec = _std_only()
    a, b = codec.decode(b'{"key": 1}'), codec.decode(b'{"key": 2, "other": []}')
    assert next(iter(a)) is next(iter(b))
    e = codec.decode(b'{"key": "\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\\ud800x"}')
    assert e == {"key": '"\\/\b\f\n\r\t\u00e9\U0001f600\ud800x'} and next(iter(e)) is next(iter(a))
    c, d = codec.decode(b'{"k\\u0065y": 1}'), codec.decode(b'{"k\\u0065y": 1}')
    assert c == {"key": 1} and next(iter(c)) is not next(iter(d))
    # a text json.loads refuses raises json.loads' error
    with pytest.raises(json.JSONDecodeError, match="Invalid \\\\escape"):
        codec.decode(b'{"key": "\\x"}')


# -- floats: _shortest.h (Schubfach) writes float.__repr__ without dtoa's bignums -----------


def _double(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def _check_repr(d: float) -> None:
    from tailrace._core import _float_repr

    got = _float_repr(d)
    if got is not None:  # None: left to PyOS_double_to_string (subnormals)
        assert got == repr(d), (d.hex(), got)
    assert serdes._json_encode([d]) == _std_bytes([d])


def test_the_shortest_repr_of_random_bit_patterns() -> None:
    # every exponent and significand alike; a seeded sample large enough that a wrong
    # rounding rule (the closer of two candidates, ties, the lower neighbour of a power of
    # two) shows, yet quick
    rng = random.Random(20261128)
    for _ in range(200_000):
        d = _double(rng.getrandbits(64))
        if math.isfinite(d):
            _check_repr(d)


def test_the_shortest_repr_around_powers_of_two_and_the_format_edges() -> None:
    # a power of two's lower neighbour is half as far (irregular spacing); the layout
    # switches to an exponent below 1e-4 and from 1e16 on; integers below 2^53 are exact
    for e in range(-1074, 1024):
        p = math.ldexp(1.0, e)
        for d in (p, math.nextafter(p, 0.0), math.nextafter(p, math.inf)):
            if math.isfinite(d):
                _check_repr(d)
                _check_repr(-d)
    edges = [0.0, -0.0, 1e16, 9999999999999998.0, 1e16 + 2, 1e-4, 9.999999999999999e-05, 1e-5, 0.001]
    edges += [2.0**53, 2.0**53 - 1, 2.0**53 + 2, 9007199254740993.0, 123.45, 512569.13000000006, 1e23]
    edges += [5e-324, 1e-323, 8e-323, 2.2250738585072009e-308, 2.2250738585072014e-308, sys.float_info.max]
    for d in edges:
        _check_repr(d)
        _check_repr(-d)


@given(st.floats(allow_nan=False, allow_infinity=False))
@settings(max_examples=2000)
def test_the_shortest_repr_property(d: float) -> None:
    _check_repr(d)


def test_the_shortest_repr_of_sums_of_decimals() -> None:
    # what a job writes most: running sums of amounts with two decimals (17-digit reprs)
    rng = random.Random(7)
    total = 0.0
    for _ in range(100_000):
        total += round(rng.uniform(1, 1000), 2)
        _check_repr(total)
        _check_repr(round(rng.uniform(-1e6, 1e6), rng.randrange(0, 9)))
