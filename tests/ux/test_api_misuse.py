"""Misuse of the Python API is refused where it is made, in one clear line naming what is
wrong: by the type checker (read-only envelope fields, engine names) and at run time (a str
where a list is expected, an option a system does not take, an option of the wrong type
or out of its range)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tailrace
from tailrace.errors import ConfigError, InputError
from tailrace.testing import TestDriver

from .conftest import mypy_strict

TYPED = """
import tailrace
from tailrace.testing import TestDriver


class T(tailrace.StreamTask):
    def process(
        self, envelope: tailrace.Envelope, collector: tailrace.Collector, coordinator: tailrace.Coordinator
    ) -> None:
        collector.send("mem.out", (envelope.system, envelope.partition, envelope.offset, envelope.key))
        envelope.message = 3  # read-only
        envelope.offset = 1  # read-only


mem = tailrace.MemorySystem("mem").add_stream("w", [["a", "b"]])
tailrace.Container(T, inputs=["mem.w"], systems=[mem], engine="python")
tailrace.Container(T, inputs=["mem.w"], systems=[mem], engine="java")  # not an engine
TestDriver(T, inputs={"w": 1}, engine="c")
TestDriver(T, inputs={"w": 1}, engine="jvm")  # not an engine
"""


def test_mypy_refuses_writes_to_envelope_fields_and_unknown_engines(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    out, errors = mypy_strict(tmp_path, TYPED)
    lines = TYPED.splitlines()
    flagged = {i + 1 for i, x in enumerate(lines) if "# read-only" in x or "# not an engine" in x}
    assert errors == flagged, out
    assert 'Property "message" defined in "Envelope" is read-only' in out, out
    assert 'Property "offset" defined in "Envelope" is read-only' in out, out
    assert out.count("\"Literal['c', 'python']\"") == 2, out


def test_envelope_fields_are_read_only_at_run_time() -> None:
    # what the stub now says: the fields the type checker refuses to write, the run refuses too
    envelope = tailrace.Envelope("mem", "w", 0, 5, "k", "m")
    for field in ("system", "stream", "partition", "offset", "key", "message"):
        with pytest.raises(AttributeError):
            setattr(envelope, field, 3)


class Echo(tailrace.StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", envelope.message)


@pytest.mark.parametrize("partitions", [["hello", "world"], "hello", [b"ab"], [["ok"], "no"], 2, [1, 2]])
def test_add_stream_refuses_a_str_or_a_count_where_partitions_are_expected(partitions: Any) -> None:
    # each str would be a partition of characters, and a count is no list of partitions: refused,
    # naming the stream
    with pytest.raises(TypeError, match=r"^stream 'w'.*expected a list of") as e:
        tailrace.MemorySystem("mem").add_stream("w", partitions)
    assert "[[m1, m2, ...]]" in str(e.value)
    with pytest.raises(TypeError, match=r"^stream 'w' partition 0: expected a list of keys"):
        tailrace.MemorySystem("mem").add_stream("w", [["a", "b"]], keys=["xy"])
    with pytest.raises(TypeError, match=r"^stream 'w' partition 0: expected a list of keys"):
        tailrace.MemorySystem("mem").add_stream("w", [["a", "b"]], keys=[3])
    with pytest.raises(TypeError, match=r"^stream 'w': expected a list of key lists, got 3"):
        tailrace.MemorySystem("mem").add_stream("w", [["a", "b"]], keys=3)


@pytest.mark.parametrize("count", [0, -1, 2.0, "2", True])
def test_a_memory_system_s_output_partitions_must_be_a_count(count: Any) -> None:
    # it was taken as given: the first send failed the task (0: "a stream needs at least one
    # partition", "2": TypeError), naming neither the system nor the option
    with pytest.raises(ConfigError, match=r"output_partitions.*expected an integer >= 1"):
        tailrace.MemorySystem("mem", output_partitions=count)
    with pytest.raises(ConfigError, match=r"set_output_partitions\('out'\).*expected an integer >= 1"):
        tailrace.MemorySystem("mem").set_output_partitions("out", count)


def test_add_stream_takes_any_other_sequence() -> None:
    mem = tailrace.MemorySystem("mem").add_stream("w", (("a", "b"), range(2)), keys=[None, ["k", "l"]])
    result = tailrace.Container(Echo, inputs=["mem.w"], systems=[mem], engine="python").run()
    assert result.processed == 4 and sorted(map(str, mem.messages("out"))) == ["0", "1", "a", "b"]


@pytest.mark.parametrize("engine", ["c", "python"])
def test_container_refuses_one_str_as_its_inputs(engine: Any) -> None:
    mem = tailrace.MemorySystem("mem").add_stream("w", [["a"]])
    with pytest.raises(
        ConfigError, match=r"config key 'inputs': expected a list of 'system.stream' names"
    ) as e:
        tailrace.Container(Echo, inputs="mem.w", systems=[mem], engine=engine)
    assert "(one input is ['mem.w'])" in str(e.value)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_an_input_stream_with_no_partitions_is_refused_naming_it(engine: Any, tmp_path: Path) -> None:
    # the C engine failed with "dispatch loop: TR_EINVAL", the Python one ran reading nothing
    for other in ([], ["mem.other"]):
        mem = tailrace.MemorySystem("mem").add_stream("words", []).add_stream("other", [["x"]])
        c = tailrace.Container(Echo, inputs=["mem.words", *other], systems=[mem], engine=engine)
        with pytest.raises(InputError) as e:
            c.run()
        assert str(e.value) == (
            "mem.words: input stream has no partitions (a job reads at least one partition of each input)"
        )
    # a file system's stream directory without partition files: refused as well
    (tmp_path / "lines").mkdir()
    files = tailrace.FileSystem("files", tmp_path)
    with pytest.raises(InputError, match=r"lines: stream directory has no partition files"):
        tailrace.Container(Echo, inputs=["files.lines"], systems=[files], engine=engine).run()
    with pytest.raises(ValueError, match=r"^stream 'live': partitions and capacity must be >= 1, got"):
        tailrace.MemorySystem("mem").add_live_stream("live", 0)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_two_systems_of_one_name_are_refused_naming_it(engine: Any, tmp_path: Path) -> None:
    # the second replaced the first without a word, and the run blamed the input stream
    mem = tailrace.MemorySystem("mem").add_stream("words", [["x"]])
    for other in (tailrace.MemorySystem(), tailrace.FileSystem("mem", tmp_path)):
        with pytest.raises(ConfigError) as e:
            tailrace.Container(Echo, inputs=["mem.words"], systems=[mem, other], engine=engine)
        assert str(e.value) == (
            f"config key 'systems': two systems are named 'mem' (MemorySystem and {type(other).__name__}): "
            "give each a name of its own"
        )
    with pytest.raises(ConfigError) as e:
        tailrace.Container(Echo, inputs=["mem.words"], systems=[mem, mem], engine=engine)
    assert str(e.value) == "config key 'systems': system 'mem' is listed twice"


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_task_instance_where_a_class_is_expected_is_refused_naming_it(engine: Any) -> None:
    # it failed when planning with "TypeError: 'Echo' object is not callable"
    mem = tailrace.MemorySystem("mem").add_stream("w", [["a"]])
    expected = "expected a task class (or a factory returning a task), got "
    instance = "an instance of Echo: pass the class Echo itself (the container makes one instance per task)"
    with pytest.raises(TypeError) as e:
        tailrace.Container(Echo(), inputs=["mem.w"], systems=[mem], engine=engine)
    assert str(e.value) == expected + instance
    with pytest.raises(TypeError) as e:
        TestDriver(Echo(), inputs={"w": 1}, engine=engine)
    assert str(e.value) == expected + instance
    with pytest.raises(TypeError) as e:
        tailrace.Container("task.py:Echo", inputs=["mem.w"], systems=[mem], engine=engine)
    assert str(e.value) == expected + "'task.py:Echo' (str)"


def test_file_system_options_of_the_wrong_type_are_config_errors_naming_them(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"config key 'systems.f.path': expected a directory path \(a string\)"
    ):
        tailrace.FileSystem("f", 5)
    with pytest.raises(ConfigError, match=r"config key 'systems.f.output_path': expected a directory path"):
        tailrace.FileSystem("f", tmp_path, output_path=["out"])
    assert tailrace.FileSystem("f", tmp_path, output_path=str(tmp_path)).output_path == tmp_path


@pytest.mark.parametrize(
    ("make", "allowed"),
    [
        (
            lambda: tailrace.FileSystem("f", "data", bogus=1),
            "name, path, output_path, output_partitions, skip_bad_lines, key_field, read_ahead, "
            "output_format",
        ),
        (lambda: tailrace.MemorySystem("m", bogus=1), "name, output_partitions"),
        (lambda: tailrace.SqliteCheckpointStore("cp.db", bogus=1), "path"),
        (lambda: tailrace.MemoryCheckpointStore(bogus=1), "history_limit"),
    ],
)
def test_an_unknown_option_from_python_is_a_config_error_naming_it(make: Any, allowed: str) -> None:
    # docs/python-jobs.md: the keywords are the job file's keys, with the same checks
    with pytest.raises(ConfigError) as e:
        make()
    assert str(e.value) == f"config key 'bogus': unknown option 'bogus' (allowed: {allowed})"


def test_a_wrong_positional_call_is_still_pythons_type_error() -> None:
    with pytest.raises(TypeError, match="positional"):
        tailrace.MemoryCheckpointStore(1, 2)


_PERIOD = "an integer from -2147483648 to 2147483647"


@pytest.mark.parametrize("engine", ["c", "python"])
@pytest.mark.parametrize(
    ("key", "values", "allowed"),
    [
        ("task.window.ms", (-(2**31) - 1, 2**31, -(2**63) - 1), f"{_PERIOD}; <= 0 disables"),
        ("task.commit.ms", (-(10**20), 2**31), f"{_PERIOD}; <= 0 disables timer commits"),
        ("task.callback.timeout.ms", (-(2**31) - 1, 10**30), f"{_PERIOD}; <= 0 disables"),
        ("task.max.idle.ms", (-1, 2**31), "an integer from 0 to 2147483647"),
        ("task.shutdown.ms", (-1, 2**31), "an integer from 0 to 2147483647"),
        ("task.max.concurrency", (0, 2**20 + 1), "an integer from 1 to 1048576"),
        ("stores.s.cache.size", (0, 10**30), "an integer from 1 to 1099511627776 (entries)"),
    ],
)
def test_an_integer_key_out_of_its_range_is_refused_stating_both_bounds(
    engine: Any, key: str, values: tuple[int, ...], allowed: str
) -> None:
    # SEMANTICS.md "Config keys": out of range is refused at start-up naming the key and the
    # allowed values, never an OverflowError from an engine (or a period taken as given)
    for value in values:
        mem = tailrace.MemorySystem("mem").add_stream("w", [["a"]])
        with pytest.raises(ConfigError) as e:
            tailrace.Container(
                Echo, inputs=["mem.w"], systems=[mem], engine=engine, stores=["s"], config={key: value}
            )
        assert str(e.value) == f"config key {key!r}: {value} is out of range (allowed: {allowed})"
    for edge in (-(2**31), 2**31 - 1) if allowed.startswith(_PERIOD) else ():
        mem = tailrace.MemorySystem("mem").add_stream("w", [["a"]])
        result = tailrace.Container(
            Echo, inputs=["mem.w"], systems=[mem], engine=engine, config={key: edge}
        ).run()
        assert result.processed == 1
