"""A kafka system's options and librdkafka settings are checked when the system is made,
before anything runs, each mistake named by its key (no broker needed: a client is only
made and dropped, it connects to nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tailrace.errors import ConfigError
from tailrace.jobfile import load_job
from tailrace.kafka import KafkaSystem

pytest.importorskip("confluent_kafka")


def _system(**kw: Any) -> KafkaSystem:
    return KafkaSystem("kafka", "127.0.0.1:1", **kw)


@pytest.mark.parametrize(
    ("options", "key", "says"),
    [
        ({"headers": "false"}, "headers", "expected true or false, got 'false'"),
        ({"bounded": "no"}, "bounded", "expected true or false, got 'no'"),
        ({"group_id": 5}, "group_id", "expected a group name, got 5"),
        ({"metadata_timeout_s": -1}, "metadata_timeout_s", "expected a number of seconds > 0"),
        ({"metadata_timeout_s": "x"}, "metadata_timeout_s", "expected a number of seconds > 0"),
        ({"consumer": {"bogus.setting": 1}}, "consumer.bogus.setting", "No such configuration property"),
        ({"consumer": {"enable.auto.commit": "no"}}, "consumer.enable.auto.commit", "Expected bool value"),
        ({"consumer": {"session.timeout.ms": "abc"}}, "consumer.session.timeout.ms", "Invalid value"),
        (
            {"config": {"session.timeout.ms": "abc"}},
            "systems.kafka.config.session.timeout.ms",  # config.X would read as the job's [config]
            "Invalid value",
        ),
        ({"producer": {"acks": "most"}}, "producer", "request.required.acks"),  # an alias too
        ({"producer": {"linger.ms": "soon"}}, "producer", "queue.buffering.max.ms"),  # named by its alias
        # librdkafka reads true, t, 1, yes, on in any case as true: all refused
        ({"consumer": {"enable.auto.commit": "True"}}, "consumer.enable.auto.commit", "auto commit"),
        ({"consumer": {"enable.auto.commit": "1"}}, "consumer.enable.auto.commit", "auto commit"),
        ({"config": {"enable.auto.commit": "t"}}, "systems.kafka.config.enable.auto.commit", "auto commit"),
    ],
)
def test_a_bad_option_or_setting_is_refused_naming_its_key(
    options: dict[str, Any], key: str, says: str
) -> None:
    with pytest.raises(ConfigError) as e:
        _system(**options)
    assert e.value.key == key, e.value
    assert says in str(e.value), e.value


def test_good_settings_pass_and_false_auto_commit_spellings_are_taken() -> None:
    for off in (False, 0, "false", "False", "0"):
        _system(consumer={"enable.auto.commit": off, "session.timeout.ms": 6000}, producer={"linger.ms": 1})


@pytest.mark.parametrize("table", ["config", "consumer"])
def test_a_bad_setting_in_a_job_file_is_named_with_its_table(tmp_path: Path, table: str) -> None:
    # docs/kafka.md: an invalid setting is refused naming it and its table, [systems.NAME.config]
    # as [systems.NAME.consumer] (the system's own name, not always "kafka")
    (tmp_path / "t.py").write_text(
        "import tailrace\nclass T(tailrace.StreamTask):\n    def process(self, e, c, co): pass\n"
    )
    (tmp_path / "job.toml").write_text(
        f"""[job]
name = "k"
task = "t.py:T"
inputs = ["events.orders"]
[systems.events]
type = "kafka"
bootstrap_servers = "127.0.0.1:1"
[systems.events.{table}]
"session.timeout.ms" = "abc"
"""
    )
    with pytest.raises(ConfigError) as e:
        load_job(tmp_path)
    assert e.value.key == f"systems.events.{table}.session.timeout.ms", e.value
    assert str(tmp_path / "job.toml") in str(e.value) and "Invalid value" in str(e.value), e.value


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("consumer", "systems.events.consumer.max.poll.interval.ms"),
        ("config", "systems.events.config.max.poll.interval.ms"),
        (None, "task.shutdown.ms"),
    ],
)
def test_a_poll_interval_under_the_shutdown_wait_is_named_as_the_job_file_spells_it(
    tmp_path: Path, table: str | None, key: str
) -> None:
    # docs/kafka.md: max.poll.interval.ms must exceed task.shutdown.ms (checked at start);
    # the refusal names the key with its table and the job file, as every other option's
    import subprocess
    import sys

    (tmp_path / "t.py").write_text(
        "import tailrace\nclass T(tailrace.StreamTask):\n    def process(self, e, c, co): pass\n"
    )
    setting = (
        f'[systems.events.{table}]\n"max.poll.interval.ms" = 20000\n"session.timeout.ms" = 10000\n'
        if table
        else ""
    )
    shutdown = 30000 if table else 400000  # librdkafka's default poll interval: 300000
    (tmp_path / "job.toml").write_text(
        f"""[job]
name = "k"
task = "t.py:T"
inputs = ["events.orders"]
[config]
"task.shutdown.ms" = {shutdown}
[systems.events]
type = "kafka"
bootstrap_servers = "127.0.0.1:1"
{setting}"""
    )
    r = subprocess.run(
        [sys.executable, "-m", "tailrace", "run", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert f"{tmp_path / 'job.toml'}: config key {key!r}: max.poll.interval.ms (" in r.stderr, r.stderr
    assert "must exceed task.shutdown.ms" in r.stderr
