"""What ``tailrace run`` shows while it runs and after: the live view on a terminal, plain
progress lines otherwise, and the summary of a job run in this process.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any, Protocol, TextIO

from ..container import Container
from ..errors import TailraceError
from ..jobfile import JobSpec
from ..metrics import RunResult, TaskMetrics
from ..types import SystemStreamPartition
from .signals import _SIGNALS
from .text import _count, _rate_text, bad_message_text

log = logging.getLogger("tailrace.cli")


_SHOWN_PARTITIONS = 16  # partitions listed in the live display


class _Reporting:
    """Context manager: the live display on a terminal, else plain progress lines."""

    def __init__(self, reporter: _Reporter, interval: float) -> None:
        self.reporter = reporter
        self.interval = interval

    def __enter__(self) -> tuple[_Reporter, float]:
        self.reporter.start()
        return self.reporter, self.interval

    def __exit__(self, *exc: object) -> None:
        self.reporter.close()


def _reporter(args: argparse.Namespace, spec: JobSpec, source: _MetricsSource) -> _Reporting:
    live = args.progress if args.progress is not None else sys.stderr.isatty()
    if live:
        return _Reporting(_LiveDisplay(spec, source, sys.stderr), 0.25)
    return _Reporting(
        _LogLines(spec, source, enabled=args.progress is None), max(0.05, args.progress_interval)
    )


class _MetricsSource(Protocol):
    """What a reporter reads: a Container, or a Redis member's view of its current one."""

    def metrics(self) -> tuple[dict[str, TaskMetrics], Any] | None: ...

    def skipped(self) -> dict[SystemStreamPartition, int]: ...


class _Reporter:
    def __init__(self, spec: JobSpec, source: Any) -> None:
        self.spec = spec
        self.source = source
        self.t0 = time.monotonic()
        self.last_t = self.t0
        self.last_n = 0

    def snapshot(self) -> tuple[dict[str, TaskMetrics], float, float] | None:
        m = self.source.metrics()
        if m is None:
            return None
        tasks, _ = m
        now = time.monotonic()
        n = sum(t.processed for t in tasks.values())
        rate = (n - self.last_n) / (now - self.last_t) if now > self.last_t else 0.0
        if n < self.last_n:  # a new container (Redis rebalance) counts from 0
            rate = 0.0
        self.last_t, self.last_n = now, n
        return tasks, rate, now - self.t0

    def start(self) -> None:
        pass

    def tick(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _LogLines(_Reporter):
    """Plain periodic progress lines (not on a terminal)."""

    def __init__(self, spec: JobSpec, source: Any, enabled: bool) -> None:
        super().__init__(spec, source)
        self.enabled = enabled
        self.files = _FileProgress(spec) if enabled else None

    def tick(self) -> None:
        snap = self.snapshot() if self.enabled else None
        if snap is None:
            return
        tasks, rate, elapsed = snap
        processed = sum(t.processed for t in tasks.values())
        outstanding = sum(t.outstanding for t in tasks.values())
        lag = sum(v for t in tasks.values() for v in t.lag.values())
        remaining = self.files.remaining(tasks) if self.files else {}
        log.info(
            "progress: %d processed (%.0f msg/s), %d outstanding, lag %d, %d skipped, %.1f s%s",
            processed,
            rate,
            outstanding,
            lag,
            sum(self.source.skipped().values()),
            elapsed,
            "; " + _to_go_text(self.files, remaining) if self.files and remaining else "",
        )


class _LiveDisplay(_Reporter):
    """A live view (rich) on a terminal: rates, per-partition committed offsets and lag.

    It fits the terminal's width (long cells are cut with an ellipsis, never wrapped),
    log lines, the task's prints and the shutdown notice are printed above it, and it
    disappears at the end, leaving the final summary clean. Only the main thread draws
    (no refresh thread), so a signal handler never interrupts a redraw it then joins.
    """

    def __init__(self, spec: JobSpec, source: Any, out: TextIO) -> None:
        super().__init__(spec, source)
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=out, force_terminal=True, highlight=False, soft_wrap=False)
        self.live = Live(
            console=self.console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=True,
        )
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []
        self.stopping = False
        self.files = _FileProgress(spec)

    def start(self) -> None:
        self.live.start()
        # log records go through the live console (above the view), not straight to the terminal
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and h.stream is self.console.file:
                self._handlers.append((h, h.setStream(sys.stderr)))
        _SIGNALS.live = True

    def _notices(self) -> None:
        while _SIGNALS.notices:
            self.stopping = True
            self.live.console.print(_SIGNALS.notices.pop(0), style="bold yellow", overflow="fold")

    def tick(self) -> None:
        self._notices()
        snap = self.snapshot()
        self.live.update(self._render(snap), refresh=True)

    def _render(self, snap: tuple[dict[str, TaskMetrics], float, float] | None) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(f"tailrace {self.spec.name}", style="bold")
        head.append(f" ({self.spec.engine} engine)  {time.monotonic() - self.t0:.1f} s")
        parts: list[Any] = [head]
        if self.stopping:
            force = "; Ctrl-C again to force" if _SIGNALS.signum == signal.SIGINT else ""
            parts.append(Text(f"stopping gracefully{force}", style="yellow", no_wrap=True))
        if snap is None:
            parts.append(Text("starting...", no_wrap=True))
            return Group(*parts)
        tasks, rate, _ = snap
        skipped = self.source.skipped()
        parts.append(
            Text(
                f"processed {sum(t.processed for t in tasks.values()):,}  {rate:,.0f} msg/s  "
                f"outstanding {sum(t.outstanding for t in tasks.values())}  "
                f"commits {sum(t.commits for t in tasks.values())}  skipped {sum(skipped.values())}",
                no_wrap=True,
                overflow="ellipsis",
            )
        )
        remaining = self.files.remaining(tasks) if self.files else {}
        if remaining:
            parts.append(Text(_to_go_text(self.files, remaining), no_wrap=True, overflow="ellipsis"))
        table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
        table.add_column("partition", no_wrap=True, overflow="ellipsis", max_width=40)
        table.add_column("committed", justify="right", no_wrap=True, overflow="ellipsis")
        table.add_column("lag", justify="right", no_wrap=True)
        if remaining:
            table.add_column("remaining", justify="right", no_wrap=True)
        rows = sorted((ssp, t) for t in tasks.values() for ssp in _partitions(t))
        for ssp, t in rows[:_SHOWN_PARTITIONS]:
            cells = [str(ssp), str(t.committed.get(ssp, "-")), f"{t.lag.get(ssp, 0):,}"]
            if remaining:
                to_go, size = remaining.get(ssp, (0, 0))
                cells.append(f"{_bytes_text(to_go)} {100 * to_go / size:3.0f}%" if size else "-")
            table.add_row(*cells)
        parts.append(table)
        if len(rows) > _SHOWN_PARTITIONS:
            parts.append(Text(f"... and {len(rows) - _SHOWN_PARTITIONS} more partitions", no_wrap=True))
        return Group(*parts)

    def close(self) -> None:
        self._notices()
        self.live.stop()  # transient: the view is erased, the summary follows on a clean line
        for h, old in self._handlers:
            h.setStream(old)
        _SIGNALS.live = False
        while _SIGNALS.notices:
            print(_SIGNALS.notices.pop(0), file=sys.stderr, flush=True)


