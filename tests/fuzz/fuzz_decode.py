#!/usr/bin/env python3
"""Fuzz target: tailrace's compiled JSON reader against json.loads (tests/fuzz/README.md).

    python tests/fuzz/fuzz_decode.py [libFuzzer flags] [corpus directories]

Each input is a text (bytes, and str where they are UTF-8) for ``JsonCodec.decode``:
``jsonfuzz.check_decode`` says what must hold. scripts/fuzz.sh runs it in CI.
"""

from __future__ import annotations

import json
import json.decoder
import sys

import atheris
import jsonfuzz  # beside this file: the script's directory is first on sys.path


def test_one_input(data: bytes) -> None:
    jsonfuzz.check_decode(data)


def main() -> None:
    print("fuzz_decode:", jsonfuzz.load_core(), flush=True)
    jsonfuzz.codecs()  # tailrace imported (with the instrumented core) before the fuzzing
    # the standard library's Python layer (encoding detection, errors) is coverage too
    for fn in (json.loads, json.detect_encoding, json.decoder.JSONDecoder.decode):
        atheris.instrument_func(fn)
    atheris.instrument_func(json.decoder.JSONDecoder.raw_decode)
    atheris.Setup(sys.argv, test_one_input)
    print("fuzz_decode:", jsonfuzz.start_coverage() or "no C coverage", flush=True)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
