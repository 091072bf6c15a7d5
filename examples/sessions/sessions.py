"""Per-user sessions over JSON Lines clicks: a session is a user's run of clicks with no
gap longer than 30 minutes (event time: the clicks' ``ts``, read by ``task.timestamp.field``).
Each closed session goes to ``files.sessions`` (docs/windows.md).

The open sessions are the window's state, committed with the input offsets in one SQLite
transaction, so a stop (Ctrl-C), a kill -9 or a failed run followed by a fixed rerun never
loses nor double-counts a click: every session comes out with exactly its clicks. Output is
at-least-once: after a kill -9, sessions closed since the last commit are written again,
identical (the same ``user`` and ``start``).
"""

from __future__ import annotations

from typing import Any

import tailrace
from tailrace.windows import Fold, Session, WindowResult


def add(session: dict[str, Any], click: tailrace.Envelope) -> dict[str, Any]:
    page = click.message["page"]
    return {
        "clicks": session["clicks"] + 1,
        "pages": session["pages"] + [page] * (page not in session["pages"]),
    }


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:  # a click bridged two sessions
    return {
        "clicks": a["clicks"] + b["clicks"],
        "pages": a["pages"] + [p for p in b["pages"] if p not in a["pages"]],
    }


class Sessions(tailrace.StreamTask):
    sessions = Session(
        gap_ms=30 * 60_000,
        key="user",
        aggregate=Fold({"clicks": 0, "pages": []}, add, merge),
        on_result="emit",
    )

    def emit(
        self, result: WindowResult, collector: tailrace.Collector, coordinator: tailrace.Coordinator
    ) -> None:
        start, end = result.start // 1000, result.end // 1000  # seconds, as the clicks' ts
        collector.send(
            "files.sessions", {"user": result.key, "start": start, "end": end, **result.value}, key=result.key
        )
