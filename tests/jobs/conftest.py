"""Fixtures of the job tests: every available engine, and a tailrace CLI runner."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tailrace.container import ENGINES

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _available(name: str) -> bool:
    module = ENGINES[name].partition(":")[0]
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


AVAILABLE_ENGINES = [e for e in ENGINES if _available(e)]


@pytest.fixture(params=AVAILABLE_ENGINES or [pytest.param(None, marks=pytest.mark.skip("no engine importable"))])
def engine(request: pytest.FixtureRequest) -> str:
    """Each engine whose module imports ("c" native, "python" reference)."""
    return request.param  # type: ignore[no-any-return]


def tailrace_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tailrace", *args]


def run_cli(
    args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tailrace ARGS`` in a real subprocess; returns the completed process."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        tailrace_cmd(*args), capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )
