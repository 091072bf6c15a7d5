"""Bad messages (SEMANTICS rules 39, 40): task.error.policy fail / skip / dead-letter,
task.error.retries, the undo of a skipped sync message's store writes, and the commit
of everything before a bad message. Both engines, the memory system (files, Redis and
Kafka inputs have their own tests of undecodable input)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tailrace import (
    AsyncStreamTask,
    ConfigError,
    Container,
    MemoryCheckpointStore,
    MemorySystem,
    StreamTask,
    TaskError,
)
from tailrace.errors import InputError
from tailrace.types import BadInput

from .helpers import bounded, ssp

JOB = "tailrace-job"  # the default job.name: the store's data after the run, by job


class Boom(Exception):
    pass


def _run(engine: str, task: Any, system: Any, **config: Any) -> tuple[Any, MemoryCheckpointStore]:
    store = MemoryCheckpointStore()
    c = Container(task, inputs=["mem.in"], systems=[system], checkpoints=store, engine=engine, **config)
    return c.run(), store


class Sums(StreamTask):
    """Adds each message to a store and to the output; raises on messages marked bad,
    after a partial store write (the sum is updated, then process raises)."""

    def init(self, context: Any) -> None:
        self.sums = context.store("sums")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        m = envelope.message
        self.sums["total"] = self.sums.get("total", 0) + m["n"]
        self.sums[f"k{m['n']}"] = 1
        if m.get("bad"):
            raise Boom(f"bad record {m['n']}")
        collector.send("mem.out", m["n"])


def _messages(n: int, bad: set[int]) -> list[dict[str, Any]]:
    return [{"n": i, "bad": True} if i in bad else {"n": i} for i in range(n)]


@pytest.mark.parametrize("pool", [0, 2])
def test_skip_completes_the_message_and_undoes_its_store_writes(engine: str, pool: int) -> None:
    # rule 39: skip, and no partial store write of a skipped sync message
    system = bounded([_messages(50, {3, 17, 40})])
    result, store = _run(
        engine, Sums, system, stores=["sums"], task_error_policy="skip", job_container_thread_pool_size=pool
    )
    good = [i for i in range(50) if i not in {3, 17, 40}]
    assert system.messages("out") == good
    state = store.state("Partition 0", "sums", JOB)
    assert state["total"] == sum(good)
    assert not {"k3", "k17", "k40"} & set(state)
    m = result.tasks["Partition 0"]
    assert (m.skipped, m.dead_lettered, m.failed) == (3, 0, 0)
    assert store.committed(JOB)[ssp(0)] == 49


def test_dead_letter_records_where_what_and_why(engine: str) -> None:
    # rule 39: the dead letter holds the message, its coordinates, the exception and its frame
    system = bounded([_messages(10, {4}), _messages(10, {7})])
    result, store = _run(
        engine,
        Sums,
        system,
        stores=["sums"],
        task_error_policy="dead-letter",
        task_error_stream="mem.dead",
    )
    letters = sorted(system.messages("dead"), key=lambda r: r["partition"])
    assert [(d["partition"], d["offset"]) for d in letters] == [(0, 4), (1, 7)]
    d = letters[0]
    assert d["system"] == "mem" and d["stream"] == "in" and d["task"] == "Partition 0"
    assert d["value"] == {"n": 4, "bad": True}
    assert d["error"]["type"].endswith("Boom") and d["error"]["message"] == "bad record 4"
    assert __file__.rstrip("c") in d["error"]["frame"] and "in process" in d["error"]["frame"]
    assert d["attempts"] == 1 and isinstance(d["time"], int)
    assert sum(t.dead_lettered for t in result.tasks.values()) == 2
    assert store.state("Partition 1", "sums", JOB)["total"] == sum(range(10)) - 7


def test_retries_run_process_again_from_the_state_before_it(engine: str) -> None:
    # task.error.retries: a failure that passes on the third attempt completes normally, and
    # the failed attempts' store writes are undone (one increment, not three)
    attempts: dict[int, int] = {}

    class Flaky(StreamTask):
        def init(self, context: Any) -> None:
            self.counts = context.store("counts")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.counts["n"] = self.counts.get("n", 0) + 1
            k = envelope.offset
            attempts[k] = attempts.get(k, 0) + 1
            if k == 5 and attempts[k] < 3:
                raise Boom("not yet")
            collector.send("mem.out", k)

    system = bounded([list(range(10))])
    result, store = _run(
        engine, Flaky, system, stores=["counts"], task_error_retries=2, task_error_retry_backoff_ms=1
    )
    assert attempts[5] == 3
    assert system.messages("out") == list(range(10))
    assert store.state("Partition 0", "counts", JOB)["n"] == 10
    assert result.tasks["Partition 0"].retried == 2


def test_retries_exhausted_apply_the_policy(engine: str) -> None:
    class Always(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 1:
                raise Boom("always")
            collector.send("mem.out", envelope.offset)

    system = bounded([list(range(4))])
    result, _ = _run(
        engine,
        Always,
        system,
        task_error_retries=2,
        task_error_retry_backoff_ms=0,
        task_error_policy="dead-letter",
        task_error_stream="mem.dead",
    )
    assert system.messages("out") == [0, 2, 3]
    (letter,) = system.messages("dead")
    assert letter["attempts"] == 3 and letter["offset"] == 1
    assert result.tasks["Partition 0"].retried == 2


def test_fail_stops_and_still_commits_everything_before_the_bad_message(engine: str) -> None:
    # rules 16, 40: the failed message's writes are undone, so the final commit passes
    # every message before it, with or without key ordering
    for ordering in ("partition", "key"):
        system = bounded([_messages(30, {12})])
        store = MemoryCheckpointStore()
        c = Container(
            Sums,
            inputs=["mem.in"],
            systems=[system],
            checkpoints=store,
            engine=engine,
            stores=["sums"],
            task_ordering=ordering,
        )
        with pytest.raises(TaskError) as info:
            c.run()
        assert info.value.offset == 12
        assert store.committed(JOB)[ssp(0)] == 11, ordering
        state = store.state("Partition 0", "sums", JOB)
        assert state["total"] == sum(range(12)) and "k12" not in state, ordering


def test_bad_input_is_never_processed_and_follows_the_policy(engine: str) -> None:
    # rule 39: an envelope whose input could not be read (a reader's BadInput)
    seen: list[int] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            seen.append(envelope.offset)

    def system() -> Any:
        bad = BadInput(InputError("entry cannot be decoded", source="mem.in[0]"), b"\xff{")
        return bounded([[0, 1, bad, 3]])

    s = system()
    _run(engine, Task, s, task_error_policy="dead-letter", task_error_stream="mem.dead")
    assert seen == [0, 1, 3]
    (letter,) = s.messages("dead")
    assert letter["offset"] == 2 and letter["bytes_base64"] == "/3s=" and "value" not in letter
    assert letter["error"]["type"] == "tailrace.errors.InputError"

    seen.clear()
    store = MemoryCheckpointStore()
    c = Container(Task, inputs=["mem.in"], systems=[system()], checkpoints=store, engine=engine)
    with pytest.raises(InputError, match="entry cannot be decoded"):
        c.run()
    assert seen == [0, 1]
    assert store.committed(JOB)[ssp(0)] == 1


def test_async_callback_failure_is_skipped(engine: str) -> None:
    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            def finish() -> None:
                if envelope.offset % 4 == 1:
                    callback.fail(Boom(f"async {envelope.offset}"))
                else:
                    collector.send("mem.out", envelope.offset)
                    callback.complete()

            threading.Thread(target=finish).start()

    system = bounded([list(range(20))])
    _, store = _run(
        engine,
        Task,
        system,
        task_max_concurrency=4,
        task_error_policy="dead-letter",
        task_error_stream="mem.dead",
    )
    assert sorted(system.messages("out")) == [i for i in range(20) if i % 4 != 1]
    assert sorted(d["offset"] for d in system.messages("dead")) == [1, 5, 9, 13, 17]
    assert store.committed(JOB)[ssp(0)] == 19


def test_process_async_raising_is_skipped(engine: str) -> None:
    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if envelope.offset == 2:
                raise Boom("in the call")
            callback.complete()

    result, store = _run(engine, Task, bounded([list(range(5))]), task_error_policy="skip")
    assert result.tasks["Partition 0"].skipped == 1
    assert store.committed(JOB)[ssp(0)] == 4


def test_async_def_process_raising_is_dead_lettered(engine: str) -> None:
    class Task:
        async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            await asyncio.sleep(0)
            if envelope.offset == 3:
                raise Boom("coroutine")
            collector.send("mem.out", envelope.offset)

    system = bounded([list(range(6))])
    _, store = _run(engine, Task, system, task_error_policy="dead-letter", task_error_stream="mem.dead")
    assert sorted(system.messages("out")) == [0, 1, 2, 4, 5]
    (letter,) = system.messages("dead")
    assert letter["offset"] == 3 and letter["error"]["message"] == "coroutine"
    assert store.committed(JOB)[ssp(0)] == 5


def test_ignored_exceptions_come_before_the_policy(engine: str) -> None:
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 1:
                raise KeyError("listed")
            if envelope.offset == 2:
                raise Boom("not listed")

    result, _ = _run(
        engine,
        Task,
        bounded([list(range(4))]),
        task_ignored_exceptions="KeyError",
        task_error_policy="skip",
    )
    m = result.tasks["Partition 0"]
    assert (m.ignored, m.skipped) == (1, 1)


def test_the_first_bad_message_is_logged_in_full_later_ones_counted(
    engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset % 2:
                raise Boom(f"odd {envelope.offset}")

    with caplog.at_level("WARNING", logger="tailrace.errors"):
        result, _ = _run(engine, Task, bounded([list(range(40))]), task_error_policy="skip")
    records = [r for r in caplog.records if r.name == "tailrace.errors"]
    assert len(records) == 1 and records[0].exc_info is not None
    assert "offset 1" in records[0].getMessage() and "odd 1" in records[0].getMessage()
    assert result.tasks["Partition 0"].skipped == 20


def test_config_refuses_a_half_valid_error_policy() -> None:
    with pytest.raises(ConfigError, match=r"task\.error\.stream"):
        Container(Sums, inputs=["mem.in"], systems=[bounded([[1]])], task_error_policy="dead-letter")
    with pytest.raises(ConfigError, match=r"task\.error\.policy"):
        Container(Sums, inputs=["mem.in"], systems=[bounded([[1]])], task_error_policy="drop")
    with pytest.raises(ConfigError, match=r"task\.error\.policy"):
        Container(Sums, inputs=["mem.in"], systems=[bounded([[1]])], task_error_stream="mem.dead")
    with pytest.raises(ConfigError, match=r"task\.error\.retries"):
        Container(Sums, inputs=["mem.in"], systems=[bounded([[1]])], task_error_retries=-1)
    c = Container(
        Sums,
        inputs=["mem.in"],
        systems=[bounded([[1]])],
        task_error_policy="dead-letter",
        task_error_stream="nowhere.dead",
    )
    with pytest.raises(ConfigError, match="no system 'nowhere'"):
        c.run()


def test_async_def_retries_in_its_coroutine_then_applies_the_policy(engine: str) -> None:
    attempts: dict[int, int] = {}

    class Task:
        async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            k = envelope.offset
            attempts[k] = attempts.get(k, 0) + 1
            await asyncio.sleep(0)
            if k == 1 and attempts[k] < 2:
                raise Boom("passes on the second attempt")
            if k == 3:
                raise Boom("never passes")
            collector.send("mem.out", k)

    system = bounded([list(range(5))])
    result, _ = _run(
        engine, Task, system, task_error_retries=1, task_error_retry_backoff_ms=1, task_error_policy="skip"
    )
    assert sorted(system.messages("out")) == [0, 1, 2, 4]
    assert attempts[1] == 2 and attempts[3] == 2
    m = result.tasks["Partition 0"]
    assert (m.retried, m.skipped) == (2, 1)


@pytest.mark.parametrize("lazy", [True, False])
def test_a_key_without_identity_under_key_ordering_is_a_bad_message(engine: str, lazy: bool) -> None:
    # rule 39: its key cannot be read as a key (task.ordering = key needs an identity): with
    # dead-letter it goes to the error stream with its message, and the others go on
    seen: list[int] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            seen.append(envelope.offset)

    keys: list[Any] = ["a", "b", {1, 2}, "a", "c"]
    system = MemorySystem().add_stream("in", [[f"m{i}" for i in range(5)]], keys=[keys])
    if not lazy:  # a live stream: envelopes built by the reader, not lazily from lists
        system = MemorySystem().add_live_stream("in", 1)
        for i, k in enumerate(keys):
            system.append("in", 0, f"m{i}", key=k)
        system.end("in")
    _, store = _run(
        engine,
        Task,
        system,
        task_ordering="key",
        task_error_policy="dead-letter",
        task_error_stream="mem.dead",
    )
    assert sorted(seen) == [0, 1, 3, 4]
    (letter,) = system.messages("dead")
    assert letter["offset"] == 2 and letter["value"] == "m2"
    assert "its key, a set" in letter["error"]["message"] and letter["error"]["frame"] is None
    assert store.committed(JOB)[ssp(0)] == 4


def test_a_store_value_that_cannot_be_encoded_is_skipped_with_nothing_written(engine: str) -> None:
    # rule 39: refused at the write (SerdeError naming store and key), uncaught it fails the
    # message, and skip undoes the writes made before it in the same call
    class Task(StreamTask):
        def init(self, context: Any) -> None:
            self.s = context.store("s")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.s["count"] = self.s.get("count", 0) + 1
            self.s[f"v{envelope.offset}"] = "\ud800" if envelope.offset == 2 else "ok"

    result, store = _run(engine, Task, bounded([list(range(5))]), stores=["s"], task_error_policy="skip")
    state = store.state("Partition 0", "s", JOB)
    assert state["count"] == 4 and "v2" not in state and state["v4"] == "ok"
    assert result.tasks["Partition 0"].skipped == 1


def test_an_async_tasks_writes_before_its_failure_stay_as_documented(engine: str) -> None:
    # docs/bad-messages.md: for async tasks the writes a failed invocation made stay (several
    # invocations interleave, so one's writes cannot be told from another's)
    class Task(AsyncStreamTask):
        def init(self, context: Any) -> None:
            self.s = context.store("s")

        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            self.s[f"seen{envelope.offset}"] = True
            if envelope.offset == 1:
                callback.fail(Boom("after a write"))
            else:
                callback.complete()

    result, store = _run(engine, Task, bounded([list(range(3))]), stores=["s"], task_error_policy="skip")
    assert store.state("Partition 0", "s", JOB) == {"seen0": True, "seen1": True, "seen2": True}
    assert result.tasks["Partition 0"].skipped == 1
