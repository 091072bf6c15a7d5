"""The orjson fast path's two byte checks give the same answers as the regular expressions they
stand for, on random and crafted bytes: the compiled scans (tailrace._core, used by serdes) and
serdes' pure-Python versions."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest

from tailrace import _core, serdes

LONG = re.compile(rb"[0-9]{19}")
STD = re.compile(rb"[0-9][eE]|0\.0000|null")
ALPHABET = b'0123456789eE.-+nul "{}:,xod/\x00\x01\xc3\xa9'


def _cases() -> list[bytes]:
    rng = random.Random(18)
    out = [
        b"",
        b"1" * 18,
        b"1" * 19,
        b"x" + b"9" * 19 + b"x",
        b"1e5",
        b"1E5",
        b"e1",
        b"0.00001",
        b"0.0001",
        b"null",
        b"nul",
        b'{"a":null}',
        "١٢٣".encode() * 10,
    ]
    for _ in range(20000):
        n = rng.randrange(0, 60)
        out.append(bytes(rng.choice(ALPHABET) for _ in range(n)))
        out.append(
            b"".join(rng.choice([b"1" * rng.randrange(15, 22), b"x", b"e", b"0.0000"]) for _ in range(4))
        )
    return out


@pytest.mark.parametrize("impl", [_core.json_long_digits, serdes._py_long_digits])
def test_long_digits_matches_the_regex(impl: Callable[[bytes], bool]) -> None:
    for data in _cases():
        assert impl(data) == (LONG.search(data) is not None), data


@pytest.mark.parametrize("impl", [_core.json_std_decides, serdes._py_std_decides])
def test_std_decides_matches_the_regex(impl: Callable[[bytes], bool]) -> None:
    for data in _cases():
        assert impl(data) == (STD.search(data) is not None), data


def test_serdes_uses_the_compiled_scans() -> None:
    assert serdes._long_digits is _core.json_long_digits
    assert serdes._std_decides is _core.json_std_decides


@pytest.mark.parametrize("impl", [_core.json_std_decides, serdes._py_std_decides])
def test_std_decides_finds_a_match_at_every_place_in_an_8_byte_word(impl: Callable[[bytes], bool]) -> None:
    # the compiled scan skips 8-byte words without a trigger byte: a match may start, end
    # or straddle anywhere
    for pat, miss in [(b"1e", b"1f"), (b"9E", b"xE"), (b"0.0000", b"0.000x"), (b"null", b"nulx")]:
        for before in range(17):
            for after in range(10):
                hit = b"a" * before + pat + b"a" * after
                assert impl(hit) and STD.search(hit), hit
                near = b"a" * before + miss + b"a" * after
                assert impl(near) == (STD.search(near) is not None), near


@pytest.mark.parametrize("impl", [_core.json_long_digits, serdes._py_long_digits])
def test_long_digits_finds_a_run_at_every_place(impl: Callable[[bytes], bool]) -> None:
    # the compiled scan probes every 19th byte: a run may start anywhere
    for before in range(40):
        for after in range(3):
            assert impl(b"a" * before + b"7" * 19 + b"a" * after)
            assert not impl(b"a" * before + b"7" * 18 + b"a" + b"7" * 18 + b"a" * after)
