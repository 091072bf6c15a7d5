"""What the JSON fuzz targets check (tests/fuzz/README.md): the compiled codec
(tailrace._core.JsonCodec, as tailrace.serdes builds it and without orjson) against the
standard library, for one input. The targets (fuzz_decode.py, fuzz_encode.py) and the
corpus replay (test_corpus.py) call the same two checks; a check that fails raises
AssertionError naming what differs.

- ``check_decode(data)``: ``JsonCodec.decode`` of the bytes (and of their text, where they
  are UTF-8) reads what ``json.loads`` reads, the same types (int, float, bool, ...), dict
  keys in the same order, or raises what it raises (type and message); the json serde
  raises SerdeError exactly where json.loads raises.
- ``check_encode(value)``: ``JsonCodec.encode`` writes ``JSONEncoder(ensure_ascii=False,
  separators=(",", ":"), allow_nan=True).encode(value)`` as UTF-8 (the serde's documented
  settings; json.dumps with them writes the same) or raises what it raises, and what it
  writes reads back as the value (tuples as lists, keys as JSON writes them).
- ``value_from(fdp)``: the value an ``atheris.FuzzedDataProvider`` describes.

``load_core()`` puts the coverage-instrumented core of scripts/fuzz.sh in place of the
installed one when TAILRACE_FUZZ_CORE names it; it must run before tailrace is imported.
"""

from __future__ import annotations

import ctypes
import enum
import importlib
import importlib.abc
import importlib.util
import json
import json.decoder
import json.encoder
import math
import os
import struct
import sys
from collections import OrderedDict
from typing import Any

STD = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True)

_shim: Any = None


def load_core() -> str:
    """Import tailrace._core from TAILRACE_FUZZ_CORE (built with gcc's trace-pc coverage),
    with its coverage library TAILRACE_FUZZ_SANCOV loaded globally first; what was done."""
    global _shim
    core, shim = os.environ.get("TAILRACE_FUZZ_CORE"), os.environ.get("TAILRACE_FUZZ_SANCOV")
    if not core:
        return "installed tailrace._core (its C code not instrumented: Python coverage only)"
    if "tailrace" in sys.modules:
        raise RuntimeError("load_core() must run before tailrace is imported")
    if not shim:
        raise RuntimeError("TAILRACE_FUZZ_CORE needs TAILRACE_FUZZ_SANCOV (scripts/fuzz.sh sets both)")
    _shim = ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)

    class _Finder(importlib.abc.MetaPathFinder):
        """tailrace._core from ``core``, where and when the package imports it."""

        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            return importlib.util.spec_from_file_location(name, core) if name == "tailrace._core" else None

    sys.meta_path.insert(0, _Finder())
    import tailrace._core

    assert os.path.samefile(tailrace._core.__file__ or "", core)
    return f"instrumented tailrace._core {core}"


def start_coverage() -> str:
    """Hand the instrumented core's counters to atheris' libFuzzer (after atheris.Setup)."""
    if _shim is None:
        return ""
    # atheris.Fuzz would load it (the same module object: imported once)
    lib = importlib.import_module("atheris.core_with_libfuzzer")
    fuzzer = ctypes.CDLL(lib.__file__)
    names = ["8bit_counters_init", "pcs_init"]
    names += [f"trace_{c}cmp{n}" for c in ("", "const_") for n in (1, 2, 4, 8)] + ["trace_switch"]
    fns = (ctypes.c_void_p * len(names))(
        *(ctypes.cast(getattr(fuzzer, "__sanitizer_cov_" + n), ctypes.c_void_p).value for n in names)
    )
    n = _shim.tr_sancov_init(fns)
    return f"C coverage: {n} edge counters of the instrumented core"


