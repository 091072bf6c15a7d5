"""The Kafka broker of the contract suite.

Without ``KAFKA_BOOTSTRAP_SERVERS`` every test gets its own Mokapi (installed by
scripts/test.sh into build/npm) with the topics it asks for, on free ports, its
Kafka listener at 127.0.0.1; with it, the same tests run against that broker
with freshly created, uniquely named topics.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ck = pytest.importorskip("confluent_kafka")
pytest.importorskip("confluent_kafka.admin")

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
MOKAPI = Path(os.environ.get("TAILRACE_MOKAPI", ROOT / "build" / "npm" / "node_modules" / ".bin" / "mokapi"))
CHANNEL = """  {name}:
    address: {name}
    bindings:
      kafka:
        partitions: {partitions}
    messages:
      any:
{content}        payload: {{}}
"""
# a topic whose records need not be JSON: Mokapi refuses a record its channel's content
# type (JSON by default) does not validate with INVALID_RECORD, and v0.52 refuses some
# valid JSON too (the dead letters of test_kafka_bad_messages, seen here)
BINARY = "        contentType: application/octet-stream\n"


@dataclass
class Cluster:
    bootstrap: str
    topics: dict[str, str]  # the name a test asked for -> the topic's real name
    real: bool
    proc: subprocess.Popen[bytes] | None = None  # the Mokapi (None: a real broker)
    log: Path | None = None  # its output
    killed: bool = False  # by the test (kill_broker), not by a fault of its own

    def kill_broker(self) -> None:
        """SIGKILL the Mokapi: the broker vanishes mid-run (every connection refused)."""
        assert self.proc is not None, "a real broker is not the tests' to kill"
        self.killed = True
        stop_mokapi(self.proc, signal.SIGKILL)

    def json_values(self, topic: str, partition: int = 0) -> list[Any]:
        """The decoded JSON values of one partition of ``topic`` (every producer of these
        tests writes JSON). A value that is not JSON was written by no producer: Mokapi now
        and then hands back a garbled record while two members produce to one partition
        (seen once in CI: '0\xf4...' among the outputs); the read is tried again, and a
        garbled record that stays is a MockBrokerFault (a real broker's is a failure)."""
        for attempt in range(3):
            values = [m.value() for m in self.read_all(topic, partition + 1)[partition]]
            try:
                return [json.loads(v) for v in values]
            except ValueError:
                if attempt == 2:
                    bad = next(v for v in values if not _is_json(v))
                    if self.real:
                        raise
                    raise MockBrokerFault(f"Mokapi returned a record no producer wrote: {bad!r}") from None
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def crash(self) -> str | None:
        """The fatal error that ended the Mokapi on its own, if it did (None while it runs).

        Mokapi v0.52 has data races: two group members committing at once now and then
        end it with "fatal error: concurrent map writes" (store.(*Group).Commit). A test
        that fails after that proves nothing about tailrace (see pytest_runtest_makereport)."""
        if self.proc is None or self.killed or self.proc.poll() is None or self.log is None:
            return None
        lines = self.log.read_text(errors="replace").splitlines()
        fatal = [ln for ln in lines if ln.startswith(("fatal error:", "panic:"))]
        return f"{fatal[0]} (exit status {self.proc.returncode})" if fatal else None

    @property
    def producer_settings(self) -> dict[str, Any]:
        """Producer settings the broker needs: Mokapi breaks idempotent producers
        (out-of-order sequence errors), so they are off there (docs/kafka.md)."""
        return {} if self.real else {"enable.idempotence": False}

    def produce(self, topic: str, items: list[tuple[int, Any, bytes | None]], headers: Any = None) -> None:
        """Produce (partition, key, value) to ``topic`` and wait for every delivery."""
        p = ck.Producer({"bootstrap.servers": self.bootstrap, "acks": "all"})
        failed: list[Any] = []
        for part, key, value in items:
            p.produce(
                self.topics[topic],
                value,
                key,
                part,
                headers=headers,
                on_delivery=lambda err, _m: failed.append(err) if err else None,
            )
            p.poll(0)
        assert p.flush(30) == 0
        assert not failed, failed

    def read_all(self, topic: str, partitions: int, timeout: float = 20.0) -> dict[int, list[Any]]:
        """Every message of ``topic`` up to its current end, as {partition: [message, ...]}
        (a fresh read outside any group; the end is each partition's high watermark)."""
        c = ck.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        try:
            name = self.topics[topic]
            ends = {
                p: c.get_watermark_offsets(ck.TopicPartition(name, p), timeout=10)[1]
                for p in range(partitions)
            }
            c.assign([ck.TopicPartition(name, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
            out: dict[int, list[Any]] = {p: [] for p in range(partitions)}
            deadline = time.monotonic() + timeout
            pending = {p for p in range(partitions) if ends[p] > 0}
            while pending and time.monotonic() < deadline:
                for m in c.consume(500, 0.2):
                    if m.error():
                        continue
                    if m.offset() < ends[m.partition()]:
                        out[m.partition()].append(m)
                    if m.offset() >= ends[m.partition()] - 1:
                        pending.discard(m.partition())
            assert not pending, f"read of {topic} did not reach the end of partitions {sorted(pending)}"
            return out
        finally:
            c.close()

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        c = ck.Consumer({"bootstrap.servers": self.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            tps = c.committed(
                [ck.TopicPartition(self.topics[topic], p) for p in range(partitions)], timeout=10
            )
            return {tp.partition: tp.offset for tp in tps}
        finally:
            c.close()


class MockBrokerFault(Exception):
    """The mock broker did something no Kafka broker does (a garbled record)."""


def _is_json(value: bytes | None) -> bool:
    try:
        json.loads(value or b"")
    except ValueError:
        return False
    return True


def stop_mokapi(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop a Mokapi started in its own process group: its npm launcher and the Go binary."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
    except ProcessLookupError:
        pass
    proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settled(proc: subprocess.Popen[bytes], log: Path, within: float = 0.5) -> bool:
    """False when Mokapi died soon after it listened: v0.52 now and then panics starting its
    dashboard's search index ("sync: WaitGroup is reused"), about one start in a hundred
    here; the broker is gone then, and the caller starts another one."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None or b"panic:" in log.read_bytes():
            stop_mokapi(proc)
            return False
        time.sleep(0.05)
    return True


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mokapi exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"mokapi did not listen on {port} within {timeout} s: {log.read_text()[-2000:]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that failed after its Mokapi crashed on its own (see ``Cluster.crash``), or
    on a MockBrokerFault (a garbled record, ``Cluster.json_values``), is reported as
    skipped, naming the fault: the failure is the mock broker's, and the run proved nothing
    either way. A test that passed despite a fault stays passed; a test whose broker did
    nothing wrong fails as usual."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    crashes = [c for c in (cl.crash() for cl in getattr(item, "kafka_clusters", ())) if c]
    if call.excinfo is not None and call.excinfo.errisinstance(MockBrokerFault):
        crashes.append(str(call.excinfo.value))
    if crashes:
        report.outcome = "skipped"
        report.longrepr = (
            str(item.path),
            item.location[1] or 0,
            f"Skipped: the Mokapi broker failed mid-test ({crashes[0]}), a bug of the mock, "
            "not of tailrace; this run proved nothing",
        )


@pytest.fixture
def kafka_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Cluster]]:
    """A factory: ``kafka_cluster({"in": 4, "out": 2})`` -> a Cluster with those topics;
    ``binary=("in",)``: topics whose records may be any bytes, not only JSON."""
    procs: list[subprocess.Popen[bytes]] = []
    clusters: list[Cluster] = []
    request.node.kafka_clusters = clusters  # read by pytest_runtest_makereport
    real = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    admin_topics: list[str] = []

    def make(topics: Mapping[str, int], *, binary: Collection[str] = ()) -> Cluster:
        if real:
            admin = ck.admin.AdminClient({"bootstrap.servers": real})
            names = {t: f"tr-{t}-{uuid.uuid4().hex[:8]}" for t in topics}
            futures = admin.create_topics(
                [ck.admin.NewTopic(names[t], n, replication_factor=-1) for t, n in topics.items()]
            )
            for f in futures.values():
                f.result(30)
            admin_topics.extend(names.values())
            return Cluster(real, names, True)
        if not MOKAPI.exists() or shutil.which("node") is None:
            pytest.skip(f"mokapi is not installed at {MOKAPI} (scripts/test.sh installs it with npm)")
        channels = "".join(
            CHANNEL.format(name=t, partitions=n, content=BINARY if t in binary else "")
            for t, n in topics.items()
        )
        template = (HERE / "mokapi.yaml").read_text().replace("{channels}", channels)
        for _ in range(3):
            port = _free_port()
            spec = tmp_path / f"mokapi-{port}.yaml"
            spec.write_text(template.replace("{port}", str(port)))
            log = tmp_path / f"mokapi-{port}.log"
            args = [
                str(MOKAPI),
                f"--api-port={_free_port()}",
                f"--mcp-server-port={_free_port()}",
                f"--health-port={_free_port()}",
                "--log-level=warn",
                str(spec),
            ]
            with open(log, "wb") as out:
                # its own process group: the npm launcher runs the Go binary as a child, which a
                # signal to the launcher alone leaves running (and holding an inotify instance)
                proc = subprocess.Popen(
                    args, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True
                )
            procs.append(proc)
            _wait_port(port, proc, log)
            if _settled(proc, log):
                cluster = Cluster(f"127.0.0.1:{port}", {t: t for t in topics}, False, proc, log)
                clusters.append(cluster)
                return cluster
        raise RuntimeError(f"mokapi died right after it started, 3 times: {log.read_text()[-2000:]}")

    yield make
    for p in procs:
        stop_mokapi(p)
    if admin_topics and real:
        ck.admin.AdminClient({"bootstrap.servers": real}).delete_topics(admin_topics)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A real redis-server (the shared checkpoint store of several Kafka members),
    started as the Redis tests start theirs (tests/redis/redis_support.py)."""
    import importlib.util
    import sys

    if shutil.which("redis-server") is None or importlib.util.find_spec("redis") is None:
        pytest.skip("needs redis-server and redis-py (pip install 'tailrace[redis]')")
    sys.path.insert(0, str(ROOT / "tests" / "redis"))
    try:
        from redis_support import RedisServer
    finally:
        sys.path.remove(str(ROOT / "tests" / "redis"))
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server.url
    finally:
        server.kill()
