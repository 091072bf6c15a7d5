"""The tailrace CLI, run as real subprocesses: examples end to end, restarts, errors, tools."""

from __future__ import annotations

import importlib.metadata
import json
import re
import runpy
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tailrace.config import KEYS
from tailrace.files import read_stream

from .conftest import EXAMPLES, run_cli, tailrace_cmd


def copy_example(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(EXAMPLES / name, dest, ignore=shutil.ignore_patterns("output", "state", "__pycache__"))
    return dest


def test_help_lists_commands_and_config_keys() -> None:
    r = run_cli(["--help"])
    assert r.returncode == 0
    for word in ("run", "checkpoints"):
        assert word in r.stdout
    for key in KEYS:
        assert key.name in r.stdout
    r = run_cli(["run", "--help"])
    assert r.returncode == 0 and "--engine" in r.stdout and "--metrics-port" in r.stdout
    assert "task.max.concurrency" in r.stdout
    r = run_cli(["checkpoints", "reset", "--help"])
    assert r.returncode == 0 and "--yes" in r.stdout


@pytest.mark.parametrize("command", [[], ["run"], ["checkpoints", "reset"], ["load"]])
def test_help_is_wrapped_to_the_terminal_width(command: list[str]) -> None:
    narrow = run_cli([*command, "--help"], env={"COLUMNS": "60"})
    wide = run_cli([*command, "--help"], env={"COLUMNS": "200"})
    assert narrow.returncode == wide.returncode == 0
    assert narrow.stdout != wide.stdout
    assert " ".join(narrow.stdout.split()) == " ".join(wide.stdout.split())  # the same words


@pytest.mark.parametrize("columns", ["60", "200", "", "0", "junk", None])
def test_help_width_is_what_argparse_would_ask_the_terminal(
    columns: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the CLI computes argparse's width once, as shutil.get_terminal_size does (COLUMNS,
    # else the terminal, else 80), instead of importing shutil and asking per argument
    from tailrace import cli

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    cli._help_width.cache_clear()
    try:
        assert cli._help_width() == shutil.get_terminal_size().columns - 2
    finally:
        cli._help_width.cache_clear()


def expected_word_counts(job: Path) -> dict[int, Counter[str]]:
    import re

    counts = {}
    for f in sorted((job / "data" / "lines").iterdir()):
        p = int(f.stem.split("-")[1])
        counts[p] = Counter(re.findall(r"[a-z']+", f.read_text().lower()))
    return counts


def test_wordcount_example_end_to_end_and_restart(engine: str, tmp_path: Path) -> None:
    job = copy_example("wordcount", tmp_path)
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "finished (end_of_stream)" in r.stdout
    assert "13 messages processed" in r.stdout
    assert "Partition 2: 85 words, top: the 11" in r.stdout
    # the newest line per (task, word) is the final count; compare with a count done here
    final: dict[tuple[str, str], int] = {}
    for part in read_stream(job / "output" / "counts"):
        for rec in part:
            final[(rec["task"], rec["word"])] = rec["count"]
    for p, counts in expected_word_counts(job).items():
        got = {w: n for (t, w), n in final.items() if t == f"Partition {p}"}
        assert got == dict(counts)
    # restart: every partition resumes after its checkpoint, nothing is processed again
    r2 = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r2.returncode == 0, r2.stderr
    assert "resuming from checkpoint: files.lines[0] after" in r2.stderr
    assert "0 messages processed" in r2.stdout
    assert "Partition 0: no new lines since the last checkpoint" in r2.stdout
    shown = run_cli(["checkpoints", "show", str(job / "job.toml")])
    assert shown.returncode == 0
    sizes = {p: (job / "data" / "lines" / f"partition-{p}.txt").read_bytes() for p in range(3)}
    for p, raw in sizes.items():
        last_line_start = raw.rstrip(b"\n").rfind(b"\n") + 1
        assert f"files.lines[{p}]               {last_line_start}" in shown.stdout
    # reset: the next run starts from the beginning again
    assert run_cli(["checkpoints", "reset", str(job)]).returncode == 2  # no --yes, no terminal
    reset = run_cli(["checkpoints", "reset", str(job), "--yes"])
    assert reset.returncode == 0 and "deleted 3 checkpoint rows" in reset.stdout
    r3 = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert "13 messages processed" in r3.stdout


def test_enrichment_example_end_to_end(engine: str, tmp_path: Path) -> None:
    job = copy_example("enrichment", tmp_path)
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "80 messages processed" in r.stdout
    assert "revenue by customer tier: bronze" in r.stdout
    customers = runpy.run_path(str(job / "enrichment.py"))["CUSTOMERS"]  # the lookup table the job used

    outputs = read_stream(job / "output" / "enriched")
    for p, part in enumerate(outputs):
        orders = [
            json.loads(line)
            for line in (job / "data" / "orders" / f"partition-{p}.jsonl").read_text().splitlines()
        ]
        assert sorted(o["order_id"] for o in part) == sorted(
            o["order_id"] for o in orders
        )  # none lost or doubled
        by_id = {o["order_id"]: o for o in orders}
        for o in part:
            c = customers[o["customer_id"]]
            assert o == dict(by_id[o["order_id"]], customer=c["name"], tier=c["tier"])


def write_job(tmp_path: Path, extra: str = "", config: str = "", lines: str = '{"a": 1}\n{"a": 2}\n') -> Path:
    (tmp_path / "data" / "in").mkdir(parents=True, exist_ok=True)
    (tmp_path / "data" / "in" / "partition-0.jsonl").write_text(lines)
    (tmp_path / "copy.py").write_text(
        "import tailrace\n"
        "class Copy(tailrace.StreamTask):\n"
        "    def process(self, envelope, collector, coordinator):\n"
        "        collector.send('files.out', envelope.message)\n"
    )
    (tmp_path / "job.toml").write_text(
        f"""
[job]
name = "copy"
task = "copy.py:Copy"
inputs = ["files.in"]
{extra}
[config]
{config}
[systems.files]
type = "file"
path = "data"
[checkpoints]
type = "sqlite"
path = "state/cp.db"
"""
    )
    return tmp_path / "job.toml"


def test_a_run_keeps_start_up_from_its_collections_and_imports_only_what_it_uses(tmp_path: Path) -> None:
    # start-up's objects are frozen while the job runs (its collections then scan only
    # the run's objects) and unfrozen when main() returns in-process; and a JSON job
    # imports no serde or tool it does not use (each import is CPU every run pays; hashlib
    # loads OpenSSL, though the run still records file fingerprints and SQLite lock bytes)
    job = write_job(tmp_path)
    (tmp_path / "copy.py").write_text(
        "import gc\n"
        "import tailrace\n"
        "class Copy(tailrace.StreamTask):\n"
        "    def process(self, envelope, collector, coordinator):\n"
        "        collector.send('files.out', {'frozen': gc.get_freeze_count()})\n"
    )
    script = (
        "import gc, sys\n"
        "from tailrace.cli import main\n"
        f"code = main(['run', {str(job)!r}, '--no-progress'])\n"
        "unused = [m for m in ('pickle', 'msgpack', 'subprocess', 'difflib', 'shutil', 'sysconfig',"
        " 'hashlib') if m in sys.modules]\n"
        "print('RESULT', code, gc.get_freeze_count(), unused)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "RESULT 0 0 []"
    frozen = [m["frozen"] for part in read_stream(tmp_path / "data" / "out") for m in part]
    assert len(frozen) == 2 and all(n > 1000 for n in frozen), frozen


@pytest.mark.parametrize(
    ("config", "extra", "override", "needle"),
    [
        (
            '"task.max.concurency" = 2',
            "",
            None,
            "config key 'task.max.concurency': unknown key; did you mean 'task.max.concurrency'? (allowed:",
        ),
        ('"task.max.concurrency" = 0', "", None, "config key 'task.max.concurrency': 0 is out of range"),
        ('"task.window.ms" = "soon"', "", None, "config key 'task.window.ms': expected an integer"),
        ("", 'engine = "java"', None, "config key 'job.engine': unknown engine 'java' (allowed: c, python)"),
        ("", 'colour = "blue"', None, "config key 'job.colour': unknown key (allowed: name, task"),
        ("", "", "task.commit.ms=fast", "config key 'task.commit.ms': expected an integer"),
        ("", "", "systems.files.type=ftp", "config key 'systems.files.type': unknown system type 'ftp'"),
        ("", "", "systems.files.skip_bad_lines=maybe", "systems.files.skip_bad_lines"),
        ("", "", "nonsense.key=1", "config key 'nonsense.key': unknown key given with --config"),
    ],
)
def test_config_errors_name_key_file_and_allowed_values(
    tmp_path: Path, config: str, extra: str, override: str | None, needle: str
) -> None:
    job = write_job(tmp_path, extra=extra, config=config)
    args = ["run", str(job), "--engine", "python", "--no-progress"]
    if override:
        args += ["--config", override]
    r = run_cli(args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    if not override or override.startswith("systems."):
        assert str(job) in r.stderr or "--config" in r.stderr


def _has_redis_py() -> bool:
    # by its distribution: a tests/redis directory on sys.path would satisfy find_spec("redis")
    try:
        importlib.metadata.version("redis")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _has_redis_py(), reason="redis-py is not installed")
def test_an_option_of_a_table_is_named_with_its_table(tmp_path: Path) -> None:
    # an option a system or checkpoint store refuses is named as the job file spells it
    job = write_job(tmp_path)
    job.write_text(
        job.read_text().replace('type = "sqlite"\npath = "state/cp.db"', 'type = "redis"\nurl = "http://x"')
    )
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2, r.stderr
    assert "config key 'checkpoints.url': 'http://x' is not a Redis URL" in r.stderr


def test_config_mistakes_found_only_when_used_are_still_config_errors(tmp_path: Path) -> None:
    # running-jobs.md: mistakes stop the job naming the key, with exit status 2, not as a
    # failure of the user's code. An unknown default_output is refused before anything runs
    job = write_job(tmp_path, extra='default_output = "nosuch"')
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2, r.stderr
    assert "config key 'job.default_output'" in r.stderr and "'nosuch'" in r.stderr, r.stderr
    assert "allowed: files" in r.stderr, r.stderr
    # an output directory that holds more partitions than output_partitions is found at
    # the first send to it: still a config error naming the key, exit 2
    job = write_job(tmp_path)
    three = ["--config", "systems.files.output_partitions=3"]
    assert run_cli(["run", str(job), "--no-progress", *three]).returncode == 0
    for p in range(3):
        (tmp_path / "data" / "out" / f"partition-{p}.jsonl").touch()
    shutil.rmtree(tmp_path / "state")  # a fresh run over the same output directory
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2, r.stderr
    assert "tailrace: config error: config key 'systems.files.output_partitions'" in r.stderr, r.stderr
    assert "in your code" not in r.stderr


def test_an_unknown_option_of_a_system_or_store_is_named_with_the_options_allowed(tmp_path: Path) -> None:
    # a misspelt option is refused before anything runs: its key, and what the table takes
    job = write_job(tmp_path)
    text = job.read_text()
    job.write_text(text.replace('path = "data"', 'path = "data"\nskip_bad_line = true'))
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2, r.stderr
    assert "config key 'systems.files.skip_bad_line': unknown option 'skip_bad_line'" in r.stderr, r.stderr
    assert "skip_bad_lines" in r.stderr and "output_partitions" in r.stderr, r.stderr
    job.write_text(text.replace('path = "state/cp.db"', 'pth = "state/cp.db"'))
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2, r.stderr
    assert (
        "config key 'checkpoints.pth': unknown option 'pth'; did you mean 'path'? (allowed: type, path)"
        in r.stderr
    ), r.stderr


def test_a_bad_value_given_with_config_is_said_to_come_from_config(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    r = run_cli(["run", str(job), "--no-progress", "--config", "task.window.ms=abc"])
    assert r.returncode == 2, r.stderr
    assert "config error: --config task.window.ms='abc' (over " in r.stderr, r.stderr
    assert "config key 'task.window.ms': expected an integer" in r.stderr, r.stderr
    for bad in ("0", "-1", "soon"):
        r = run_cli(["run", str(job), "--progress-interval", bad])
        assert r.returncode == 2 and "argument --progress-interval: expected a number of seconds" in r.stderr


@pytest.mark.parametrize(
    ("override", "extra", "needle"),
    [
        (["job.task=copy.py:Nope"], [], "config key 'job.task': copy.py defines no 'Nope'"),
        (["job.task=nosuch.py:X"], [], "config key 'job.task': task file "),
        (["job.task=bad.py:Bad"], [], "config key 'job.task': task class Bad defines neither process()"),
        (
            ["systems.nosys.path=x"],
            [],
            "config key 'systems.nosys.path': the job file has no [systems.nosys] table (its systems: files)",
        ),
        (
            ["systems.files.output_format=msgpack"],
            ["--containers", "2"],
            "config key 'systems.files.output_format': ",
        ),
    ],
)
def test_an_error_a_config_override_causes_names_the_override_not_the_job_file(
    tmp_path: Path, override: list[str], extra: list[str], needle: str
) -> None:
    # errors found after the job file was read (the task, the --containers checks) and a
    # table made by --config alone were blamed on job.toml
    job = write_job(tmp_path)
    (tmp_path / "bad.py").write_text(
        "class Bad:\n    def proces(self, envelope, collector, coordinator): ...\n"
    )
    (key, _, value) = override[0].partition("=")
    r = run_cli(["run", str(job), "--no-progress", "--config", override[0], *extra])
    assert r.returncode == 2, r.stderr
    assert f"tailrace: config error: --config {key}='{value}' (over {job}): {needle}" in r.stderr, r.stderr


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_period_past_a_32_bit_int_is_a_config_error_before_any_state_is_made(
    engine: str, tmp_path: Path
) -> None:
    # a huge negative period once passed validation: the C engine failed with an
    # OverflowError traceback (exit 1, state/ made), the Python engine took it as given
    job = write_job(tmp_path)
    r = run_cli(
        [
            "run",
            str(job),
            "--engine",
            engine,
            "--no-progress",
            "--config",
            "task.window.ms=-99999999999999999999",
        ]
    )
    assert r.returncode == 2, r.stderr
    assert (
        "config key 'task.window.ms': -99999999999999999999 is out of range "
        "(allowed: an integer from -2147483648 to 2147483647; <= 0 disables)" in r.stderr
    ), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "state").exists()


def test_checkpoints_are_sqlite_when_only_their_path_is_given(tmp_path: Path) -> None:
    # running-jobs.md: [checkpoints] is optional, type = "sqlite" its default, and --config
    # overrides any job file entry: a path alone (in the file or with --config) is a sqlite store
    job = write_job(tmp_path)
    text = job.read_text()
    job.write_text(text.replace('[checkpoints]\ntype = "sqlite"\npath = "state/cp.db"\n', ""))
    r = run_cli(["run", str(job), "--no-progress", "--config", "checkpoints.path=state/other.db"])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "state" / "other.db").is_file() and not (
        tmp_path / "state" / "checkpoints.db"
    ).exists()
    job.write_text(text.replace('type = "sqlite"\npath = "state/cp.db"', 'path = "state/cp.db"'))
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "state" / "cp.db").is_file()
    r = run_cli(["checkpoints", "show", str(job)])
    assert r.returncode == 0 and "files.in" in r.stdout, (r.stdout, r.stderr)


def test_checkpoints_show_of_a_job_that_never_ran_creates_nothing(tmp_path: Path) -> None:
    # a read-only command: it made the job's state/ directory
    job = copy_example("wordcount", tmp_path)
    before = sorted(p.relative_to(job) for p in job.rglob("*"))
    shown = run_cli(["checkpoints", "show", str(job)])
    assert shown.returncode == 0, shown.stderr
    assert sorted(p.relative_to(job) for p in job.rglob("*")) == before
    db = job / "state" / "checkpoints.db"
    assert shown.stdout.splitlines()[1:] == [
        f"  no checkpoint store yet: {db} does not exist (no run has created it)",
        "  no checkpoints: the next run starts every input from the beginning",
    ]


def test_checkpoints_reset_of_a_job_that_never_ran_creates_nothing(tmp_path: Path) -> None:
    # it made state/ and an empty checkpoint database to delete nothing from
    job = copy_example("wordcount", tmp_path)
    before = sorted(p.relative_to(job) for p in job.rglob("*"))
    reset = run_cli(["checkpoints", "reset", "--yes", str(job)])
    assert reset.returncode == 0, reset.stderr
    assert sorted(p.relative_to(job) for p in job.rglob("*")) == before
    db = job / "state" / "checkpoints.db"
    said = f"nothing to delete: {db} does not exist (no run of job 'wordcount' has created it)"
    assert reset.stdout.strip() == said


def test_checkpoints_show_and_reset_take_the_config_overrides_of_the_run(tmp_path: Path) -> None:
    # running-jobs.md suggests --config job.name=test-run: its checkpoints could be neither
    # shown nor reset (show and reset refused --config)
    job = write_job(tmp_path)
    test_run = ["--config", "job.name=test-run", "--config", "checkpoints.path=state/test.db"]
    assert run_cli(["run", str(job), "--no-progress", *test_run]).returncode == 0
    shown = run_cli(["checkpoints", "show", str(job), *test_run])
    assert shown.returncode == 0, shown.stderr
    assert f"job 'test-run', checkpoints: sqlite {tmp_path / 'state' / 'test.db'}" in shown.stdout, (
        shown.stdout
    )
    assert re.search(r"files\.in\[0\] +9\n", shown.stdout), shown.stdout
    reset = run_cli(["checkpoints", "reset", str(job), "--yes", *test_run])
    assert reset.returncode == 0, reset.stderr
    assert "deleted 1 checkpoint row of job 'test-run'" in reset.stdout, reset.stdout
    shown = run_cli(
        ["checkpoints", "show", str(job), "-c", "job.name=test-run", "-c", "checkpoints.path=state/test.db"]
    )
    assert "no checkpoints: the next run starts every input from the beginning" in shown.stdout, shown.stdout
    assert not (tmp_path / "state" / "cp.db").exists()  # the job file's own store was never touched


def test_missing_job_and_bad_toml(tmp_path: Path) -> None:
    r = run_cli(["run", str(tmp_path)])
    assert r.returncode == 2 and "directory has no job.toml" in r.stderr
    (tmp_path / "job.toml").write_text("[job\n")
    r = run_cli(["run", str(tmp_path)])
    assert r.returncode == 2 and "job.toml: not valid TOML" in r.stderr


def test_a_job_file_that_is_not_utf8_is_a_config_error_naming_where(tmp_path: Path) -> None:
    # TOML is UTF-8: a Latin-1 byte (0xE9, "é") in a comment is one line naming the file and
    # where the byte is, exit 2, for every command that reads the job (not a traceback)
    job = write_job(tmp_path)
    job.write_bytes(b"# caf\xe9\n" + job.read_bytes())
    for args in (["run", str(job), "--no-progress"], ["checkpoints", "show", str(job)]):
        r = run_cli(args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"tailrace: config error: {job}: not valid UTF-8 (TOML files must be): byte 0xe9 at line 1, "
            "column 6 (byte offset 5)"
        ], r.stderr
    # a task file with such a byte where Python reads it is a config error naming it too
    job = write_job(tmp_path)
    (tmp_path / "copy.py").write_bytes(b'NAME = "caf\xe9"\n' + (tmp_path / "copy.py").read_bytes())
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2, r.stderr
    assert f"tailrace: config error: {tmp_path / 'copy.py'}: cannot load: SyntaxError" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_file_system_option_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    for option, value in (("path", "5"), ("output_path", "[1]")):
        r = run_cli(["run", str(job), "--no-progress", "--config", f"systems.files.{option}={value}"])
        assert r.returncode == 2, r.stderr
        assert f"config key 'systems.files.{option}': expected a directory path (a string), got" in r.stderr


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--metrics-port", "70000"],
            "argument --metrics-port: expected a port number from 0 to 65535, got '70000'",
        ),
        (
            ["--metrics-port", "-1"],
            "argument --metrics-port: expected a port number from 0 to 65535, got '-1'",
        ),
        (
            ["--metrics-port", "http"],
            "argument --metrics-port: expected a port number from 0 to 65535, got 'http'",
        ),
        (
            ["--containers", "2", "--metrics-port", "65535"],
            "config key '--metrics-port': 65535 leaves no port for container 1 of 2 (--containers 2: "
            "container i serves on PORT+i, up to 65536) (allowed: 0 (a free port each) or 1 to 65534)",
        ),
    ],
)
def test_a_metrics_port_out_of_range_is_a_usage_error(tmp_path: Path, argv: list[str], needle: str) -> None:
    # refused before anything runs (no traceback from bind, no container failing with 70)
    job = write_job(tmp_path)
    r = run_cli(["run", str(job), "--no-progress", *argv])
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "data" / "out").exists()


def test_a_metrics_port_range_past_the_last_port_is_refused_for_the_config_count_too(tmp_path: Path) -> None:
    job = write_job(tmp_path, config='"job.container.count" = 3')
    r = run_cli(["run", str(job), "--no-progress", "--metrics-port", "65534"])
    assert r.returncode == 2, r.stderr
    assert "65534 leaves no port for container 2 of 3 (job.container.count 3: " in r.stderr, r.stderr


def test_metrics_port_0_gives_each_container_a_free_port(tmp_path: Path) -> None:
    # PORT+i would be ports 0, 1, ...: port 0 is "any free port", for every container
    pytest.importorskip("prometheus_client")
    job = write_job(tmp_path)
    (tmp_path / "data" / "in" / "partition-1.jsonl").write_text('{"a": 3}\n')
    argv = ["--containers", "2", "--metrics-port", "0", "--metrics-host", "127.0.0.1"]
    r = run_cli(["run", str(job), "--no-progress", *argv])
    assert r.returncode == 0, r.stderr
    ports = [int(p) for p in re.findall(r"Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics", r.stderr)]
    assert len(ports) == 2 and len(set(ports)) == 2 and min(ports) > 1024, r.stderr


def test_the_config_option_help_names_every_table_it_overrides() -> None:
    r = run_cli(["run", "--help"])
    assert r.returncode == 0
    found = re.search(r"override a config key \(([^)]*)\)", " ".join(r.stdout.split()))
    assert found, r.stdout
    for table in ("job.*", "systems.<name>.*", "stores.<name>.*", "checkpoints.*"):
        assert table in found.group(1), found.group(1)


