"""Every test here runs on both engines (both must import: a missing compiled core
is an error, not a smaller suite), and on every event loop available (asyncio's
default loop, and uvloop when installed)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tailrace import aio
from tailrace.container import load_engine

ENGINES = ["c", "python"]
for _name in ENGINES:
    load_engine(_name)
LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") is not None else [])


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=LOOPS, autouse=True)
def loop_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The event loop the container's AsyncioRunner makes."""
    monkeypatch.setattr(aio, "USE_UVLOOP", request.param == "uvloop")
    yield str(request.param)
