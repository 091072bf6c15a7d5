"""A run on a thread of its own while the main thread keeps its progress view and takes
the stop signals: every path of ``tailrace run`` goes through it.
"""

from __future__ import annotations

import argparse
import gc
import threading
from collections.abc import Callable
from typing import Any

from ..jobfile import JobSpec
from .display import _reporter
from .signals import _SIGNALS


def _run_watched(
    args: argparse.Namespace,
    spec: JobSpec,
    view: Any,
    run: Callable[[], Any],
    stop: Callable[[], None],
    armed: Callable[[threading.Event], None] | None = None,
    *,
    keep_frozen: bool = False,
) -> Any:
    """``run()`` on a thread of its own while the main thread keeps the progress view and
    takes the signals (the first one calls ``stop``); its result, or its error re-raised.
    ``armed(done)`` is called before it starts, with the event set when it ends."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["result"] = run()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            box["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=target, name="tailrace-run")
    if armed is not None:
        armed(done)
    _SIGNALS.attach(stop)
    # What start-up loaded (modules, the job, the task's module) lives to the end: frozen,
    # it is out of the cycle collector's reach, so the collections that the run's own
    # allocations trigger scan only the run's objects (the oldest generation's scanned
    # every module again: 1-2% of a cheap job's CPU). A forked container keeps them so
    # (``keep_frozen``: the parent froze them before the fork, see _run_file_containers);
    # the freeze count cannot tell (CPython 3.12 starts with objects frozen)
    gc.freeze()
    try:
        with _reporter(args, spec, view) as (reporter, interval):
            worker.start()
            try:
                while not done.wait(interval):
                    reporter.tick()
            finally:
                worker.join()
    finally:
        if not keep_frozen:
            gc.unfreeze()  # main() may run in-process: what it leaves is collectable again
    if "error" in box:
        raise box["error"]
    return box["result"]
