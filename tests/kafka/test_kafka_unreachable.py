"""Kafka unreachable at start (issue 38, item 5): one line naming the brokers and what to
check, as soon as librdkafka finds every broker down, not after ``metadata_timeout_s``
of silence; librdkafka's own lines and the traceback only at DEBUG. No broker needed:
an unreachable broker is a closed local port."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tailrace.errors import InputError
from tailrace.kafka import KafkaSystem

from .conftest import _free_port

ck = pytest.importorskip("confluent_kafka")

TASK = """
from tailrace import StreamTask


class Nothing(StreamTask):
    def process(self, envelope, collector, coordinator):
        pass
"""


def _job(tmp_path: Path, servers: str) -> Path:
    (tmp_path / "nothing.py").write_text(TASK)
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "kafka-down"
task = "nothing.py:Nothing"
inputs = ["kafka.in"]

[systems.kafka]
type = "kafka"
bootstrap_servers = "{servers}"
metadata_timeout_s = 30
"""
    )
    return job


def _run(job: Path, *log_level: str) -> tuple[subprocess.CompletedProcess[str], float]:
    cmd = [sys.executable, "-m", "tailrace", *log_level, "run", str(job), "--no-progress"]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    return done, time.monotonic() - started


def test_an_unreachable_broker_stops_the_run_at_once_in_one_line(tmp_path: Path) -> None:
    # it took metadata_timeout_s of silence, then a librdkafka ERROR line and a raw
    # KafkaError{...}; Redis says the same in one line at once
    servers = f"127.0.0.1:{_free_port()},127.0.0.1:{_free_port()}"
    done, took = _run(_job(tmp_path, servers))
    assert done.returncode == 1, done.stderr
    assert took < 10, f"{took:.1f} s"  # metadata_timeout_s is 30: the client's verdict, not the timeout
    lines = [ln for ln in done.stderr.splitlines() if " INFO " not in ln]
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"tailrace: error: kafka.in: Kafka at {servers} is unreachable ("), line
    for broker in servers.split(","):
        assert f"{broker}: Connection refused" in line, line
    assert "check that the brokers run" in line and "systems.kafka.bootstrap_servers" in line, line
    assert "KafkaError{" not in done.stderr and "left (" not in done.stderr, done.stderr

    # at DEBUG: the traceback, and librdkafka's own lines about the refused connections
    debug, _ = _run(_job(tmp_path, servers), "--log-level", "DEBUG")
    assert debug.returncode == 1, debug.stderr
    assert "Traceback" in debug.stderr, debug.stderr
    assert "DEBUG tailrace.kafka.client: FAIL" in debug.stderr, debug.stderr
    assert " ERROR tailrace.kafka.client" not in debug.stderr, debug.stderr


def test_a_broker_name_that_does_not_resolve_is_said_so(tmp_path: Path) -> None:
    system = KafkaSystem("kafka", "tailrace-no-such-host.invalid:9092", metadata_timeout_s=30)
    started = time.monotonic()
    with pytest.raises(InputError) as e:
        system.partitions("in")
    assert time.monotonic() - started < 10
    text = str(e.value)
    assert "Kafka at tailrace-no-such-host.invalid:9092 is unreachable" in text, text
    assert "Failed to resolve 'tailrace-no-such-host.invalid:9092'" in text, text


def test_the_settings_check_logs_its_clients_lines_at_debug_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the check makes a consumer and closes it at once; a consumer connects as it is made,
    # and a close after its connection was refused logged an ERROR (one run in 15) about a
    # client that was never meant to connect. Here the close comes after a refusal.
    class SlowClose(ck.Consumer):  # type: ignore[misc]
        def close(self, *args: Any) -> Any:
            with contextlib.suppress(ck.KafkaException):
                self.list_topics(timeout=0.5)  # a connection now, refused
            return super().close(*args)

    monkeypatch.setattr(ck, "Consumer", SlowClose)
    with caplog.at_level(logging.DEBUG, logger="tailrace.kafka.client"):
        KafkaSystem("kafka", f"127.0.0.1:{_free_port()}")
    lines = [r for r in caplog.records if r.name == "tailrace.kafka.client"]
    assert lines, "the consumer's refused connection was not logged at all"
    assert all(r.levelno == logging.DEBUG for r in lines), [(r.levelname, r.getMessage()) for r in lines]