# imported after load_core() by the callers
def codecs() -> list[Any]:
    """The codecs checked: serdes' (orjson's path where installed) and one without orjson."""
    from tailrace import serdes
    from tailrace._core import JsonCodec

    markers: dict[int, Any] = {}
    c_encoder = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        markers, STD.default, json.encoder.encode_basestring, None, ":", ",", False, False, True
    )
    std_only = JsonCodec(STD.encode, json.loads, json.decoder.JSONDecoder().scan_once, c_encoder, markers)
    assert serdes._json_codec is not None, "the compiled core is missing"
    return [serdes._json_codec, std_only]


_CODECS: list[Any] = []


def _codecs() -> list[Any]:
    if not _CODECS:
        _CODECS.extend(codecs())
    return _CODECS


def _serde() -> Any:
    from tailrace import serdes

    return serdes.serde("json"), serdes.SerdeError


def same(a: Any, b: Any) -> str | None:
    """None when ``a`` and ``b`` are the same JSON value: types (bool, int, float apart),
    floats bit for bit but NaN, dict keys in order; else where they differ. No recursion
    (values nest as deep as the interpreter reads)."""
    try:  # repr tells ints, floats and bools apart, -0.0, key order; in C, fast
        if repr(a) == repr(b):
            return None
    except RecursionError:
        pass
    stack: list[tuple[Any, Any, str]] = [(a, b, "$")]
    while stack:
        x, y, at = stack.pop()
        if type(x) is not type(y):
            return f"{at}: {type(x).__name__} {_short(x)} != {type(y).__name__} {_short(y)}"
        if type(x) is float:
            if not (math.isnan(x) and math.isnan(y)) and struct.pack("<d", x) != struct.pack("<d", y):
                return f"{at}: {x!r} != {y!r}"
        elif type(x) is list:
            if len(x) != len(y):
                return f"{at}: {len(x)} items != {len(y)}"
            stack.extend((p, q, f"{at}[{i}]") for i, (p, q) in enumerate(zip(x, y)))
        elif type(x) is dict:
            if list(x) != list(y):
                return f"{at}: keys {_short(list(x))} != {_short(list(y))}"
            stack.extend((x[k], y[k], f"{at}[{k!r}]") for k in x)
        elif x != y:
            return f"{at}: {_short(x)} != {_short(y)}"
    return None


def _short(v: Any) -> str:
    try:
        text = repr(v)
    except RecursionError:
        text = f"<{type(v).__name__}, too deep to show>"
    return text if len(text) <= 200 else text[:200] + "..."


def _outcome(fn: Any, arg: Any) -> tuple[bool, Any]:
    """(True, result) or (False, (exception type, message))."""
    try:
        return True, fn(arg)
    except Exception as e:  # noqa: BLE001 - compared by the caller
        return False, (type(e), str(e))


# what json.loads documents it raises on bad input: JSONDecodeError, UnicodeDecodeError
# (both ValueError), and RecursionError for texts nested past the recursion limit
_LOADS_ERRORS = (ValueError, RecursionError)


def check_decode(data: bytes) -> None:
    inputs: list[Any] = [data]
    try:
        inputs.append(data.decode("utf-8", "surrogatepass"))
    except UnicodeDecodeError:
        pass
    for text in inputs:
        ok, want = _outcome(json.loads, text)
        if not ok:
            assert issubclass(want[0], _LOADS_ERRORS), f"json.loads raised {want} on {_short(text)}"
        for codec in _codecs():
            for decode in (codec.decode, codec.decode_std):
                got_ok, got = _outcome(decode, text)
                assert got_ok == ok, f"{_name(decode)}: {_show(got_ok, got)}, json.loads: {_show(ok, want)}"
                if ok:
                    diff = same(got, want)
                    assert diff is None, f"{_name(decode)} read {_short(text)} differently: {diff}"
                else:
                    assert got == want, f"{_name(decode)} raised {got}, json.loads {want}"
        # the serde's decode is one Python frame (Serde.decode) above the codec's: so is
        # json.loads here, for texts nested as deep as the recursion limit
        ok, want = _outcome(lambda t: json.loads(t), text)
        serde, serde_error = _serde()
        got_ok, got = _outcome(serde.decode, text)
        assert got_ok == ok, f"serde('json').decode: {_show(got_ok, got)}, json.loads: {_show(ok, want)}"
        if not ok:
            assert got[0] is serde_error, f"serde('json').decode raised {got}, not SerdeError"