class _FileProgress:
    """How far a file job's inputs have to go (their sizes are known): per partition, the
    bytes after the last processed line (its low watermark, else its committed offset)
    and the share of the file they are; over every partition, an ETA from the rate at
    which the remaining bytes went down since the run started. Files are stat'ed at each
    call: an appended file has more to go."""

    def __init__(self, spec: JobSpec) -> None:
        from ..files import FileSystem, partition_file, scan_stream
        from ..types import parse_system_stream

        self.paths: dict[SystemStreamPartition, Path] = {}
        for name in spec.inputs:
            ss = parse_system_stream(name)
            system = spec.systems.get(ss.system)
            if not isinstance(system, FileSystem):
                continue
            try:
                count, fmt = scan_stream(system.path / ss.stream)
            except (TailraceError, OSError):
                continue  # the run reports it
            for p in range(count):
                ssp = SystemStreamPartition(ss.system, ss.stream, p)
                self.paths[ssp] = partition_file(system.path / ss.stream, p, fmt)
        self._last_line: dict[Path, tuple[int, int]] = {}  # path -> (size, start of its last line)
        self._first: tuple[float, int] | None = None  # (time, bytes to go) at the first sample

    def __bool__(self) -> bool:
        return bool(self.paths)

    def _last_line_start(self, path: Path, size: int) -> int:
        """Where the file's last line starts (its tail read once per size; -1 when unknown)."""
        known = self._last_line.get(path)
        if known is not None and known[0] == size:
            return known[1]
        start = -1
        if path.suffix != ".msgpack":
            try:
                with open(path, "rb") as f:
                    at = max(0, size - 65536)
                    f.seek(at)
                    tail = f.read(size - at).rstrip(b"\n")
                cut = tail.rfind(b"\n")
                start = at + cut + 1 if cut >= 0 or at == 0 else -1
            except OSError:
                start = -1
        self._last_line[path] = (size, start)
        return start

    def remaining(self, tasks: dict[str, TaskMetrics]) -> dict[SystemStreamPartition, tuple[int, int]]:
        """(bytes to go, file size) per file partition."""
        out: dict[SystemStreamPartition, tuple[int, int]] = {}
        done: dict[SystemStreamPartition, Any] = {}
        for t in tasks.values():
            for ssp, off in t.committed.items():
                done[ssp] = off
            for ssp, off in t.low_watermark.items():
                done[ssp] = off
        for ssp, path in self.paths.items():
            try:
                size = path.stat().st_size
            except OSError:
                continue
            at = done.get(ssp)
            if not isinstance(at, int):
                out[ssp] = (size, size)
                continue
            # the offset is the start of the last line processed: the bytes after that line
            last = self._last_line_start(path, size)
            out[ssp] = (0 if last >= 0 and at >= last else max(0, size - at), size)
        return out

    def eta(self, to_go: int) -> float | None:
        """Seconds until ``to_go`` bytes are done at the rate seen so far (None: no rate yet)."""
        now = time.monotonic()
        if self._first is None:
            self._first = (now, to_go)
            return None
        t0, first = self._first
        rate = (first - to_go) / (now - t0) if now > t0 else 0.0
        return to_go / rate if rate > 0 else None


def _bytes_text(n: int) -> str:
    """``812 B``, ``1.5 KiB``, ``12.3 MiB``, ``2.0 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _duration_text(seconds: float) -> str:
    """``0:42``, ``12:05``, ``3:02:10``."""
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _to_go_text(progress: _FileProgress, remaining: dict[SystemStreamPartition, tuple[int, int]]) -> str:
    """``remaining 12.3 MiB of 40.0 MiB (31%), ETA 0:42``: the file inputs all together."""
    to_go = sum(r for r, _ in remaining.values())
    total = sum(size for _, size in remaining.values())
    share = f" ({100 * to_go / total:.0f}%)" if total else ""
    eta = progress.eta(to_go)
    when = "done" if to_go == 0 else "ETA " + (_duration_text(eta) if eta is not None else "-")
    return f"remaining {_bytes_text(to_go)} of {_bytes_text(total)}{share}, {when}"


def _partitions(t: TaskMetrics) -> set[SystemStreamPartition]:
    return set(t.committed) | set(t.lag) | set(t.newest_read)


def _print_summary(
    spec: JobSpec, container: Container, result: RunResult, seconds: float, out: TextIO
) -> None:
    skipped = container.skipped()
    # short lines: the summary stays readable at 80 columns
    out.write(
        f"job {spec.name!r} finished ({result.reason}) in {seconds:.2f} s: "
        f"{_rate_text(result.processed, seconds)}\n"
    )
    failed = sum(t.failed for t in result.tasks.values())
    ignored = sum(t.ignored for t in result.tasks.values())
    more = f", failed {failed}, ignored exceptions {ignored}" if failed or ignored else ""
    out.write(f"  {_count(sum(skipped.values()), 'bad line')} skipped{more}\n")
    bad = bad_message_text(
        sum(t.skipped for t in result.tasks.values()),
        sum(t.dead_lettered for t in result.tasks.values()),
        sum(t.retried for t in result.tasks.values()),
    )
    if bad:
        out.write(f"  {bad}\n")
    late = sum(t.late for t in result.tasks.values())
    if late:
        out.write(f"  {_count(late, 'late message')} (late for every window they belong to)\n")
    out.write("  committed offsets:\n")
    for ssp, off in sorted(result.committed.items()):
        extra = f"  ({skipped[ssp]} skipped)" if skipped.get(ssp) else ""
        out.write(f"    {ssp!s:<28} {off!s}{extra}\n")
    out.flush()
