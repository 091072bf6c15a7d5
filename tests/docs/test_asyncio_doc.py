"""docs/asyncio.md: its Python examples run as written (those whose imports are installed)
and print what their comments say."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "asyncio.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
PRINT_WITH_EXPECTATION = re.compile(r"^print\(.*\)\s+#\s+(?P<expected>.+)$")
IMPORT = re.compile(r"^(?:import|from) ([\w.]+)", re.M)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_asyncio_doc_example_runs_as_written(index: int, tmp_path: Path) -> None:
    code = BLOCKS[index]
    missing = [m for m in IMPORT.findall(code) if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    expected = [m["expected"] for line in code.splitlines() if (m := PRINT_WITH_EXPECTATION.match(line))]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected
