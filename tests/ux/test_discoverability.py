"""What a new user finds without reading the source (issue 38, item 9): a misspelled config key
or option names the closest allowed one, help(tailrace.Envelope) describes every attribute, and
the ``tailrace`` logger follows the library convention (a NullHandler)."""

from __future__ import annotations

import logging
import pydoc
import subprocess
import sys
from pathlib import Path

import pytest

import tailrace
from tailrace.jobfile import load_job


class Echo(tailrace.StreamTask):
    def process(self, envelope: object, collector: object, coordinator: object) -> None:
        pass


def _container(config: dict[str, object]) -> tailrace.Container:
    mem = tailrace.MemorySystem("mem").add_stream("in", [["x"]])
    return tailrace.Container(Echo, inputs=["mem.in"], systems=[mem], config=config)


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("task.max.concurency", "task.max.concurrency"),
        ("task.windw.ms", "task.window.ms"),
        ("task_commit_msec", "task_commit_ms"),  # a keyword: the keyword's spelling
        ("stores.counts.cache.sise", "stores.counts.cache.size"),
    ],
)
def test_a_misspelled_config_key_suggests_the_closest_allowed_one(key: str, suggestion: str) -> None:
    with pytest.raises(tailrace.ConfigError) as e:
        _container({key: 1})
    assert f"; did you mean {suggestion!r}? (allowed: " in str(e.value), str(e.value)
    assert e.value.key == key


def test_a_key_close_to_nothing_gets_no_suggestion() -> None:
    with pytest.raises(tailrace.ConfigError) as e:
        _container({"zebra": 1})
    assert "did you mean" not in str(e.value) and "unknown key (allowed: " in str(e.value)


def test_a_misspelled_option_or_job_key_suggests_too(tmp_path: Path) -> None:
    with pytest.raises(tailrace.ConfigError, match=r"did you mean 'output_path'\?"):
        tailrace.FileSystem("files", "data", outptu_path="out")
    root = tmp_path
    (root / "task.py").write_text("class T:\n    def process(self, e, c, k):\n        pass\n")
    (root / "job.toml").write_text('[job]\nname = "j"\ntask = "task:T"\ninptus = ["mem.in"]\n')
    with pytest.raises(
        tailrace.ConfigError, match=r"config key 'job\.inptus': unknown key; did you mean 'inputs'\?"
    ):
        load_job(root / "job.toml")


def test_help_of_envelope_describes_each_attribute() -> None:
    text = pydoc.render_doc(tailrace.Envelope, renderer=pydoc.plaintext)
    for name in ("system", "stream", "partition", "offset", "key", "message", "ssp"):
        assert getattr(tailrace.Envelope, name).__doc__, f"Envelope.{name} has no docstring"
        assert f"\n |  {name}\n |      " in text, f"help(Envelope) shows {name} without a description"
    assert "Attributes:" in (tailrace.Envelope.__doc__ or "")


def test_the_tailrace_logger_has_a_null_handler() -> None:
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("tailrace").handlers)


def test_an_application_without_logging_gets_no_stray_warnings_on_stderr() -> None:
    # the last-resort handler prints WARNING records of a library logger without handlers
    code = "import logging, tailrace; logging.getLogger('tailrace.x').warning('stray')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "stray" not in done.stderr, done.stderr
