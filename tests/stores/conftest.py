"""Fixtures of the state-store tests: both engines, and both embedded checkpoint stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailrace import MemoryCheckpointStore
from tailrace.interfaces import CheckpointStore
from tailrace.sqlite import SqliteCheckpointStore

ENGINE_NAMES = ["c", "python"]


@pytest.fixture(params=ENGINE_NAMES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sqlite", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """An unopened checkpoint store keeping state: SQLite (a file) or memory."""
    if request.param == "sqlite":
        return SqliteCheckpointStore(tmp_path / "checkpoints.db")
    return MemoryCheckpointStore()
