"""The base classes declare every optional hook with its types (editors and mypy see
them), without defining them: engines still run only the hooks a task defines."""

from __future__ import annotations

from pathlib import Path

import pytest

import tailrace
from tailrace.api import HOOKS, hook

from .conftest import mypy_strict

TYPED = """
import tailrace


class Good(tailrace.StreamTask):
    def init(self, context: tailrace.TaskContext) -> None:
        self.name = context.task_name

    def process(
        self, envelope: tailrace.Envelope, collector: tailrace.Collector, coordinator: tailrace.Coordinator
    ) -> None:
        pass

    def window(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        collector.send("mem.out", 1)


class GoodAsync(tailrace.AsyncStreamTask):
    async def window(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        pass


class Bad(tailrace.StreamTask):
    def window(self, collector: tailrace.Collector) -> None:  # coordinator missing
        pass

    def end_of_stream(self, collector: tailrace.Collector, coordinator: int) -> None:  # wrong type
        pass


def use(task: tailrace.StreamTask, c: tailrace.Collector, k: tailrace.Coordinator) -> None:
    task.window(c, k)  # known to the type checker on the base class
    task.close()
"""


def test_mypy_sees_the_hooks_of_the_base_classes(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    out, errors = mypy_strict(tmp_path, TYPED)
    assert len(errors) == 2, out
    assert 'Signature of "window" incompatible with supertype "tailrace.api.StreamTask"' in out
    assert 'Argument 2 of "end_of_stream" is incompatible with supertype "tailrace.api.StreamTask"' in out
    lines = TYPED.splitlines()
    bad = {i + 1 for i, x in enumerate(lines) if "# coordinator missing" in x or "# wrong type" in x}
    assert errors == bad, out


def test_declared_hooks_are_not_defined_at_run_time() -> None:
    class Plain(tailrace.StreamTask):
        def process(self, envelope: object, collector: object, coordinator: object) -> None:
            pass

    class PlainAsync(tailrace.AsyncStreamTask):
        def process_async(
            self, envelope: object, collector: object, coordinator: object, callback: object
        ) -> None:
            pass

    for task in (Plain(), PlainAsync()):
        for name in HOOKS:
            assert hook(task, name) is None, name  # engines run no window/end_of_stream/init/close
