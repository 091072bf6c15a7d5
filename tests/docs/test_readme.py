"""The README's Python examples run as written and print what their comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
PRINT_WITH_EXPECTATION = re.compile(r"^print\(.*\)\s+#\s+(?P<expected>.+)$")


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_as_written(index: int, tmp_path: Path) -> None:
    code = BLOCKS[index]
    expected = [m["expected"] for line in code.splitlines() if (m := PRINT_WITH_EXPECTATION.match(line))]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert printed == expected, f"README block {index} printed {printed}, its comments say {expected}"
