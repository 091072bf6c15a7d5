"""Serdes: how keys and values become bytes and back, in one place for every backend
(state stores, files, Redis, Kafka).

========  ==================================================================  ===========
name      what it accepts                                                      key order
========  ==================================================================  ===========
json      any JSON value (compact, UTF-8, ``ensure_ascii=False``)             bytes
str       ``str`` (UTF-8)                                                       str order
bytes     ``bytes`` / ``bytearray`` / ``memoryview`` (as is)                   bytes order
int       ``int`` in [-2**63, 2**63) (8 bytes, big-endian, sign bit flipped)    int order
pickle    any picklable object (trusted data only)                              bytes
msgpack   msgpack values (needs ``pip install 'tailrace[fast]'`` or msgpack)   bytes
========  ==================================================================  ===========

"key order" is what a store's range scan (``items(start, end)``) follows when the
serde encodes its keys: scans run in the order of the encoded bytes, which is the
natural order for ``str``, ``bytes`` and ``int`` keys.

``json`` gives the standard library's bytes, values and errors, whatever is
installed. Compiled (tailrace._core.JsonCodec), it writes plain values (exact dicts
with str keys, lists, tuples, str, int within 64 bits, float, bool, None) and reads
texts (integers of up to 18 digits, no NaN or Infinity) itself, faster than orjson on
records; anything else
goes to orjson when it is installed (``tailrace[fast]``) where orjson reads the same
values, else to the standard library. Without the compiled core, orjson's bytes and
values are used where they are the standard library's (the same fallbacks).

A value a serde cannot encode raises :class:`SerdeError` naming the serde and the
value's type; callers add where it came from (store and key, topic and partition).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any, Final

from .errors import TailraceError

__all__ = ["NAMES", "Serde", "SerdeError", "serde"]


class SerdeError(TailraceError, ValueError):
    """A value a serde cannot encode, or bytes it cannot decode."""


class Serde:
    """A named pair of functions: ``encode(obj) -> bytes`` and ``decode(bytes) -> obj``.

    Both are pure and thread-safe. Errors are :class:`SerdeError`.
    """

    __slots__ = ("_decode", "_encode", "name")

    def __init__(self, name: str, encode: Callable[[Any], bytes], decode: Callable[[bytes], Any]) -> None:
        self.name = name
        self._encode = encode
        self._decode = decode

    def encode(self, obj: Any) -> bytes:
        try:
            return self._encode(obj)
        except SerdeError:
            raise
        except Exception as e:  # every encoder failure is the value's fault
            raise SerdeError(f"serde {self.name!r} cannot encode a {type(obj).__name__}: {e}") from e

    def decode(self, data: bytes) -> Any:
        try:
            return self._decode(data)
        except SerdeError:
            raise
        except Exception as e:  # every decoder failure is the data's fault
            head = data[:40] if isinstance(data, str | bytes) else bytes(data)[:40]
            raise SerdeError(f"serde {self.name!r} cannot decode {head!r}: {e}") from e

    def __repr__(self) -> str:
        return f"Serde({self.name!r})"


# -- json -----------------------------------------------------------------------------
_std_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode
_std_loads = json.loads
# The two checks below are bytes.translate + substring search rather than regular
# expressions: the same answers at about a third of the cost (sre has no literal prefix
# to skip on for a leading character class, and they run once per message).
# A run of 19+ digits: every digit becomes "0", everything else " ".
_DIGITS_ONLY = bytes(ord("0") if 48 <= c <= 57 else ord(" ") for c in range(256))
_LONG_RUN = b"0" * 19
# orjson output the standard library would write differently: an exponent ('1e16' for
# '1e+16'), a small float in plain notation ('0.00001' for '1e-05'), or null (NaN and
# inf become null in orjson). Matches inside strings only cost a fallback. A digit
# followed by e or E: digits become "0", e and E become "e", the rest stays.
_DIGIT_E = bytes(ord("0") if 48 <= c <= 57 else ord("e") if c in (69, 101) else c for c in range(256))


def _long_digits(data: bytes) -> bool:
    """True when ``data`` holds a run of 19 or more ASCII digits (a big integer, maybe)."""
    return _LONG_RUN in data.translate(_DIGITS_ONLY)


# A JSON text nested deeper than about 990 levels is refused by the standard library
# (RecursionError: its limit is the interpreter's recursion limit) and read by orjson
# (up to 1024); nesting needs an opening and a closing byte per level, so a text that
# could nest that deep is at least DEEP_BYTES long and opens at least DEEP_OPENS
# brackets; those texts (rare) go to the standard library, so both paths agree.
DEEP_BYTES, DEEP_OPENS = 1000, 500


def _deep(data: bytes) -> bool:
    """True when ``data`` may nest deeper than the standard library reads (see DEEP_OPENS)."""
    return len(data) >= DEEP_BYTES and data.count(b"[") + data.count(b"{") >= DEEP_OPENS


def _std_decides(data: bytes) -> bool:
    """True when orjson's output ``data`` may differ from the standard library's bytes."""
    return b"null" in data or b"0.0000" in data or b"0e" in data.translate(_DIGIT_E)


_NOT_PLAIN, _PLAIN, _WITH_FLOATS = 0, 1, 2


def _plain(obj: Any) -> int:
    """What a value orjson encoded is made of (the compiled codec's _plain_walk): _NOT_PLAIN
    when anything but exact dicts (str keys), lists, tuples, str, int, float, bool and None
    is in it, _WITH_FLOATS when a float is, else _PLAIN. orjson has refused cycles and
    deep nesting already."""
    t = type(obj)
    if obj is None or t is str or t is int or t is bool:
        return _PLAIN
    if t is float:
        return _WITH_FLOATS
    found = _PLAIN
    if t is dict:
        for k, v in obj.items():
            if type(k) is not str:
                return _NOT_PLAIN
            sub = _plain(v)
            if sub == _NOT_PLAIN:
                return _NOT_PLAIN
            found = max(found, sub)
        return found
    if t is list or t is tuple:
        for v in obj:
            sub = _plain(v)
            if sub == _NOT_PLAIN:
                return _NOT_PLAIN
            found = max(found, sub)
        return found
    return _NOT_PLAIN


_py_long_digits, _py_std_decides = _long_digits, _std_decides
try:  # the same scans compiled (one pass, no allocation): tailrace._core
    from ._core import json_long_digits as _long_digits
    from ._core import json_std_decides as _std_decides
except ImportError:  # pragma: no cover - the compiled core is missing
    pass


def _json_encode_std(obj: Any) -> bytes:
    return _std_encode(obj).encode()


def _json_decode_std(data: bytes | str) -> Any:
    return _std_loads(data)


try:  # the optional fast path: same bytes out, same values in
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None  # type: ignore[assignment]

if _orjson is not None:
    _or_dumps = _orjson.dumps
    _or_loads = _orjson.loads
    _OR_ERROR = _orjson.JSONEncodeError
    _OR_DECODE_ERROR = _orjson.JSONDecodeError
    # orjson is called without options: its bytes are kept only for a value _plain finds
    # made of exact dicts, lists, tuples, str, int, float, bool and None, where no option
    # changes them (the passthrough options would only make it refuse dataclasses,
    # datetimes and subclasses sooner, which _plain sends to the standard library
    # anyway), and an option costs every call its parsing (~70 instructions).

    def _json_encode(obj: Any) -> bytes:
        # orjson refuses big ints and non-str keys; for those, for values holding anything
        # else it writes where the standard library refuses (a UUID, an enum member, a
        # dataclass, a datetime, a subclass), and for floats in output _std_decides flags,
        # the standard library decides.
        try:
            out: bytes = _or_dumps(obj)
        except _OR_ERROR:
            return _json_encode_std(obj)
        kind = _plain(obj)
        if kind == _NOT_PLAIN or (kind == _WITH_FLOATS and _std_decides(out)):
            return _json_encode_std(obj)
        return out

    def _json_decode(data: bytes | str) -> Any:
        # only bytes and str take orjson's path (it also reads a memoryview, which the
        # standard library refuses); a str that is not UTF-8 (a lone surrogate) is the
        # standard library's to read. orjson reads integers past 64 bits as floats: a
        # run of 19+ digits goes to the standard library (a cheap C-level search; such
        # runs are rare in real records), as does a text that may nest deeper than the
        # standard library can (its limit is the interpreter's recursion limit)
        if type(data) is bytes:
            raw = data
        elif type(data) is str:
            try:
                raw = data.encode()
            except UnicodeEncodeError:
                return _std_loads(data)
        else:
            return _std_loads(data)
        if _long_digits(raw) or _deep(raw):
            return _std_loads(data)
        try:
            return _or_loads(data)
        except _OR_DECODE_ERROR:
            return _std_loads(data)  # NaN/Infinity tokens, or the standard library's error

else:
    _json_encode = _json_encode_std
    _json_decode = _json_decode_std


def _compiled_codec() -> Any:
    """The same codec compiled (tailrace._core.JsonCodec), or None where the core is missing.

    Its standard-library fast paths call json's C scanner and C encoder directly (what
    ``json.loads`` and ``JSONEncoder.encode`` call); each is checked here once against
    the library's own answer and left out if it is missing or differs.
    """
    try:
        from ._core import JsonCodec
    except ImportError:  # pragma: no cover - the compiled core is missing
        return None
    import json.decoder
    import json.encoder
    import json.scanner

    enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    markers: dict[int, Any] | None = {}
    c_encoder: Any = None
    # json's C parts are not typed (private names): looked up, and checked below
    make_encoder = getattr(json.encoder, "c_make_encoder", None)
    scan_once: Any = None
    if getattr(json.scanner, "c_make_scanner", None) is not None:
        scan_once = getattr(json.decoder.JSONDecoder(), "scan_once", None)
    probe: Any = {"a": [1, 2.5, -0.0, 1e16, 1e-7, float("nan"), None, True, 'é\u2028"', {"b": []}]}
    text = enc.encode(probe)
    try:  # the arguments JSONEncoder.iterencode passes (3.11-3.13)
        if make_encoder is not None:
            c_encoder = make_encoder(
                markers,
                enc.default,
                json.encoder.encode_basestring,
                None,
                enc.key_separator,
                enc.item_separator,
                enc.sort_keys,
                enc.skipkeys,
                enc.allow_nan,
            )
        if c_encoder is None or "".join(c_encoder(probe, 0)) != text or markers:
            c_encoder = None
    except Exception:  # noqa: BLE001 - another Python's C encoder: the library's own path then
        c_encoder = None
    if c_encoder is None:
        markers = None
    try:
        if scan_once is not None and repr(scan_once(text, 0)) != repr((json.loads(text), len(text))):
            scan_once = None
    except Exception:  # noqa: BLE001 - another Python's C scanner: the library's own path then
        scan_once = None
    kw: dict[str, Any] = {}
    if _orjson is not None:
        kw = dict(or_loads=_or_loads, or_decode_error=_OR_DECODE_ERROR)
    return JsonCodec(enc.encode, json.loads, scan_once, c_encoder, markers, **kw)


_py_json_encode, _py_json_decode = _json_encode, _json_decode
_json_codec = _compiled_codec()
if _json_codec is not None:
    _json_encode = _json_codec.encode
    _json_decode = _json_codec.decode


# -- the others -------------------------------------------------------------------------
def _str_encode(obj: Any) -> bytes:
    if type(obj) is not str and not isinstance(obj, str):
        raise SerdeError(f"serde 'str' takes str, not {type(obj).__name__}")
    return obj.encode()


def _bytes_encode(obj: Any) -> bytes:
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, bytearray | memoryview):
        return bytes(obj)
    raise SerdeError(f"serde 'bytes' takes bytes, bytearray or memoryview, not {type(obj).__name__}")


_INT = struct.Struct(">Q")
_SIGN: Final = 1 << 63


def _int_encode(obj: Any) -> bytes:
    if type(obj) is bool or not isinstance(obj, int):
        raise SerdeError(f"serde 'int' takes int, not {type(obj).__name__}")
    if not -_SIGN <= obj < _SIGN:
        raise SerdeError(f"serde 'int' takes ints in [-2**63, 2**63), not {obj}")
    return _INT.pack(obj + _SIGN)


def _int_decode(data: bytes) -> int:
    if len(data) != 8:
        raise SerdeError(f"serde 'int' needs 8 bytes, got {len(data)}")
    value: int = _INT.unpack(data)[0] - _SIGN
    return value


def _pickle_serde() -> Serde:
    import pickle

    def encode(obj: Any) -> bytes:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)

    return Serde("pickle", encode, pickle.loads)


def _msgpack_serde() -> Serde | None:
    try:
        import msgpack as mp
    except ImportError:
        return None
    return Serde(
        "msgpack",
        lambda obj: mp.packb(obj, use_bin_type=True),
        lambda data: mp.unpackb(data, raw=False, strict_map_key=False),
    )


_SERDES: dict[str, Serde] = {
    "json": Serde("json", _json_encode, _json_decode),
    "str": Serde("str", _str_encode, lambda data: bytes(data).decode()),
    "bytes": Serde("bytes", _bytes_encode, bytes),
    "int": Serde("int", _int_encode, _int_decode),
}
# made on first use: their imports would cost every run a few ms (pickle, msgpack's 1.6 MB
# extension) that most jobs never use
_LAZY: Final[dict[str, Callable[[], Serde | None]]] = {"pickle": _pickle_serde, "msgpack": _msgpack_serde}

NAMES: Final = ("json", "str", "bytes", "int", "pickle", "msgpack")
"""Every serde name tailrace knows (``msgpack`` only where msgpack is installed)."""


def serde(name: str) -> Serde:
    """The serde called ``name``; SerdeError naming the known ones when there is none."""
    try:
        return _SERDES[name]
    except KeyError:
        make = _LAZY.get(name)
        made = make() if make is not None else None
        if made is not None:
            return _SERDES.setdefault(name, made)  # setdefault: two threads get one serde
        if name == "msgpack":
            raise SerdeError("serde 'msgpack' needs msgpack: pip install 'tailrace[fast]'") from None
        raise SerdeError(f"unknown serde {name!r} (known: {', '.join(NAMES)})") from None