def test_bad_input_line_stops_the_job_naming_file_and_line(engine: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, lines='{"a": 1}\n{"a": 2}\n{"a": \n{"a": 4}\n')
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1
    assert "data/in/partition-0.jsonl:3: line is not valid JSON" in r.stderr
    assert "skip_bad_lines" in r.stderr


def test_the_lines_before_a_bad_one_are_processed_and_committed_first(engine: str, tmp_path: Path) -> None:
    # bad input stops the job after every line before it is processed and committed (rule
    # 18: never past the bad line), and the error names the partition and offset too: the
    # line fixed in place, the next run resumes exactly at it (nothing lost, no duplicate)
    job = write_job(tmp_path, lines='{"a": 1}\n{"a": 2}\n{"a": x}\n{"a": 4}\n')
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1, r.stderr
    assert "data/in/partition-0.jsonl:3: line is not valid JSON" in r.stderr
    assert "partition files.in[0], offset 18" in r.stderr, r.stderr
    out = tmp_path / "data" / "out" / "partition-0.jsonl"  # (outputs go next to the inputs by default)
    assert [json.loads(x) for x in out.read_text().splitlines()] == [{"a": 1}, {"a": 2}]
    shown = run_cli(["checkpoints", "show", str(job)])
    assert re.search(r"files\.in\[0\] +9\n", shown.stdout), shown.stdout  # line 2 starts at byte 9
    data = tmp_path / "data" / "in" / "partition-0.jsonl"
    data.write_text(data.read_text().replace('{"a": x}', '{"a": 3}'))
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["a"] for x in out.read_text().splitlines()] == [1, 2, 3, 4]


