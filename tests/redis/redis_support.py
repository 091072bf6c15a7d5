"""Helpers for the Redis tests: real redis-server processes and member subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
HERE = Path(__file__).resolve().parent


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A free loopback port whose cluster bus port (port + 10000) is free and valid too."""
    import random

    for _ in range(1000):
        port = random.randrange(20000, 45000)
        if _is_free(port) and _is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair found")


class RedisServer:
    """One redis-server in ``dir``: AOF with fsync on every write, no RDB snapshots."""

    def __init__(
        self, dir: Path, *, port: int | None = None, extra: tuple[str, ...] = (), password: str | None = None
    ) -> None:
        self.dir = dir
        self.port = port
        self.sock = None if port is not None else str(dir / "redis.sock")
        self.password = password  # requirepass; ``url`` leaves it out
        self.extra = extra + (("--requirepass", password) if password is not None else ())
        self.proc: subprocess.Popen[bytes] | None = None
        dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0" if self.port is not None else f"unix://{self.sock}?db=0"

    def start(self) -> RedisServer:
        assert REDIS_SERVER is not None
        args = [
            REDIS_SERVER,
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.port is not None:
            args += ["--port", str(self.port), "--bind", "127.0.0.1"]
        else:
            args += ["--port", "0", "--unixsocket", str(self.sock), "--unixsocketperm", "700"]
        self.proc = subprocess.Popen(
            [*args, *self.extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.wait_ready()
        return self

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, password=self.password)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Return once the server answers PING; else kill it (never leak it) and raise saying
        whether it exited (with its log) or ran but did not answer in ``timeout`` seconds."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.client() as c:
                    c.ping()
                return
            except Exception as e:  # noqa: BLE001 - not up yet
                code = self.proc.poll()
                if code is None and time.monotonic() <= deadline:
                    time.sleep(0.02)
                    continue
                pid = self.proc.pid
                self.kill()
                log = (self.dir / "redis.log").read_text() if (self.dir / "redis.log").exists() else ""
                if code is None:
                    what = (
                        f"redis-server (pid {pid}) started but did not answer PING at {self.url} within "
                        f"{timeout:g} s (last error: {type(e).__name__}: {e}); it was killed"
                    )
                else:
                    what = f"redis-server did not start (exit status {code})"
                raise RuntimeError(f"{what}; its log: {log[-2000:]}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None


MEMBER_MAIN = str(HERE / "member_main.py")


def spawn_member(
    spec: dict[str, Any], log_path: Path, main: str | Path = MEMBER_MAIN
) -> subprocess.Popen[bytes]:
    """A member in its own process (``main``: member_main.py, or another member script run with
    the spec as its argument); output goes to ``log_path``."""
    out = open(log_path, "wb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(main), json.dumps(spec)], stdout=out, stderr=subprocess.STDOUT, env=env
    )


def finish_members(
    procs: list[subprocess.Popen[bytes]], logs: list[Path], timeout: float = 120
) -> list[dict[str, Any]]:
    """Wait for every member; each must exit 0 after printing its ``RESULT`` line."""
    results = []
    for proc, log in zip(procs, logs):
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"member did not finish:\n{log.read_text()[-3000:]}") from None
        text = log.read_text()
        assert rc == 0, f"member exited {rc}:\n{text[-3000:]}"
        line = [x for x in text.splitlines() if x.startswith("RESULT ")]
        assert line, text[-3000:]
        results.append(json.loads(line[-1][len("RESULT ") :]))
    return results


class RedisClusterNodes:
    """Three cluster-enabled redis-servers on loopback, joined with ``redis-cli --cluster create``."""

    def __init__(self, dir: Path, n: int = 3) -> None:
        self.servers = [
            RedisServer(
                dir / f"node{i}",
                port=free_port(),
                extra=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ),
            )
            for i in range(n)
        ]

    @property
    def url(self) -> str:
        return self.servers[0].url

    def start(self) -> RedisClusterNodes:
        assert REDIS_CLI is not None
        for s in self.servers:
            s.start()
        addrs = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            timeout=30,
        )
        deadline = time.monotonic() + 20
        for s in self.servers:
            with s.client() as c:
                while str(c.cluster("info").get("cluster_state")) != "ok":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                    time.sleep(0.05)
        return self

    def kill(self) -> None:
        for s in self.servers:
            s.kill()
