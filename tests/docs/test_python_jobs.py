"""docs/python-jobs.md's examples run as written and print what their comments say: a job built
in Python from the exported FileSystem / SqliteCheckpointStore / RedisSystem / RedisCheckpointStore."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-jobs.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
PRINT_WITH_EXPECTATION = re.compile(r"^print\(.*\)\s+#\s+(?P<expected>.+)$")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "redis"))
from redis_support import REDIS_SERVER, RedisServer  # noqa: E402


def run_block(code: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    expected = [m["expected"] for line in code.splitlines() if (m := PRINT_WITH_EXPECTATION.match(line))]
    assert expected, "an example must say what it prints"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected, (
        f"printed {done.stdout.splitlines()}, comments say {expected}"
    )


def test_the_doc_has_a_file_and_a_redis_example() -> None:
    assert len(BLOCKS) == 2
    assert "tailrace.FileSystem(" in BLOCKS[0] and "tailrace.SqliteCheckpointStore(" in BLOCKS[0]
    # issue 38: the word count's shape keeps its counts where they survive a restart
    assert 'context.store("counts")' in BLOCKS[0] and "self.counts = {}" not in BLOCKS[0]
    assert "tailrace.RedisSystem(" in BLOCKS[1] and "tailrace.RedisCheckpointStore(" in BLOCKS[1]


def test_file_system_and_sqlite_job_built_in_python(tmp_path: Path) -> None:
    run_block(BLOCKS[0], tmp_path)


@pytest.mark.redis
@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
@pytest.mark.skipif(importlib.util.find_spec("redis") is None, reason="redis-py is not installed")
def test_redis_job_built_in_python(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        run_block(BLOCKS[1], tmp_path, {"REDIS_URL": server.url})
        run_block(BLOCKS[1], tmp_path, {"REDIS_URL": server.url})  # issue 38: it runs again as written
    finally:
        server.kill()


def test_the_exported_backends_are_the_real_classes() -> None:
    import tailrace
    from tailrace.files import FileSystem
    from tailrace.redis import RedisCheckpointStore, RedisSystem
    from tailrace.sqlite import SqliteCheckpointStore

    assert tailrace.FileSystem is FileSystem and tailrace.SqliteCheckpointStore is SqliteCheckpointStore
    assert tailrace.RedisSystem is RedisSystem and tailrace.RedisCheckpointStore is RedisCheckpointStore
    assert {"FileSystem", "SqliteCheckpointStore", "RedisSystem", "RedisCheckpointStore"} <= set(
        tailrace.__all__
    )


@pytest.mark.parametrize(
    "name",
    [
        "FileSystem",
        "MemorySystem",
        "RedisSystem",
        "SqliteCheckpointStore",
        "MemoryCheckpointStore",
        "RedisCheckpointStore",
        "Container",
    ],
)
def test_each_class_s_docstring_lists_its_options_and_its_thread_safety(name: str) -> None:
    # the doc: "its docstring lists its options and its thread-safety"
    import inspect

    import tailrace

    cls = getattr(tailrace, name)
    doc = inspect.getdoc(cls) or ""
    options = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.name != "name" and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    missing = [option for option in options if f"``{option}``" not in doc]
    assert not missing, f"{name}'s docstring does not name {missing}"
    assert "thread" in doc, f"{name}'s docstring says nothing about threads"
