"""tailrace.serdes: one set of serdes for stores, files, Redis and Kafka."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailrace import serdes
from tailrace.serdes import NAMES, SerdeError, serde

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


def _std(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=500)
@given(json_values)
def test_json_gives_the_standard_librarys_bytes_whatever_is_installed(value: Any) -> None:
    out = serde("json").encode(value)
    assert out == _std(value)  # the fast path (orjson, when installed) changes nothing
    assert _same(serde("json").decode(out), json.loads(out))
    assert _same(serde("json").decode(out.decode()), json.loads(out))


def test_json_fast_path_is_in_use_when_orjson_is_installed() -> None:
    pytest.importorskip("orjson")
    assert serdes._json_encode is not serdes._json_encode_std


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("json", {"a": [1, 2.5, None, "é"]}),
        ("str", "héllo"),
        ("bytes", b"\x00\xff"),
        ("int", -(2**63)),
        ("int", 2**63 - 1),
        ("pickle", {"set": {1, 2}, "tuple": (1, "a")}),
        ("msgpack", {"a": [1, b"x", "y"]}),
    ],
)
def test_round_trip(name: str, value: Any) -> None:
    if name == "msgpack":
        pytest.importorskip("msgpack")
    s = serde(name)
    assert s.decode(s.encode(value)) == value


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=2, max_size=20))
def test_int_keys_sort_as_ints(values: list[int]) -> None:
    enc = serde("int").encode
    assert sorted(values, key=enc) == sorted(values)


@given(st.lists(st.text(), min_size=2, max_size=20))
def test_str_keys_sort_as_strs(values: list[str]) -> None:
    assert sorted(values, key=serde("str").encode) == sorted(values)


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("str", 3, "takes str, not int"),
        ("bytes", "x", "takes bytes"),
        ("int", 2**63, "[-2**63, 2**63)"),
        ("int", True, "takes int, not bool"),
        ("json", object(), "cannot encode a object"),
    ],
)
def test_a_value_the_serde_cannot_encode_is_a_clear_error(name: str, value: Any, words: str) -> None:
    with pytest.raises(SerdeError, match=re.escape(words)):
        serde(name).encode(value)


def test_bad_bytes_and_unknown_names_are_clear_errors() -> None:
    with pytest.raises(SerdeError, match="serde 'json' cannot decode"):
        serde("json").decode(b"{bad")
    with pytest.raises(SerdeError, match="serde 'int' needs 8 bytes"):
        serde("int").decode(b"\x00")
    with pytest.raises(
        SerdeError, match=r"unknown serde 'yaml' \(known: json, str, bytes, int, pickle, msgpack\)"
    ):
        serde("yaml")


def test_pickle_and_msgpack_are_made_on_first_use_and_then_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # their imports are not paid at start-up: the serde is made when first asked for
    monkeypatch.setattr(serdes, "_SERDES", {k: v for k, v in serdes._SERDES.items() if k not in NAMES[4:]})
    monkeypatch.setitem(sys.modules, "msgpack", None)  # as if not installed: import fails
    with pytest.raises(SerdeError, match=r"serde 'msgpack' needs msgpack: pip install 'tailrace\[fast\]'"):
        serde("msgpack")
    first = serde("pickle")
    assert serde("pickle") is first and first.decode(first.encode({1, 2})) == {1, 2}
    monkeypatch.delitem(sys.modules, "msgpack")
    pytest.importorskip("msgpack")
    mp = serde("msgpack")
    assert serde("msgpack") is mp and mp.decode(mp.encode({"a": [1, b"x"]})) == {"a": [1, b"x"]}
