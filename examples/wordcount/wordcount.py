"""Word count: counts the words of each input partition in a key-value store and emits
the counts on every window (``task.window.ms``) and at the end of the input to
``files.counts``.

The counts live in the task's store ``counts`` (``[stores.counts]`` in job.toml), so
they are committed together with the input offsets in one SQLite transaction: run it,
append lines, stop it (Ctrl-C) or kill it at any point and run it again: the newest row
per word in output/counts is always its exact count over everything read.
"""

from __future__ import annotations

import re
from collections import Counter

import tailrace

WORD = re.compile(r"[a-z']+")


class WordCount(tailrace.StreamTask):
    def init(self, context: tailrace.TaskContext) -> None:
        self.task = context.task_name
        self.counts = context.store("counts")  # word -> count, durable with the offsets
        # words changed since the last window; their counts are emitted by the next one.
        # Kept in the store too, so a stop between a change and its window loses nothing.
        self.changed = context.store("changed")
        self.words = 0  # words read by this run (the summary line; the top five are over all runs)

    def process(
        self, envelope: tailrace.Envelope, collector: tailrace.Collector, coordinator: tailrace.Coordinator
    ) -> None:
        counts, changed = self.counts, self.changed
        for word in WORD.findall(envelope.message.lower()):
            counts[word] = counts.get(word, 0) + 1
            changed[word] = True
            self.words += 1

    def window(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        # Only the words whose count changed since the last window: the newest line per
        # word in output/counts is its current count for this task.
        words = list(self.changed.keys())
        for word in words:
            collector.send(
                "files.counts", {"task": self.task, "word": word, "count": self.counts[word]}, key=word
            )
        self.changed.delete_all(words)

    def end_of_stream(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        self.window(collector, coordinator)
        if not self.words:
            print(f"{self.task}: no new lines since the last checkpoint", flush=True)
            return
        top = Counter(dict(self.counts.items())).most_common(5)
        print(f"{self.task}: {self.words} words, top: {', '.join(f'{w} {n}' for w, n in top)}", flush=True)
