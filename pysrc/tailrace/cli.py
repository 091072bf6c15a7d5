"""The ``tailrace`` command line: run a job file, inspect or reset its checkpoints.

Exit status: 0 after a graceful end (end of stream, shutdown request, Ctrl-C or
SIGTERM), 1 when the job failed (task error, bad input, checkpoint error),
2 for a configuration or usage error, 128+N after a forced stop by signal N.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any, TextIO

from .config import describe_keys
from .container import ENGINES, Container
from .errors import ConfigError, TailraceError
from .jobfile import JOB_FILE, JobSpec, load_job, parse_override
from .metrics import RunResult, TaskMetrics
from .types import Offset, SystemStreamPartition

log = logging.getLogger("tailrace.cli")

_SHOWN_PARTITIONS = 16  # partitions listed in the live display


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailrace",
        description="Run tailrace stream-processing jobs described by a job file (TOML).",
        epilog="config keys (job file [config] table, or --config KEY=VALUE):\n" + describe_keys(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log level"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    job_help = f"the job file (TOML, or a .py defining `job`), or a directory holding {JOB_FILE}"
    run = sub.add_parser(
        "run",
        help="run a job until its input ends or it is stopped",
        description="Run a job. Each partition resumes after its committed offset. Ctrl-C or SIGTERM "
        "stops gracefully (in-flight work finishes, a final checkpoint is written); a second Ctrl-C "
        "forces an immediate stop (a restart then replays what came after the last checkpoint).",
        epilog="config keys:\n" + describe_keys(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("job", metavar="JOB", help=job_help)
    run.add_argument(
        "--engine", choices=sorted(ENGINES), help="run loop engine (default: the job file's, else c)"
    )
    run.add_argument(
        "--config",
        "-c",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (or job.*, systems.<name>.*, checkpoints.* entry); repeatable",
    )
    prog = run.add_mutually_exclusive_group()
    prog.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="live progress display (default when stderr is a terminal)",
    )
    prog.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="neither live display nor periodic progress lines (the final summary is still printed)",
    )
    run.add_argument(
        "--progress-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between progress log lines when not on a terminal (default 5)",
    )
    run.add_argument(
        "--containers",
        type=int,
        default=1,
        metavar="N",
        help='start N local containers sharing the partitions (needs [checkpoints] type = "redis")',
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port (needs the extra: pip install 'tailrace[prometheus]')",
    )
    run.set_defaults(fn=cmd_run)

    cp = sub.add_parser("checkpoints", help="show or reset a job's committed offsets")
    cps = cp.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = cps.add_parser("show", help="print the committed offset of every partition")
    show.add_argument("job", metavar="JOB", help=job_help)
    show.set_defaults(fn=cmd_show)
    reset = cps.add_parser(
        "reset", help="delete the job's checkpoints: the next run starts every input from the beginning"
    )
    reset.add_argument("job", metavar="JOB", help=job_help)
    reset.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(fn=cmd_reset)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tailrace`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.fn(args))
    except ConfigError as e:
        log.debug("config error", exc_info=True)
        print(f"tailrace: config error: {e}", file=sys.stderr)
        return 2
    except TailraceError as e:
        log.debug("job failed", exc_info=True)
        print(f"tailrace: error: {e}", file=sys.stderr)
        return 1


# -- run ----------------------------------------------------------------------
def _load(args: argparse.Namespace) -> JobSpec:
    overrides = dict(parse_override(item) for item in getattr(args, "config", []))
    return load_job(args.job, overrides, engine=getattr(args, "engine", None))


def cmd_run(args: argparse.Namespace) -> int:
    spec = _load(args)
    if args.containers != 1 or _is_distributed(spec):
        return _run_distributed(args, spec)
    container = spec.container()
    if args.metrics_port is not None:
        _serve_prometheus(container, args.metrics_port)

    done = threading.Event()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = container.run()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            box["error"] = e
        finally:
            done.set()

    stops = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stops
        stops += 1
        name = signal.Signals(signum).name
        if stops == 1:
            print(
                f"\ntailrace: {name}: stopping gracefully (finishing in-flight work, writing a checkpoint); "
                "Ctrl-C again to force",
                file=sys.stderr,
                flush=True,
            )
            container.stop()
        else:
            print(f"\ntailrace: {name} again: forced stop, no final checkpoint", file=sys.stderr, flush=True)
            os._exit(128 + signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    live = args.progress if args.progress is not None else sys.stderr.isatty()
    reporter: _Reporter
    if live:
        reporter = _LiveDisplay(spec, container, sys.stderr)
        interval = 0.25
    else:
        reporter = _LogLines(spec, container, enabled=args.progress is None)
        interval = max(0.05, args.progress_interval)
    started = time.monotonic()
    log.info(
        "running job %r (%s engine) from %s; checkpoints: %s",
        spec.name,
        spec.engine,
        spec.source,
        _store_text(spec),
    )
    _log_resume(spec)
    worker = threading.Thread(target=target, name="tailrace-container")
    worker.start()
    try:
        while not done.wait(interval):
            reporter.tick()
    finally:
        worker.join()
        reporter.close()
        for s, h in old.items():
            signal.signal(s, h)
    if "error" in box:
        raise box["error"]
    result: RunResult = box["result"]
    _print_summary(spec, container, result, time.monotonic() - started, sys.stdout)
    return 0


def _is_distributed(spec: JobSpec) -> bool:
    table = spec.tree.get("checkpoints") or {}
    return isinstance(table, dict) and table.get("type") == "redis"


def _run_distributed(args: argparse.Namespace, spec: JobSpec) -> int:
    """Checkpoints in Redis: run as a member of the job (see tailrace.redis.membership)."""
    from .redis.membership import run_cli

    argv = [sys.executable, "-m", "tailrace", "--log-level", args.log_level, "run", args.job, "--no-progress"]
    if args.engine:
        argv += ["--engine", args.engine]
    for item in args.config:
        argv += ["--config", item]
    return run_cli(spec, lambda: _load(args), args.containers, argv)


def _log_resume(spec: JobSpec) -> None:
    try:
        committed = _committed(spec)
    except (ConfigError, TailraceError):
        return  # a store that cannot list (or a broken one: start-up reports it)
    offsets = {ssp: off for per_task in committed.values() for ssp, off in per_task.items()}
    if not offsets:
        log.info("no checkpoint yet: every input starts from the beginning")
        return
    shown = ", ".join(f"{ssp} after {off!r}" for ssp, off in sorted(offsets.items())[:8])
    more = f" (and {len(offsets) - 8} more)" if len(offsets) > 8 else ""
    log.info("resuming from checkpoint: %s%s", shown, more)


def _store_text(spec: JobSpec) -> str:
    t = spec.tree.get("checkpoints") or {"type": "sqlite"}
    path = getattr(spec.checkpoint_store(), "path", None)
    return f"{t.get('type')} {path}" if path is not None else str(t.get("type"))


class _Reporter:
    def __init__(self, spec: JobSpec, container: Container) -> None:
        self.spec = spec
        self.container = container
        self.t0 = time.monotonic()
        self.last_t = self.t0
        self.last_n = 0

    def snapshot(self) -> tuple[dict[str, TaskMetrics], float, float] | None:
        m = self.container.metrics()
        if m is None:
            return None
        tasks, _ = m
        now = time.monotonic()
        n = sum(t.processed for t in tasks.values())
        rate = (n - self.last_n) / (now - self.last_t) if now > self.last_t else 0.0
        self.last_t, self.last_n = now, n
        return tasks, rate, now - self.t0

    def tick(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _LogLines(_Reporter):
    """Plain periodic progress lines (not on a terminal)."""

    def __init__(self, spec: JobSpec, container: Container, enabled: bool) -> None:
        super().__init__(spec, container)
        self.enabled = enabled

    def tick(self) -> None:
        snap = self.snapshot() if self.enabled else None
        if snap is None:
            return
        tasks, rate, elapsed = snap
        processed = sum(t.processed for t in tasks.values())
        outstanding = sum(t.outstanding for t in tasks.values())
        lag = sum(v for t in tasks.values() for v in t.lag.values())
        log.info(
            "progress: %d processed (%.0f msg/s), %d outstanding, lag %d, %d skipped, %.1f s",
            processed,
            rate,
            outstanding,
            lag,
            sum(self.container.skipped().values()),
            elapsed,
        )


class _LiveDisplay(_Reporter):
    """A redrawn block on a terminal: rates, per-partition committed offsets and lag."""

    def __init__(self, spec: JobSpec, container: Container, out: TextIO) -> None:
        super().__init__(spec, container)
        self.out = out
        self.lines = 0

    def tick(self) -> None:
        snap = self.snapshot()
        if snap is None:
            return
        tasks, rate, elapsed = snap
        skipped = self.container.skipped()
        rows = [
            f"tailrace {self.spec.name} ({self.spec.engine} engine)  {elapsed:7.1f} s",
            f"  processed {sum(t.processed for t in tasks.values()):>12,}   {rate:>10,.0f} msg/s   "
            f"outstanding {sum(t.outstanding for t in tasks.values()):>5}   "
            f"commits {sum(t.commits for t in tasks.values()):>5}   skipped {sum(skipped.values()):>5}",
            f"  {'partition':<28} {'committed':>16} {'lag':>10}",
        ]
        parts = sorted((ssp, t) for t in tasks.values() for ssp in _partitions(t))
        for ssp, t in parts[:_SHOWN_PARTITIONS]:
            committed = t.committed.get(ssp, "-")
            rows.append(f"  {ssp!s:<28} {committed!s:>16} {t.lag.get(ssp, 0):>10,}")
        if len(parts) > _SHOWN_PARTITIONS:
            rows.append(f"  ... and {len(parts) - _SHOWN_PARTITIONS} more partitions")
        text = ""
        if self.lines:
            text += f"\x1b[{self.lines}F"  # back to the first line of the previous block
        text += "".join(f"\x1b[2K{r}\n" for r in rows)
        if len(rows) < self.lines:
            text += "\x1b[0J"
        self.lines = len(rows)
        self.out.write(text)
        self.out.flush()


def _partitions(t: TaskMetrics) -> set[SystemStreamPartition]:
    return set(t.committed) | set(t.lag) | set(t.newest_read)


def _print_summary(
    spec: JobSpec, container: Container, result: RunResult, seconds: float, out: TextIO
) -> None:
    processed = result.processed
    skipped = container.skipped()
    rate = processed / seconds if seconds > 0 else 0.0
    out.write(
        f"job {spec.name!r} finished ({result.reason}) in {seconds:.2f} s: "
        f"{processed:,} messages processed ({rate:,.0f} msg/s), {sum(skipped.values()):,} bad lines skipped\n"
    )
    failed = sum(t.failed for t in result.tasks.values())
    ignored = sum(t.ignored for t in result.tasks.values())
    if failed or ignored:
        out.write(f"  failed {failed}, ignored exceptions {ignored}\n")
    out.write("  committed offsets:\n")
    for ssp, off in sorted(result.committed.items()):
        extra = f"  ({skipped[ssp]} skipped)" if skipped.get(ssp) else ""
        out.write(f"    {ssp!s:<28} {off!s}{extra}\n")
    out.flush()


# -- checkpoints ----------------------------------------------------------------
def _committed(spec: JobSpec) -> dict[str, dict[SystemStreamPartition, Offset]]:
    store = spec.checkpoint_store()
    lister = getattr(store, "committed", None)
    if lister is None:
        raise ConfigError(
            f"checkpoint store type {type(store).__name__} cannot list checkpoints", key="checkpoints.type"
        )
    try:
        return lister(spec.name)
    finally:
        store.close()


def cmd_show(args: argparse.Namespace) -> int:
    spec = _load(args)
    committed = _committed(spec)
    print(f"job {spec.name!r}, checkpoints: {_store_text(spec)}")
    if not committed:
        print("  no checkpoints: the next run starts every input from the beginning")
        return 0
    print(f"  {'task':<16} {'partition':<28} committed offset")
    for task, offsets in committed.items():
        for ssp, off in sorted(offsets.items()):
            print(f"  {task:<16} {ssp!s:<28} {off!r}")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    spec = _load(args)
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("refusing to reset checkpoints without confirmation; pass --yes")
        answer = input(f"delete every checkpoint of job {spec.name!r} ({_store_text(spec)})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 0
    store = spec.checkpoint_store()
    reset = getattr(store, "reset", None)
    if reset is None:
        raise ConfigError(
            f"checkpoint store type {type(store).__name__} cannot be reset", key="checkpoints.type"
        )
    store.open(spec.name)  # takes the job's lock: refused while the job runs
    try:
        n = reset()
    finally:
        store.close()
    print(f"deleted {n} checkpoint rows of job {spec.name!r}; the next run starts from the beginning")
    return 0


# -- prometheus -----------------------------------------------------------------
def _serve_prometheus(container: Container, port: int) -> None:
    try:
        from prometheus_client import start_http_server
        from prometheus_client.core import CollectorRegistry
    except ImportError:
        raise ConfigError(
            "--metrics-port needs prometheus-client: pip install 'tailrace[prometheus]'", key="--metrics-port"
        ) from None
    from .prometheus import ContainerCollector

    registry = CollectorRegistry()
    registry.register(ContainerCollector(container))
    start_http_server(port, registry=registry)
    log.info("Prometheus metrics on http://0.0.0.0:%d/metrics", port)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
