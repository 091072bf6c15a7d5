"""Word count: counts the words of each input partition and emits the counts on every
window (``task.window.ms``) and at the end of the input to ``files.counts``."""

from __future__ import annotations

import re
from collections import Counter

import tailrace

WORD = re.compile(r"[a-z']+")


class WordCount(tailrace.StreamTask):
    def init(self, context: tailrace.TaskContext) -> None:
        self.task = context.task_name
        self.counts: Counter[str] = Counter()
        self.changed: set[str] = set()

    def process(self, envelope: tailrace.Envelope, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        for word in WORD.findall(envelope.message.lower()):
            self.counts[word] += 1
            self.changed.add(word)

    def window(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        # Only the words whose count changed since the last window: the newest line per
        # word in output/counts is its current count for this task.
        for word in sorted(self.changed):
            collector.send("files.counts", {"task": self.task, "word": word, "count": self.counts[word]}, key=word)
        self.changed.clear()

    def end_of_stream(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        self.window(collector, coordinator)
        top = ", ".join(f"{w} {n}" for w, n in self.counts.most_common(5))
        print(f"{self.task}: {sum(self.counts.values())} words, top: {top}", flush=True)
