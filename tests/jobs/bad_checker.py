"""The task of the bad-message kill trials (bad_trials.py): counts each record's key in a store,
then raises on records marked ``boom`` (its count undone by the error policy), else copies the
record to output partition p. ``CHECKER_DELAY_MS`` (env) slows each message so that a kill
lands mid-run."""

from __future__ import annotations

import os
import time

import tailrace

DELAY = float(os.environ.get("CHECKER_DELAY_MS", "0")) / 1000.0


class BadChecker(tailrace.StreamTask):
    def init(self, context: tailrace.TaskContext) -> None:
        self.counts = context.store("counts")

    def process(
        self, envelope: tailrace.Envelope, collector: tailrace.Collector, coordinator: tailrace.Coordinator
    ) -> None:
        if DELAY:
            time.sleep(DELAY)
        m = envelope.message
        self.counts[m["k"]] = self.counts.get(m["k"], 0) + 1
        if m.get("boom"):
            raise ValueError(f"boom at seq {m['seq']}")
        collector.send("files.out", m, key=m["k"], partition=envelope.partition)
