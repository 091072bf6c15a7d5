"""Exactly-once outputs on both engines, memory system (rule 41): a task's outputs become
visible only with the commit that passes the messages that produced them; a commit runs
only with nothing outstanding; a failure publishes nothing past the last commit; a full
held buffer makes the commit fall due early."""

from __future__ import annotations

from typing import Any

import pytest

from tailrace import Container, MemoryCheckpointStore, MemorySystem, Scope
from tailrace.errors import ConfigError, TaskError
from tailrace.memory import system as memory_system

EO = {"task.output.guarantee": "exactly-once", "task.commit.ms": -1}


def _job(n: int = 12, partitions: int = 2) -> MemorySystem:
    return MemorySystem("mem").add_stream("in", [[p * 100 + i for i in range(n)] for p in range(partitions)])


def run(task: Any, system: MemorySystem, store: MemoryCheckpointStore, engine: str) -> Any:
    return Container(
        task, inputs=["mem.in"], systems=[system], checkpoints=store, engine=engine, job_name="j", **EO
    ).run()


def test_outputs_are_visible_only_with_the_commit_that_passes_their_messages(engine: str) -> None:
    # rule 41: what a reader sees is always the outputs of exactly the committed prefix
    system = _job()
    store = MemoryCheckpointStore()
    seen: list[tuple[int, dict[Any, Any], int]] = []

    class Task:
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            committed = {ssp.partition: off for ssp, off in store.committed("j").items()}
            seen.append((envelope.offset, committed, len(system.messages("out"))))
            collector.send("mem.out", envelope.message, key=envelope.partition)
            collector.send("mem.out", -envelope.message, key=envelope.partition)
            if envelope.offset % 5 == 4:
                coordinator.commit(Scope.CURRENT_TASK)

    run(Task, system, store, engine)
    assert any(visible for _offset, _committed, visible in seen)
    for _offset, committed, visible in seen:
        assert visible == sum(2 * (off + 1) for off in committed.values())
    every = [m for p in range(2) for i in range(12) for m in (p * 100 + i, -(p * 100 + i))]
    assert sorted(system.messages("out")) == sorted(every)


def test_a_failure_publishes_nothing_past_the_last_commit(engine: str) -> None:
    # rules 18, 41: the failed message's own sends, and the uncommitted ones before it, stay unseen
    system = _job(partitions=1)
    store = MemoryCheckpointStore()

    class Task:
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            collector.send("mem.out", envelope.message)
            if envelope.offset == 3:
                coordinator.commit(Scope.CURRENT_TASK)
            if envelope.offset == 7:
                raise RuntimeError("boom")

    with pytest.raises(TaskError):
        run(Task, system, store, engine)
    # the final commit after a failure would pass the failed message's own sends: it writes
    # nothing (as with stores, rule 27); a restart processes 4.. again and sends them once
    assert system.messages("out") == [0, 1, 2, 3]
    assert list(store.committed("j").values()) == [3]


def test_a_full_held_buffer_makes_the_commit_fall_due_early(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rule 41, docs/outputs.md: no timer commit (task.commit.ms = -1), yet commits come every few
    # messages, each covering exactly the messages that sent (rule 23: the timer runs between messages)
    monkeypatch.setattr(memory_system, "HELD_RECORDS", 6)
    system = _job(n=20, partitions=1)
    store = MemoryCheckpointStore(history_limit=None)

    class Task:
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            collector.send("mem.out", envelope.message)
            collector.send("mem.out", envelope.message)

    result = run(Task, system, store, engine)
    offsets = [off for _task, written in store.history for off in written.values()]
    assert offsets[:3] == [2, 5, 8]  # 6 records held: the commit after the third message
    assert result.tasks["Partition 0"].commits >= 6
    assert system.messages("out") == [i for i in range(20) for _ in range(2)]


@pytest.mark.parametrize("key", ["task.output.guarantee", "task_output_guarantee"])
def test_the_key_takes_two_values_and_names_them_when_wrong(key: str) -> None:
    system = _job()
    c = Container(lambda: None, inputs=["mem.in"], systems=[system], config={key: " Exactly-Once "})
    assert c.config.output_guarantee == "exactly-once" and c.config.exactly_once
    with pytest.raises(ConfigError) as e:
        Container(lambda: None, inputs=["mem.in"], systems=[system], config={key: "exactly_once"})
    assert "task.output.guarantee" in str(e.value) and "at-least-once, exactly-once" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Container(lambda: None, inputs=["mem.in"], systems=[system], config={key: True})
    assert "task.output.guarantee" in str(e.value)
    assert (
        Container(lambda: None, inputs=["mem.in"], systems=[system]).config.output_guarantee
        == "at-least-once"
    )


def test_exactly_once_with_async_commit_is_refused_naming_both_keys() -> None:
    with pytest.raises(ConfigError) as e:
        Container(
            lambda: None,
            inputs=["mem.in"],
            systems=[_job()],
            config={"task.output.guarantee": "exactly-once", "task.async.commit": True},
        )
    assert "task.async.commit" in str(e.value) and "task.output.guarantee" in str(e.value)
