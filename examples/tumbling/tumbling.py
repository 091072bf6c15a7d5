"""Page views per user per minute of event time (each view's ``ts``, in ms), over two
partitions of JSON Lines views. A minute closes when the task's watermark (the newest ``ts``
read, minus ``task.watermark.lag.ms``) passes its end; its counts go to ``files.counts``.
A view that comes after its minute closed is late: it is counted in the run's metrics and
written to ``files.late``, and never changes a count already written (docs/windows.md).
"""

from __future__ import annotations

import tailrace
from tailrace.windows import Count, Tumbling


class PerUser(tailrace.StreamTask):
    # no process(): every message is added to every window the task declares
    per_minute = Tumbling(
        60_000, key="user", aggregate=Count(), output="files.counts", late_output="files.late"
    )
