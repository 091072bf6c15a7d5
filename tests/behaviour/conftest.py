"""Every behaviour test runs once per engine whose module imports (multidict style).

The C engine (``tailrace.engine.native``) and the pure-Python reference engine
must pass the same test bodies; an engine that cannot be imported here is left
out rather than skipped test by test.
"""

from __future__ import annotations

import importlib

import pytest

from tailrace.container import ENGINES


def available_engines() -> list[str]:
    names = []
    for name in ("c", "python"):
        module = ENGINES[name].partition(":")[0]
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        names.append(name)
    return names


ENGINE_NAMES = available_engines()


@pytest.fixture(params=ENGINE_NAMES)
def engine(request: pytest.FixtureRequest) -> str:
    """The engine name to pass as ``Container(engine=...)``."""
    return str(request.param)
