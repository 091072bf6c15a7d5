"""docs/testing.md's examples run as written: each block is a pytest module using the
``tailrace_driver`` fixture of the installed plugin, run in a fresh pytest process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_doc_has_the_window_and_the_async_examples() -> None:
    assert len(BLOCKS) == 3
    assert "task.window.ms" in BLOCKS[0] and "advance(" in BLOCKS[0]
    assert "AsyncStreamTask" in BLOCKS[1] and ".complete()" in BLOCKS[1]
    assert "async def process" in BLOCKS[2] and '.store("Partition 0", "seen") == {' in BLOCKS[2]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_passes_as_written(index: int, tmp_path: Path) -> None:
    module = tmp_path / f"test_doc_example_{index}.py"
    module.write_text(BLOCKS[index])
    tests = re.findall(r"^def (test_\w+)", BLOCKS[index], re.M)
    assert tests, "an example is a pytest module"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(module)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(tests)} passed" in done.stdout, done.stdout
