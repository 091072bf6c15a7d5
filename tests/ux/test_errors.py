"""What a user sees when something is wrong: their code's frames and input line,
one-line environment errors (exit 2) that never advise destroying state, refused or
warned task classes, TOML and help-text pitfalls. Real processes throughout."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import tailrace
from tailrace.api import SEMANTICS

from .conftest import run_cli, tailrace_cmd, write_job

ENGINES = ["c", "python"]

FAILING_TASK = """
import tailrace


def user_of(message):
    return message["user"]


class Task(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("files.out", {"user": user_of(envelope.message)})
"""

FAILING_ASYNC_TASK = """
import asyncio

import tailrace


class Task(tailrace.AsyncStreamTask):
    async def process(self, envelope, collector, coordinator):
        await asyncio.sleep(0)
        collector.send("files.out", {"user": envelope.message["user"]})
"""


def clicks() -> list[list[dict[str, object]]]:
    good = [{"user": f"u{i}", "page": "/" * i} for i in range(20)]
    bad = list(good)
    bad[11] = {"page": "/nobody"}  # line 12 of partition 1
    return [good, bad]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("task", [FAILING_TASK, FAILING_ASYNC_TASK], ids=["sync", "async-def"])
def test_user_exception_names_input_line_and_shows_user_frames(
    engine: str, task: str, tmp_path: Path
) -> None:
    job = write_job(tmp_path, task=task, partitions=clicks())
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1, r.stderr
    data = (tmp_path / "data" / "in" / "partition-1.jsonl").read_bytes()
    offset = sum(len(line) for line in data.splitlines(keepends=True)[:11])
    err = r.stderr
    assert f"failed in process of files.in[1] at offset {offset}: KeyError: 'user'" in err
    assert f"input: {tmp_path / 'data' / 'in' / 'partition-1.jsonl'} line 12 (byte offset {offset})" in err
    task_py = tmp_path / "task.py"
    assert f'File "{task_py}", line ' in err
    assert 'message["user"]' in err  # the failing source line of the user's code
    if task is FAILING_TASK:
        assert ", in user_of" in err and ", in process" in err
    assert "--log-level DEBUG" in err
    # none of the engine's frames, no bare Python traceback
    assert "Traceback" not in err
    assert "_loop.pxi" not in err and "engine/reference.py" not in err and "/asyncio/" not in err
    shown = [line for line in err.splitlines() if line.startswith("    File ")]
    assert shown and all(str(task_py) in line for line in shown)
    # --log-level after the subcommand: DEBUG shows the full traceback, engine frames included
    full = run_cli(["run", str(job), "--engine", engine, "--no-progress", "--log-level", "DEBUG"])
    assert full.returncode == 1
    assert "Traceback (most recent call last)" in full.stderr
    assert "tailrace" in full.stderr.split("Traceback (most recent call last)", 1)[1]
    assert "run with --log-level DEBUG" not in full.stderr  # it is on: the traceback is above


def test_log_level_after_the_subcommand_and_version(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    quiet = run_cli(["run", str(job), "--no-progress", "--log-level", "WARNING"])
    assert quiet.returncode == 0, quiet.stderr
    assert " INFO " not in quiet.stderr
    loud = run_cli(["--log-level", "WARNING", "run", str(job), "--no-progress", "--log-level", "DEBUG"])
    assert loud.returncode == 0 and " INFO " in loud.stderr  # the later one wins
    before = run_cli(["--log-level", "WARNING", "checkpoints", "show", str(job)])
    assert before.returncode == 0 and " INFO " not in before.stderr
    v = run_cli(["--version"])
    assert v.returncode == 0 and v.stdout.strip() == f"tailrace {tailrace.__version__}"


# -- environment errors ----------------------------------------------------------------
def _as_other_user() -> list[str]:
    """A command prefix running the CLI as an unprivileged user (root ignores permissions)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permissions cannot be tested")
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    if not _can_import_as(tuple(prefix)):
        pytest.skip(
            f"an unprivileged user cannot import tailrace with {sys.executable} (the checkout or its "
            "venv lies under a directory only root can enter, e.g. one made by mktemp -d): "
            "permissions cannot be tested"
        )
    return prefix


@functools.cache
def _can_import_as(prefix: tuple[str, ...]) -> bool:
    r = subprocess.run([*prefix, sys.executable, "-c", "import tailrace"], capture_output=True, cwd="/")
    return r.returncode == 0


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A scratch directory an unprivileged user can read (pytest's tmp_path is 0700 under root)."""
    d = Path(tempfile.mkdtemp(prefix="tailrace-ux-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        for p in d.rglob("*"):
            if p.is_dir():
                os.chmod(p, 0o755)
        shutil.rmtree(d)


def _run_unprivileged(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_as_other_user(), *tailrace_cmd(*args)], capture_output=True, text=True, timeout=60, cwd="/"
    )


def _assert_one_clear_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("tailrace: ")]
    assert len(errors) == 1, r.stderr
    assert "Traceback" not in r.stderr
    text = errors[0].lower()
    for destructive in ("corrupt", "delete", "remove", "reset"):
        assert destructive not in text, r.stderr
    return errors[0]


def test_read_only_state_dir_with_a_good_store_is_not_called_corrupt(shared_dir: Path) -> None:
    job = write_job(shared_dir / "job", partitions=[[{"n": i} for i in range(5)]])
    first = run_cli(["run", str(job), "--no-progress"])
    assert first.returncode == 0, first.stderr
    state = shared_dir / "job" / "state"
    before = run_cli(["checkpoints", "show", str(job)]).stdout
    for p in [shared_dir / "job", *(shared_dir / "job").rglob("*")]:
        os.chmod(p, 0o555 if p.is_dir() else 0o444)
    try:
        for args in (["run", str(job), "--no-progress"], ["checkpoints", "show", str(job)]):
            line = _assert_one_clear_line(_run_unprivileged(args))
            assert f"state directory {state} is not writable" in line
            assert "intact" in line
    finally:
        for p in [shared_dir / "job", *(shared_dir / "job").rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
    assert run_cli(["checkpoints", "show", str(job)]).stdout == before  # nothing was changed


def test_missing_state_dir_that_cannot_be_created(shared_dir: Path) -> None:
    job = write_job(shared_dir / "job")
    os.chmod(shared_dir / "job", 0o555)
    line = _assert_one_clear_line(_run_unprivileged(["run", str(job), "--no-progress"]))
    assert f"cannot create the state directory {shared_dir / 'job' / 'state'} (Permission denied)" in line
    assert "[checkpoints] path" in line


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        (
            "import tailrace\nclass Task(tailrace.StreamTask):\n"
            "    def proces(self, envelope, collector, coordinator):\n        pass\n",
            "task class Task defines neither process() nor process_async() (nor async def process()); "
            "proces() looks like a misspelling of process()",
        ),
        (
            "class Task:\n    def procss(self, envelope, collector, coordinator):\n        pass\n",
            "procss() looks like a misspelling of process()",
        ),
        (
            "import tailrace\nclass Task(tailrace.AsyncStreamTask):\n"
            "    def process_asnc(self, envelope, collector, coordinator, callback):\n        pass\n",
            "process_asnc() looks like a misspelling of process_async()",
        ),
    ],
    ids=["stream-task", "plain-class", "async-task"],
)
def test_task_class_without_process_is_one_line_naming_the_class(
    source: str, needle: str, tmp_path: Path
) -> None:
    job = write_job(tmp_path, task=source)
    r = run_cli(["run", str(job), "--no-progress"])
    line = _assert_one_clear_line(r)
    assert needle in line and "job.task" in line and str(job) in line


# -- hooks -------------------------------------------------------------------------------
TYPO_TASK = """
import tailrace


class Task(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        pass

    def windw(self, collector, coordinator):
        raise AssertionError("never called")

    def end_of_steam(self, collector, coordinator):
        raise AssertionError("never called")

    def clse(self):
        pass

    def emit(self, collector):  # an ordinary helper: no warning
        pass
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_misspelled_hooks_are_warned_at_start_up(engine: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, task=TYPO_TASK, config='"task.window.ms" = 50')
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if " WARNING " in line]
    for typo, hook in (("windw", "window"), ("end_of_steam", "end_of_stream"), ("clse", "close")):
        assert any(f"method {typo}() looks like a misspelling of the hook {hook}()" in w for w in warnings)
    assert not any("emit" in w for w in warnings)
    assert len(warnings) == 3, warnings  # once per class, not once per task


WINDOW_TASK = """
import tailrace


class Task(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        pass

    def window(self, collector, coordinator):
        pass
"""


def test_window_without_a_window_period_is_warned(tmp_path: Path) -> None:
    job = write_job(tmp_path, task=WINDOW_TASK)
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "task class Task defines window(), which never runs: task.window.ms is -1 (disabled)" in r.stderr
    on = run_cli(["run", str(job), "--no-progress", "--config", "task.window.ms=100"])
    assert on.returncode == 0 and "never runs" not in on.stderr


def test_examples_start_without_hook_warnings(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    for name in ("wordcount", "enrichment"):
        dest = tmp_path / name
        skip = shutil.ignore_patterns("output", "state", "__pycache__")
        shutil.copytree(examples / name, dest, ignore=skip)
        r = run_cli(["run", str(dest), "--no-progress"])
        assert r.returncode == 0, r.stderr
        assert "misspelling" not in r.stderr and "never runs" not in r.stderr


# -- small things ------------------------------------------------------------------------
def test_unquoted_dotted_config_key_says_to_quote_it(tmp_path: Path) -> None:
    job = write_job(tmp_path, config="task.window.ms = 1000")
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2
    assert (
        "config key 'task.window.ms': [config] keys contain dots, so they must be quoted: "
        'write "task.window.ms" = 1000' in r.stderr
    )


def test_help_does_not_offer_job_name_as_a_config_key() -> None:
    r = run_cli(["--help"])
    assert r.returncode == 0
    table = [line for line in r.stdout.splitlines() if re.match(r"^  [a-z_.]+\s+default ", line)]
    assert table and not any(line.split()[0] == "job.name" for line in table)
    assert "[job] name" in r.stdout
    run_help = run_cli(["run", "--help"]).stdout
    assert not re.search(r"^  job\.name\s+default", run_help, re.M)


def test_an_unknown_key_in_config_does_not_offer_job_name(tmp_path: Path) -> None:
    # [config] refuses job.name ("set the job name in [job] name"): its unknown-key error
    # must not list it among the allowed keys
    job = write_job(tmp_path, config='"task.max.concurency" = 2')
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2
    allowed = re.search(
        r"config key 'task\.max\.concurency': unknown key; "
        r"did you mean 'task\.max\.concurrency'\? \(allowed: (.*)\)$",
        r.stderr,
        re.M,
    )
    assert allowed, r.stderr
    offered = allowed.group(1).split(", ")
    assert "job.name" not in offered and "task.max.concurrency" in offered, offered
    job = write_job(tmp_path, config='"job.name" = "x"')
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2 and "config key 'job.name': set the job name in [job] name" in r.stderr


def test_help_gives_every_store_option_its_default() -> None:
    # running-jobs.md: tailrace --help lists every config key with its default
    r = run_cli(["--help"])
    assert r.returncode == 0
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  stores.NAME.")}
    assert sorted(lines) == ["stores.NAME.cache.size", "stores.NAME.key.serde", "stores.NAME.value.serde"]
    assert "default 'json': " in lines["stores.NAME.key.serde"], lines
    assert "default 'json': " in lines["stores.NAME.value.serde"], lines
    assert "default 100000: " in lines["stores.NAME.cache.size"], lines


def test_semantics_cited_by_docstrings_ships_with_the_package() -> None:
    repo_doc = Path(__file__).resolve().parents[2] / "docs" / "SEMANTICS.md"
    assert SEMANTICS.is_file(), "tailrace/SEMANTICS.md is not installed"
    assert SEMANTICS.read_text() == repo_doc.read_text()
    assert "docs/SEMANTICS.md" in (tailrace.api.__doc__ or "")


def test_json_of_help_round_trip() -> None:  # the config table stays machine-checkable
    r = run_cli(["run", "--help"])
    assert json.dumps(r.stdout)  # printable, no control characters
    assert "\x1b" not in r.stdout


def test_library_use_of_a_read_only_good_store_is_not_called_corrupt(shared_dir: Path) -> None:
    """The store itself (not only the CLI's pre-check) never gives advice that destroys state."""
    job = write_job(shared_dir / "job", partitions=[[{"n": i} for i in range(5)]])
    assert run_cli(["run", str(job), "--no-progress"]).returncode == 0
    db = next((shared_dir / "job" / "state").glob("*.db"))
    for p in [shared_dir / "job", *(shared_dir / "job").rglob("*")]:
        os.chmod(p, 0o555 if p.is_dir() else 0o444)
    code = (
        "import sys, tailrace\n"
        "try:\n"
        f"    tailrace.SqliteCheckpointStore({str(db)!r}).open('j')\n"
        "except tailrace.TailraceError as e:\n"
        "    print(e)\n"
        "    sys.exit(3)\n"
    )
    try:
        done = subprocess.run(
            [*_as_other_user(), sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    finally:
        for p in [shared_dir / "job", *(shared_dir / "job").rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
    assert done.returncode == 3, done.stderr
    message = done.stdout.lower()
    assert "not writable by this user" in message and "intact" in message, message
    assert "corrupt" not in message and "delete" not in message, message
