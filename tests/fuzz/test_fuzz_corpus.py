"""The fuzz targets' corpus (tests/fuzz/corpus), replayed through both checks of
tests/fuzz/jsonfuzz.py in the normal suite: an input the fuzzers kept (seeds, and what they
found) that the compiled JSON codec reads or writes unlike the standard library fails here
too, without atheris' fuzzing. The encode inputs need atheris' FuzzedDataProvider."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jsonfuzz
import pytest

CORPUS = Path(__file__).parent / "corpus"


def _replay(kind: str, check: object) -> None:
    files = sorted((CORPUS / kind).iterdir())
    assert files, f"no corpus in {CORPUS / kind}"
    failed = []
    for path in files:
        try:
            check(path.read_bytes())  # type: ignore[operator]
        except AssertionError as e:
            failed.append(f"{path.relative_to(CORPUS)}: {e}")
    assert not failed, f"{len(failed)} of {len(files)} inputs:\n" + "\n".join(failed)


def test_the_decode_corpus_reads_as_json_loads_reads_it() -> None:
    _replay("decode", jsonfuzz.check_decode)


@pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None, reason="needs atheris (requirements-test.txt)"
)
def test_the_encode_corpus_writes_as_the_standard_library_writes_it() -> None:
    import atheris

    def check(data: bytes) -> None:
        written = jsonfuzz.check_encode(jsonfuzz.value_from(atheris.FuzzedDataProvider(data)))
        if written is not None:
            jsonfuzz.check_decode(written)

    _replay("encode", check)
