"""Fixtures of the Redis tests: each test gets its own real redis-server."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_support import HERE, REDIS_SERVER, RedisServer

HAVE_REDIS_PY = importlib.util.find_spec("redis") is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(pytest.mark.redis)
            if REDIS_SERVER is None:
                item.add_marker(
                    pytest.mark.skip(reason="redis-server is not installed (apt-get install redis-server)")
                )
            elif not HAVE_REDIS_PY:
                item.add_marker(
                    pytest.mark.skip(reason="redis-py is not installed (pip install 'tailrace[redis]')")
                )


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()
