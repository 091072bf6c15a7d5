"""The checker job of the fault tests: copies keyed, sequence-numbered records from input
partition p to output partition p, in order. ``CHECKER_DELAY_MS`` (env) slows each message
so that a kill lands mid-run."""

from __future__ import annotations

import os
import time

import tailrace

DELAY = float(os.environ.get("CHECKER_DELAY_MS", "0")) / 1000.0


class Checker(tailrace.StreamTask):
    def process(self, envelope: tailrace.Envelope, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        if DELAY:
            time.sleep(DELAY)
        collector.send("files.out", envelope.message, key=envelope.message["k"], partition=envelope.partition)
