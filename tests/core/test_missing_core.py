"""Without its compiled core, ``import tailrace`` fails and says how to rebuild (never a silent fallback)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tailrace


def test_import_without_the_compiled_core_names_the_problem_and_the_fix(tmp_path: Path) -> None:
    package = Path(tailrace.__file__).parent
    copy = tmp_path / "tailrace"  # imported from the working directory; -S keeps editable-install finders out
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("_core*.so", "_core*.pyd", "__pycache__"))
    assert not list(copy.glob("_core*.so"))
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import tailrace"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "CoreUnavailableError" in done.stderr
    assert "tailrace._core" in done.stderr and "pip install" in done.stderr
