"""examples/sessions/make_data.py: the bundled input regenerates byte for byte, and a larger one
(``--users``, ``--out``) can be made for a run long enough to stop halfway (issue 38, item 12)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAKE = REPO / "examples" / "sessions" / "make_data.py"
BUNDLED = REPO / "examples" / "sessions" / "data" / "clicks"


def _make(out: Path, *args: str) -> list[bytes]:
    subprocess.run([sys.executable, str(MAKE), "--out", str(out), *args], check=True, timeout=120)
    return [(out / "clicks" / f"partition-{p}.jsonl").read_bytes() for p in range(3)]


def test_the_default_is_the_bundled_data(tmp_path: Path) -> None:
    assert _make(tmp_path) == [(BUNDLED / f"partition-{p}.jsonl").read_bytes() for p in range(3)]


def test_more_users_make_a_larger_input_in_another_directory(tmp_path: Path) -> None:
    bundled = sum(len(b.splitlines()) for b in _make(tmp_path / "small"))
    larger = sum(len(b.splitlines()) for b in _make(tmp_path / "large", "--users", "3000"))
    assert larger > 8 * bundled
