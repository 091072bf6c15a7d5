"""The message collector handed to process/window/end_of_stream.

``Collector`` routes ``send(stream, message, key=None, partition=None)`` to a
system's producer: ``stream`` is ``"system.stream"`` (or a bare stream name on
the default output system); the partition is the one given, else the key's
stable hash (``key_partition``), else round robin. Both are compiled (a task
that emits calls ``send`` once per message); see ``_collector.pxi``.
"""

from __future__ import annotations

from ._core import Collector, key_partition

__all__ = ["Collector", "key_partition"]