def test_skip_bad_lines_is_counted_in_the_summary(engine: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, lines='{"a": 1}\nnope\n{"a": 3}\n[broken\n')
    r = run_cli(
        [
            "run",
            str(job),
            "--engine",
            engine,
            "--no-progress",
            "--config",
            "systems.files.skip_bad_lines=true",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert "2 messages processed" in r.stdout and "2 bad lines skipped" in r.stdout
    assert "partition-0.jsonl:2: skipped a line that is not valid JSON" in r.stderr
    assert read_stream(tmp_path / "data" / "out") == [[{"a": 1}, {"a": 3}]]


def test_summaries_say_1_message_and_1_bad_line_in_the_singular(tmp_path: Path) -> None:
    # "1 messages processed", "1 bad lines skipped", "container 0: 1 messages in"
    job = write_job(tmp_path, lines='{"a": 1}\nnope\n')
    skip = ["--config", "systems.files.skip_bad_lines=true"]
    r = run_cli(["run", str(job), "--no-progress", *skip])
    assert r.returncode == 0, r.stderr
    assert ": 1 message processed (" in r.stdout and "\n  1 bad line skipped\n" in r.stdout, r.stdout
    shutil.rmtree(tmp_path / "state")
    shutil.rmtree(tmp_path / "data" / "out")
    r = run_cli(["run", str(job), "--no-progress", "--containers", "2", *skip])
    assert r.returncode == 0, r.stderr
    assert "the job has 1 task: container 1 would have none and is not started" in r.stderr, r.stderr
    assert "container 0: 1 message in " in r.stderr, r.stderr
    assert ": 1 message processed (" in r.stdout and "by 1 container\n" in r.stdout, r.stdout
    assert "\n  1 bad line skipped\n" in r.stdout, r.stdout
    reset = run_cli(["checkpoints", "reset", str(job), "--yes"])
    assert reset.returncode == 0 and "deleted 1 checkpoint row of job 'copy'" in reset.stdout, reset.stdout


def test_partition_gap_is_an_error(engine: str, tmp_path: Path) -> None:
    job = write_job(tmp_path)
    (tmp_path / "data" / "in" / "partition-2.jsonl").write_text("1\n")
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1
    assert "partition gap: partition-1.jsonl missing" in r.stderr
    assert not (tmp_path / "state").exists()  # refused before the run made anything


def test_a_missing_input_stream_directory_is_a_config_error_naming_the_input(tmp_path: Path) -> None:
    # running-jobs.md: a misspelt input (its directory does not exist) is a configuration
    # error, exit 2; it exited 1 as bad input, and left an empty state/ behind
    job = write_job(tmp_path)
    job.write_text(job.read_text().replace('inputs = ["files.in"]', 'inputs = ["files.inn"]'))
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 2, r.stderr
    assert (
        f"tailrace: config error: {job}: config key 'job.inputs': input 'files.inn': its stream "
        f"directory {tmp_path / 'data' / 'inn'} does not exist (allowed: files.in)" in r.stderr
    ), r.stderr
    r = run_cli(
        [
            "run",
            str(job),
            "--no-progress",
            "--config",
            'job.inputs=["files.in"]',
            "--config",
            "systems.files.path=nodata",
        ]
    )
    assert r.returncode == 2, r.stderr
    assert (
        f"config key 'systems.files.path': input 'files.in': the input directory {tmp_path / 'nodata'} "
        "of system 'files' does not exist" in r.stderr
    ), r.stderr
    assert not (tmp_path / "state").exists()


def test_a_run_refused_before_it_starts_creates_no_state_directory(tmp_path: Path) -> None:
    # --metrics-port without prometheus-client is refused after the job was loaded: the
    # state/ directory was made already
    job = write_job(tmp_path)
    blocked = tmp_path / "blocked"
    (blocked / "prometheus_client").mkdir(parents=True)
    (blocked / "prometheus_client" / "__init__.py").write_text("raise ImportError('not installed')\n")
    r = run_cli(["run", str(job), "--no-progress", "--metrics-port", "0"], env={"PYTHONPATH": str(blocked)})
    assert r.returncode == 2, r.stderr
    assert "--metrics-port needs prometheus-client" in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "state" / "cp.db").is_file()


def test_corrupt_store_stops_start_up(engine: str, tmp_path: Path) -> None:
    job = write_job(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "cp.db").write_bytes(b"garbage" * 1000)
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1
    assert "cp.db is corrupt or not a SQLite database" in r.stderr
    assert not (tmp_path / "data" / "out").exists()  # nothing ran from offset 0


def test_a_corrupt_store_is_left_in_one_step_as_its_message_says(tmp_path: Path) -> None:
    # issue 38, item 3: deleting the database alone left its marker (a second error asked
    # for it) and its -wal file; the one message names every file, run and reset alike
    import shlex

    job = write_job(tmp_path)
    assert run_cli(["run", str(job), "--no-progress"]).returncode == 0
    db = tmp_path / "state" / "cp.db"
    assert (tmp_path / "state" / "cp.db.generation").exists()
    db.write_bytes(b"garbage" * 1000)
    run = run_cli(["run", str(job), "--no-progress"])
    reset = run_cli(["checkpoints", "reset", str(job), "--yes"])
    assert run.returncode == reset.returncode == 1, (run.stderr, reset.stderr)
    commands = []
    for r in (run, reset):
        found = re.search(r"rm -f -- (.*)$", r.stderr.strip())
        assert found, r.stderr
        commands.append(found.group(1))
    assert commands[0] == commands[1]
    named = shlex.split(commands[0])
    assert sorted(Path(f).name for f in named) == ["cp.db", "cp.db-shm", "cp.db-wal", "cp.db.generation"]
    for f in named:
        Path(f).unlink(missing_ok=True)
    r = run_cli(["run", str(job), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "2 messages processed" in r.stdout, r.stdout  # from the beginning, in one step


def test_show_lists_each_task_s_stores_and_reset_says_what_state_it_deletes(tmp_path: Path) -> None:
    # issue 38, item 7: reset said "deleted 3 checkpoint rows" and deleted every state entry
    # too; show said nothing of stores
    job = copy_example("wordcount", tmp_path)
    assert run_cli(["run", str(job), "--no-progress"]).returncode == 0
    words = {p: set(re.findall(r"[a-z']+", f.read_text().lower())) for p, f in _partition_files(job)}
    shown = run_cli(["checkpoints", "show", str(job)])
    assert shown.returncode == 0, shown.stderr
    for p, distinct in words.items():
        assert re.search(rf"^  Partition {p}\s+counts\s+{len(distinct)}$", shown.stdout, re.M), shown.stdout
    reset = run_cli(["checkpoints", "reset", str(job), "--yes"])
    assert reset.returncode == 0, reset.stderr
    total = sum(len(d) for d in words.values())
    assert f"deleted 3 checkpoint rows of job 'wordcount' (committed offsets and {total} state entries" in (
        reset.stdout
    ), reset.stdout
    assert "'counts' (" in reset.stdout, reset.stdout
    plain = write_job(tmp_path / "plain")
    assert run_cli(["run", str(plain), "--no-progress"]).returncode == 0
    shown = run_cli(["checkpoints", "show", str(plain)])
    assert "no state stores" in shown.stdout, shown.stdout
    reset = run_cli(["checkpoints", "reset", str(plain), "--yes"])
    assert "(committed offsets; it keeps no state)" in reset.stdout, reset.stdout


def _partition_files(job: Path) -> list[tuple[int, Path]]:
    return [(int(f.stem.split("-")[1]), f) for f in sorted((job / "data" / "lines").iterdir())]


def test_python_job_file(engine: str, tmp_path: Path) -> None:
    write_job(tmp_path, lines="".join(f'{{"n": {i}}}\n' for i in range(50)))
    (tmp_path / "pyjob.py").write_text(
        "import tailrace\n"
        "class Double(tailrace.StreamTask):\n"
        "    def process(self, envelope, collector, coordinator):\n"
        "        collector.send('files.doubled', {'n': envelope.message['n'] * 2})\n"
        "job = {\n"
        "    'job': {'name': 'double', 'task': Double, 'inputs': ['files.in']},\n"
        "    'systems': {'files': {'type': 'file', 'path': 'data'}},\n"
        "    'checkpoints': {'type': 'sqlite', 'path': 'state/double.db'},\n"
        "}\n"
    )
    r = run_cli(["run", str(tmp_path / "pyjob.py"), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    bad = run_cli(["run", str(tmp_path / "broken.py")])
    assert bad.returncode == 2
    assert "broken.py: cannot load: ModuleNotFoundError: No module named 'no_such_module_here'" in bad.stderr
    assert read_stream(tmp_path / "data" / "doubled") == [[{"n": 2 * i} for i in range(50)]]
    assert (tmp_path / "state" / "double.db").exists()


def test_progress_lines_when_not_on_a_terminal(engine: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, lines="".join(f"{i}\n" for i in range(3000)))
    slow = tmp_path / "copy.py"
    slow.write_text(
        slow.read_text().replace("collector.send", "__import__('time').sleep(0.0002); collector.send")
    )
    r = run_cli(["run", str(job), "--engine", engine, "--progress-interval", "0.05"])
    assert r.returncode == 0, r.stderr
    assert "progress: " in r.stderr and "msg/s" in r.stderr
    r = run_cli(["run", str(job), "--engine", engine, "--progress", "--config", "job.name=other"])
    assert r.returncode == 0, r.stderr
    assert "\x1b[2K" in r.stderr and "partition" in r.stderr and "committed" in r.stderr


def test_prometheus_metrics_are_served(engine: str, tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    job = write_job(tmp_path, lines="".join(f"{i}\n" for i in range(100000)))
    slow = tmp_path / "copy.py"
    slow.write_text(
        slow.read_text().replace("collector.send", "__import__('time').sleep(0.001); collector.send")
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        tailrace_cmd("run", str(job), "--engine", engine, "--no-progress", "--metrics-port", str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        body = ""
        deadline = time.monotonic() + 30
        while "tailrace_task_processed_total" not in body and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    body = resp.read().decode()
            except OSError:
                time.sleep(0.05)
        assert 'tailrace_task_processed_total{job="copy",task="Partition 0"}' in body
        assert 'tailrace_container_loop_iterations_total{job="copy"}' in body
        assert 'tailrace_partition_skipped_total{job="copy",partition="files.in[0]"} 0.0' in body
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
