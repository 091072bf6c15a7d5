"""Every behaviour test runs once per engine from one test body (multidict style).

The C engine (``tailrace.engine.native``) and the pure-Python reference engine
must pass the same test bodies. Both must import: a missing compiled core is a
collection error, never a silently smaller suite.
"""

from __future__ import annotations

import importlib

import pytest

from tailrace.container import ENGINES

ENGINE_NAMES = ["c", "python"]

for _name in ENGINE_NAMES:
    importlib.import_module(ENGINES[_name].partition(":")[0])


@pytest.fixture(params=ENGINE_NAMES)
def engine(request: pytest.FixtureRequest) -> str:
    """The engine name to pass as ``Container(engine=...)``."""
    return str(request.param)