_KEY_WORDS = {True: "true", False: "false", None: "null"}


def _json_key(k: Any) -> str:
    if isinstance(k, str):
        return str.__str__(k)
    if k is True or k is False or k is None:
        return _KEY_WORDS[k]
    if isinstance(k, float):
        return (
            "NaN" if k != k else "Infinity" if k == math.inf else "-Infinity" if k == -math.inf else repr(k)
        )
    return int.__repr__(k)


def written(value: Any) -> Any:
    """``value`` as reading its JSON back gives it: tuples as lists, subclasses as their
    base, keys as JSON writes them (a key written twice keeps its first place and its last
    value, as json.loads reads it). No recursion."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        v, parent, slot = stack.pop()
        out: Any
        if isinstance(v, dict):
            pairs = {_json_key(k): x for k, x in v.items()}
            out = dict.fromkeys(pairs)
            stack.extend((x, out, k) for k, x in pairs.items())
        elif isinstance(v, list | tuple):
            out = [None] * len(v)
            stack.extend((x, out, i) for i, x in enumerate(v))
        elif isinstance(v, bool) or v is None:
            out = v
        elif isinstance(v, int):
            out = int(v)
        elif isinstance(v, float):
            out = float(v)
        elif isinstance(v, str):
            out = str.__str__(v)
        else:
            raise TypeError(type(v))
        parent[slot] = out
    return root[0]


def check_encode(value: Any) -> bytes | None:
    """Check ``value``'s encoding (module docstring); the bytes written, or None (refused)."""
    ok, want = _outcome(STD.encode, value)
    if ok:
        ok, want = _outcome(str.encode, want)  # a lone surrogate: UnicodeEncodeError
    for codec in _codecs():
        for encode in (codec.encode, codec.encode_std):
            got_ok, got = _outcome(encode, value)
            assert got_ok == ok, (
                f"{_name(encode)}: {_show(got_ok, got)}, the standard library: {_show(ok, want)}"
            )
            assert got == want, f"{_name(encode)} wrote {_short(got)}, the standard library {_short(want)}"
    # the serde's encode is one Python frame (Serde.encode) above the codec's: so is the
    # standard library's here, for values nested as deep as the recursion limit
    serde_ok, serde_want = _outcome(lambda v: STD.encode(v).encode(), value)
    serde, serde_error = _serde()
    got_ok, got = _outcome(serde.encode, value)
    assert got_ok == serde_ok, (
        f"serde('json').encode: {_show(got_ok, got)}, the standard library: {_show(serde_ok, serde_want)}"
    )
    if not got_ok:
        assert got[0] is serde_error, f"serde('json').encode raised {got}, not SerdeError"
    if not ok:
        return None
    back = written(value)
    for codec in _codecs():
        diff = same(codec.decode(want), back)
        assert diff is None, f"{_short(want)} reads back differently: {diff}"
    return bytes(want)


def _name(fn: Any) -> str:
    return f"JsonCodec.{getattr(fn, '__name__', fn)}"


def _show(ok: bool, result: Any) -> str:
    return f"returned {_short(result)}" if ok else f"raised {result[0].__name__}: {_short(result[1])}"


# -- values from the fuzzer's bytes ---------------------------------------------------------


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2**70


class Name(str):
    pass


class Row(dict):  # type: ignore[type-arg]
    pass


