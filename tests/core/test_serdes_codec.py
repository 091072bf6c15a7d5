"""tailrace._core.JsonCodec, the compiled ``json`` serde: every fast path (orjson, json's C
scanner and C encoder called below json's Python layer) gives the standard library's bytes,
values and errors, with and without orjson."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
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


def test_a_flat_dict_of_plain_values_skips_the_guard_and_still_matches() -> None:
    # a dict of str keys and str/int/bool/None values holds no float, so the codec takes
    # orjson's bytes without scanning them: they must be the standard library's all the same
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
