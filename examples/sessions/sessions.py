"""Per-user sessions over JSON Lines clicks: a session is a user's run of clicks with no
gap longer than 30 minutes (event time, the clicks' ``ts``). Closed sessions go to
``files.sessions``.

The open sessions live in the task's store ``open`` (user -> session), committed with the
input offsets in one SQLite transaction, so a stop (Ctrl-C), a kill -9 or a failed run
followed by a fixed rerun never loses nor double-counts a click: every session comes out
with exactly its clicks. Output is at-least-once: after a kill -9, sessions closed since
the last commit are written again, identical (the same ``user`` and ``start``).
"""

from __future__ import annotations

from typing import Any

import tailrace

GAP = 30 * 60  # seconds of inactivity that close a session


class Sessions(tailrace.StreamTask):
    def init(self, context: tailrace.TaskContext) -> None:
        self.open = context.store("open")  # user -> {"user", "start", "end", "clicks", "pages"}
        self.clock = 0  # newest event time seen by this run

    def process(
        self, envelope: tailrace.Envelope, collector: tailrace.Collector, coordinator: tailrace.Coordinator
    ) -> None:
        click = envelope.message
        user, ts, page = click["user"], int(click["ts"]), click["page"]
        session = self.open.get(user)
        if session is not None and ts - session["end"] > GAP:
            self._close(session, collector)
            session = None
        if session is None:
            session = {"user": user, "start": ts, "end": ts, "clicks": 0, "pages": []}
        session["end"] = ts
        session["clicks"] += 1
        if page not in session["pages"]:
            session["pages"].append(page)
        self.open[user] = session
        self.clock = max(self.clock, ts)

    def window(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        # close the sessions idle for longer than the gap (by the newest click seen)
        idle = [s for _, s in self.open.items() if self.clock - s["end"] > GAP]
        for session in idle:
            self._close(session, collector)

    def end_of_stream(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        # the end of the input closes every open session
        for _, session in list(self.open.items()):
            self._close(session, collector)

    def _close(self, session: dict[str, Any], collector: tailrace.Collector) -> None:
        collector.send("files.sessions", session, key=session["user"])
        del self.open[session["user"]]
