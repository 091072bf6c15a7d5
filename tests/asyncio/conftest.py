"""Every test here runs on every engine whose module imports, and on every event
loop available (asyncio's default loop, and uvloop when installed)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tailrace import aio
from tailrace.container import load_engine


def _importable(engine: str) -> bool:
    try:
        load_engine(engine)
    except ImportError:
        return False
    return True


ENGINES = [e for e in ("c", "python") if _importable(e)]
LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") is not None else [])


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=LOOPS, autouse=True)
def loop_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The event loop the container's AsyncioRunner makes."""
    monkeypatch.setattr(aio, "USE_UVLOOP", request.param == "uvloop")
    yield str(request.param)