SPECIAL_FLOATS = [
    math.nan,
    -math.nan,
    math.inf,
    -math.inf,
    0.0,
    -0.0,
    5e-324,
    -5e-324,
    2.2250738585072009e-308,  # the largest subnormal
    2.2250738585072014e-308,
    1.7976931348623157e308,
    1e16,
    1e-7,
    1e-5,
    9007199254740993.0,
    0.1,
    1e22,
    1e23,
    123456789012345680.0,
]
EDGE_INTS = [0, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**18, 10**19, -(10**18)]
# characters that matter to a JSON writer: quotes, escapes, controls, the widths of UTF-8,
# line separators JSON need not escape, lone and paired surrogates
SPECIAL_CHARS = ['"', "\\", "/", "\x00", "\x08", "\t", "\n", "\x1f", "\x7f", "\x80", "é", "\u2028"]
SPECIAL_CHARS += ["\u2029", "\ud7ff", "\ud800", "\udbff", "\udc00", "\udfff", "\ue000", "\uffff", "😀"]
SPECIAL_CHARS += ["\U0010ffff", "a", "0", " ", "\ufeff"]

MAX_DEPTH = 6
MAX_ITEMS = 6


def _text(fdp: Any) -> str:
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return str(fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 12)))  # lone surrogates included
    if kind == 1:
        return str(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12)))
    if kind == 2:
        return "".join(fdp.PickValueInList(SPECIAL_CHARS) for _ in range(fdp.ConsumeIntInRange(0, 8)))
    return "x" * fdp.ConsumeIntInRange(0, 300)  # long: the encoder's word-at-a-time path


def _float(fdp: Any) -> float:
    kind = fdp.ConsumeIntInRange(0, 2)
    if kind == 0:
        return float(fdp.PickValueInList(SPECIAL_FLOATS))
    if kind == 1:  # any bit pattern: NaN payloads, subnormals, -0.0
        raw = fdp.ConsumeBytes(8).ljust(8, b"\0")
        return float(struct.unpack("<d", raw)[0])
    return float(fdp.ConsumeRegularFloat())


def _int(fdp: Any) -> int:
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return int(fdp.ConsumeIntInRange(-1000, 1000))
    if kind == 1:
        return int(fdp.PickValueInList(EDGE_INTS)) + fdp.ConsumeIntInRange(-2, 2)
    if kind == 2:
        return int(fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 40)))  # up to 320 bits
    return int(fdp.ConsumeInt(fdp.ConsumeIntInRange(1700, 1900)))  # about int's 4300-digit limit


def _key(fdp: Any) -> Any:
    kind = fdp.ConsumeIntInRange(0, 7)
    if kind < 5:
        return _text(fdp)
    if kind == 5:
        return _int(fdp)
    if kind == 6:
        return _float(fdp)
    return fdp.PickValueInList([True, False, None, Name("k"), Level.LOW])


def value_from(fdp: Any, depth: int = 0) -> Any:
    """A value made of what JSON writes (and a few things it writes as something else: tuples,
    non-str keys, subclasses), as the fuzzer's bytes choose."""
    last = 13 if depth < MAX_DEPTH else 7
    kind = fdp.ConsumeIntInRange(0, last)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return _int(fdp)
    if kind == 3:
        return _float(fdp)
    if kind in (4, 5):
        return _text(fdp)
    if kind == 6:
        return fdp.PickValueInList([Level.LOW, Level.HIGH, Name("n\u00e9"), Name("\ud800")])
    if kind == 7:  # near the top, now and then: a chain about as deep as the standard library writes
        value: Any = None
        deep = depth <= 1 and fdp.ConsumeProbability() < 0.05
        for _ in range(fdp.ConsumeIntInRange(0, 1100) if deep else 0):
            value = [value]
        return value
    n = fdp.ConsumeIntInRange(0, MAX_ITEMS)
    if kind in (8, 9):
        return [value_from(fdp, depth + 1) for _ in range(n)]
    if kind == 10:
        return tuple(value_from(fdp, depth + 1) for _ in range(n))
    if kind == 11:
        return {_text(fdp): value_from(fdp, depth + 1) for _ in range(n)}
    if kind == 12:
        return {_key(fdp): value_from(fdp, depth + 1) for _ in range(n)}
    made = {_text(fdp): value_from(fdp, depth + 1) for _ in range(n)}
    return Row(made) if fdp.ConsumeBool() else OrderedDict(made)
