"""The pytest plugin of tailrace.testing (entry point ``pytest11: tailrace``).

``tailrace_driver`` is a factory: ``driver = tailrace_driver(MyTask, inputs={"words": 1})``
takes :class:`~tailrace.testing.TestDriver`'s arguments, starts the driver and closes every
driver it made when the test ends. Without the entry point (a checkout not installed),
``pytest_plugins = ["tailrace.testing.fixtures"]`` in a conftest.py loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from . import TestDriver


@pytest.fixture
def tailrace_driver() -> Iterator[Callable[..., TestDriver]]:
    """Make started :class:`~tailrace.testing.TestDriver` objects; each is closed after the test."""

    drivers: list[TestDriver] = []

    def make(task: Any, **options: Any) -> TestDriver:
        driver = TestDriver(task, **options)
        drivers.append(driver)
        return driver.start()

    yield make
    errors: list[BaseException] = []
    for driver in drivers:
        try:
            driver.close()
        except Exception as e:  # noqa: BLE001 - close every driver, then report the first error
            errors.append(e)
    if errors:
        raise errors[0]
