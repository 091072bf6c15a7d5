"""``tailrace replay`` to a Kafka input (docs/bad-messages.md): each dead letter's message
produced to its topic partition with its key (``bytes`` as they were read, else ``value``
through the system's serdes), or with ``--stream`` to another topic, partition modulo its count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import Cluster


def _job(tmp_path: Path, cluster: Cluster) -> Path:
    producer = "" if cluster.real else '"enable.idempotence" = false'
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "kafka-replay"
task = "task.py:Task"
inputs = ["kafka.{cluster.topics["in"]}"]

[systems.kafka]
type = "kafka"
bootstrap_servers = "{cluster.bootstrap}"

[systems.kafka.producer]
{producer}
"""
    )
    return job


def test_replay_produces_the_dead_letters_to_their_topic_partitions(
    kafka_cluster: object, tmp_path: Path
) -> None:
    cluster: Cluster = kafka_cluster({"in": 2, "other": 3})  # type: ignore[operator]
    job = _job(tmp_path, cluster)
    topic = cluster.topics["in"]
    letters = [
        {"system": "kafka", "stream": topic, "partition": 1, "offset": 7, "key": "u1", "value": {"a": 1}},
        {"system": "kafka", "stream": topic, "partition": 0, "offset": 3, "key": None, "bytes": '{"b":  2}'},
        {"system": "kafka", "stream": topic, "partition": 1, "offset": 7, "key": "u1", "value": {"a": 1}},
    ]
    path = tmp_path / "dead.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in letters))
    cmd = [sys.executable, "-m", "tailrace", "replay", str(job), str(path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"kafka.{topic}[0]: 1\n" in r.stdout and f"kafka.{topic}[1]: 1\n" in r.stdout, r.stdout
    assert "1 duplicate skipped" in r.stdout, r.stdout
    got = cluster.read_all("in", 2)
    assert [(m.key(), m.value()) for m in got[0]] == [(None, b'{"b":  2}')]  # as read: not re-encoded
    assert [(m.key(), json.loads(m.value())) for m in got[1]] == [(b"u1", {"a": 1})]

    r = subprocess.run([*cmd, "--stream", f"kafka.{cluster.topics['other']}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = cluster.read_all("other", 3)
    assert [len(got[p]) for p in range(3)] == [1, 1, 0]  # partitions 0 and 1 (modulo 3)
