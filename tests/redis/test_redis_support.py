"""The tests' own redis-server helper (issue 38, item 15)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from redis_support import RedisServer, free_port


class _Unreachable(RedisServer):
    """A server whose readiness check asks a port nobody listens on: it runs, never answers."""

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.1)

    def wait_ready(self, timeout: float = 0.5) -> None:
        super().wait_ready(timeout)


def test_a_server_that_runs_but_never_answers_is_killed_and_said_so(tmp_path: Path) -> None:
    server = _Unreachable(tmp_path / "redis")
    with pytest.raises(RuntimeError) as info:
        server.start()
    message = str(info.value)
    assert "started but did not answer PING" in message, message
    assert "did not start" not in message, message
    found = re.search(r"\(pid (\d+)\)", message)
    assert found, message
    with pytest.raises(ProcessLookupError):  # killed and reaped, not leaked
        os.kill(int(found.group(1)), 0)
    assert server.proc is None


def test_a_server_that_exits_is_said_not_to_have_started(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", extra=("--no-such-option", "1"))
    with pytest.raises(RuntimeError, match=r"redis-server did not start \(exit status \d+\)"):
        server.start()
    assert server.proc is None
