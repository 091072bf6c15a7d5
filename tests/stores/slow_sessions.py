"""The sessions example's task, slowed by ``SESSIONS_DELAY_MS`` per click so that a stop,
a kill -9 or a failure lands mid-run (the example itself stays as users see it)."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

_path = Path(__file__).resolve().parents[2] / "examples" / "sessions" / "sessions.py"
_spec = importlib.util.spec_from_file_location("example_sessions", _path)
assert _spec is not None and _spec.loader is not None
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

DELAY = float(os.environ.get("SESSIONS_DELAY_MS", "0")) / 1000.0


class SlowSessions(example.Sessions):  # type: ignore[misc, name-defined]
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if DELAY:
            time.sleep(DELAY)
        super().process(envelope, collector, coordinator)
