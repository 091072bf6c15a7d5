"""docs/running-jobs.md says what a damaged SQLite store's message says: which files to
delete to start over (issue 38, item 3: the message names four, the page said "both")."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tailrace import SqliteCheckpointStore, SystemStreamPartition
from tailrace.errors import CheckpointError

REPO = Path(__file__).resolve().parents[2]


def test_running_jobs_md_deletes_the_files_the_message_names(tmp_path: Path) -> None:
    db = tmp_path / "checkpoints.db"
    store = SqliteCheckpointStore(db)
    store.open("job")
    store.write("Partition 0", {SystemStreamPartition("files", "in", 0): 5})
    store.close()
    db.write_bytes(b"")  # truncated, as the page's example: its marker says it held checkpoints
    for wal in (tmp_path / "checkpoints.db-wal", tmp_path / "checkpoints.db-shm"):
        wal.unlink(missing_ok=True)
    with pytest.raises(CheckpointError) as info:
        SqliteCheckpointStore(db).open("job")
    message = str(info.value)
    assert "is empty (no schema" in message, message
    found = re.search(r"rm -f -- (.*)$", message)
    assert found, message
    names = [Path(f).name for f in shlex.split(found.group(1))]
    assert len(names) == 4, names
    page = " ".join((REPO / "docs" / "running-jobs.md").read_text().split())
    assert f"`rm -f -- {' '.join(names)}`" in page, names
    assert "delete both files" not in page
