"""The task of the windowed kill -9 trials (window_trials.py): a Tumbling window (a Fold of
count, sum and ids, with a late stream) and a Session window (a Fold with merge, with a late
stream) over each record's ``ts``, keyed by ``k``. ``CHECKER_DELAY_MS`` (env) slows each
message so that a kill lands mid-run."""

from __future__ import annotations

import os
import time
from typing import Any

import tailrace
from tailrace.windows import Fold, Session, Tumbling

DELAY = float(os.environ.get("CHECKER_DELAY_MS", "0")) / 1000.0
SIZE_MS = 2000  # the tumbling windows
GAP_MS = 700  # the session gap
GRACE_MS = 100


def add(acc: dict[str, Any], envelope: tailrace.Envelope) -> dict[str, Any]:
    m = envelope.message
    return {"n": acc["n"] + 1, "sum": acc["sum"] + m["v"], "ids": [*acc["ids"], m["id"]]}


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"n": a["n"] + b["n"], "sum": a["sum"] + b["sum"], "ids": a["ids"] + b["ids"]}


class WindowChecker(tailrace.StreamTask):
    tumbling = Tumbling(
        SIZE_MS,
        key="k",
        aggregate=Fold({"n": 0, "sum": 0, "ids": []}, add),
        grace_ms=GRACE_MS,
        output="files.tumbling",
        late_output="files.tumbling_late",
    )
    sessions = Session(
        GAP_MS,
        key="k",
        aggregate=Fold({"n": 0, "sum": 0, "ids": []}, add, merge=merge),
        grace_ms=GRACE_MS,
        output="files.sessions",
        late_output="files.sessions_late",
    )

    def process(
        self, envelope: tailrace.Envelope, collector: tailrace.Collector, coordinator: tailrace.Coordinator
    ) -> None:
        if DELAY:
            time.sleep(DELAY)
        self.tumbling.add(envelope, collector, coordinator)
        self.sessions.add(envelope, collector, coordinator)
