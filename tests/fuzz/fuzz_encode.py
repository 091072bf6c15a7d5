#!/usr/bin/env python3
"""Fuzz target: tailrace's compiled JSON writer against json's (tests/fuzz/README.md).

    python tests/fuzz/fuzz_encode.py [libFuzzer flags] [corpus directories]

Each input describes a value (``jsonfuzz.value_from``: nested dicts, lists and tuples, str
with any character, ints of any size, floats of any bits, bool, None, a few subclasses) for
``JsonCodec.encode``: ``jsonfuzz.check_encode`` says what must hold; what it writes is then
read back through ``jsonfuzz.check_decode`` too. scripts/fuzz.sh runs it in CI.
"""

from __future__ import annotations

import sys

import atheris
import jsonfuzz  # beside this file: the script's directory is first on sys.path


def test_one_input(data: bytes) -> None:
    written = jsonfuzz.check_encode(jsonfuzz.value_from(atheris.FuzzedDataProvider(data)))
    if written is not None:
        jsonfuzz.check_decode(written)


def main() -> None:
    print("fuzz_encode:", jsonfuzz.load_core(), flush=True)
    jsonfuzz.codecs()  # tailrace imported (with the instrumented core) before the fuzzing
    atheris.Setup(sys.argv, test_one_input)
    print("fuzz_encode:", jsonfuzz.start_coverage() or "no C coverage", flush=True)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
