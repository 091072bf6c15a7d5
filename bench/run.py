"""tailrace benchmark suite: every workload on every engine, in one process.

    python bench/run.py                 # full: ~1-3 s per measurement, best of 3
    python bench/run.py --quick         # ~0.3 s per measurement, best of 2 (about a minute)
    python bench/run.py --json out.json --plot out.png
    python bench/run.py --workloads sync_noop_1task,async_inline --engines c,floor

Engines: ``c`` and ``python`` (tailrace's two engines), ``floor`` (a bare Python
loop calling the same task's ``process`` with prebuilt arguments: the cost of the
user's code alone), and peers (``bytewax``) when installed. An engine or peer that
cannot be imported is skipped with a printed note. The message count of each
measurement is calibrated from a probe run so that it takes about the target
time (capped at --max-messages); messages/s is what is compared. Target misses
are reported, never turned into a failing exit status; a run that loses or
duplicates messages is (exit status 1).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

try:
    from runners import BenchError, Runner, Unsupported, all_runners
    from workloads import WORKLOADS, Workload
except Exception as _e:  # noqa: BLE001 - tailrace itself (and its compiled core) must import
    sys.exit(
        f"bench: tailrace is not importable ({type(_e).__name__}: {_e}); install it first: pip install ."
    )

DEFAULT_ENGINES = ("c", "python", "floor", "bytewax")


@dataclass
class Result:
    workload: str
    engine: str
    messages: int
    seconds: float
    msgs_per_s: float


@dataclass
class Skip:
    workload: str
    engine: str
    reason: str


@dataclass(frozen=True)
class Settings:
    target_s: float
    repeats: int
    max_messages: int
    messages: int | None  # fixed count (no calibration) when set
    timeout_s: float


# -- measuring ------------------------------------------------------------------
def _nice(n: float, multiple: int) -> int:
    """``n`` rounded to two significant digits and up to a multiple of ``multiple``."""
    n = max(n, 1.0)
    scale = 10 ** max(0, int(math.log10(n)) - 1)
    r = int(round(n / scale) * scale)
    return max(multiple, -(-r // multiple) * multiple)


def calibrate(runner: Runner, workload: Workload, settings: Settings) -> int:
    """Message count for one measurement of about ``settings.target_s`` seconds.

    Probe runs grow (from 1000 messages, at least 2 per task) until one takes a
    quarter of the target; they double as warm-up.
    """
    parts = workload.partitions
    cap = runner.max_messages(settings.max_messages)
    n = max(1000, 2 * parts)
    while True:
        done, seconds = runner.run(workload, n, settings.timeout_s)
        if seconds >= settings.target_s / 4 or done >= cap:
            break
        grow = 8.0 if seconds <= 0 else min(8.0, max(2.0, 0.4 * settings.target_s / seconds))
        n = min(cap, int(n * grow))
    return min(_nice(done / max(seconds, 1e-9) * settings.target_s, parts), max(cap, parts))


def measure(runner: Runner, workload: Workload, settings: Settings) -> Result:
    """Best of ``settings.repeats`` runs at a calibrated (or the fixed) message count.

    When calibrated and the first timed run is under half the target (a
    probe that was slowed by warm-up), the count is rescaled once and the
    repeats start over.
    """
    fixed = settings.messages is not None
    n = max(settings.messages or 0, workload.partitions) if fixed else calibrate(runner, workload, settings)
    cap = runner.max_messages(settings.max_messages)
    rescaled = fixed
    best: tuple[int, float] | None = None
    k = 0
    while k < settings.repeats:
        done, seconds = runner.run(workload, n, settings.timeout_s)
        if not rescaled and seconds < settings.target_s / 2 and n < cap:
            rescaled = True
            n = min(_nice(n * settings.target_s / max(seconds, 1e-9), workload.partitions), cap)
            continue
        rescaled = True
        if best is None or done / seconds > best[0] / best[1]:
            best = (done, seconds)
        k += 1
    assert best is not None
    done, seconds = best
    return Result(workload.name, runner.name, done, seconds, done / seconds)


# -- machine --------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(HERE), *args], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine_info(runners: Sequence[Runner]) -> dict[str, Any]:
    """Where and what was measured."""
    try:
        import tailrace

        version: str | None = tailrace.__version__
    except Exception:  # noqa: BLE001 - reported as null
        version = None
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "tailrace": version,
        "git_commit": None if commit is None else commit + ("-dirty" if dirty else ""),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "peers": {r.name: r.version() for r in runners if r.kind == "peer"},
    }
    return info


# -- reporting ------------------------------------------------------------------
def _rate(results: Sequence[Result], workload: str, engine: str) -> float | None:
    for r in results:
        if r.workload == workload and r.engine == engine:
            return r.msgs_per_s
    return None


def _fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def table(results: Sequence[Result]) -> str:
    """The results as a text table; ratios are msgs/s of the row over the floor's / python's."""
    head = ("workload", "engine", "messages", "seconds", "msgs/s", "us/msg", "vs floor", "vs python")
    rows = [head]
    for r in results:
        floor = _rate(results, r.workload, "floor")
        py = _rate(results, r.workload, "python")
        rows.append(
            (
                r.workload,
                r.engine,
                f"{r.messages:,}",
                f"{r.seconds:.4f}",
                _fmt_rate(r.msgs_per_s),
                f"{1e6 / r.msgs_per_s:.3f}",
                "" if floor is None or r.engine == "floor" else f"{r.msgs_per_s / floor:.3g}x",
                "" if py is None or r.engine == "python" else f"{r.msgs_per_s / py:.3g}x",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for k, row in enumerate(rows):
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _check(
    target: str, value: float | None, limit: float, *, at_least: bool, unit: str = "x"
) -> dict[str, Any]:
    """One target: ``value`` (None when not measured) against ``limit``."""
    chk: dict[str, Any] = {
        "target": target,
        "ratio": value,
        "limit": limit,
        "pass": None if value is None else (value >= limit if at_least else value <= limit),
    }
    if unit != "x":
        chk["unit"] = unit
    return chk


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _us(rate: float | None) -> float | None:
    return None if rate is None else 1e6 / rate


def target_checks(results: Sequence[Result]) -> list[dict[str, Any]]:
    """The issues' targets (engine vs python and floor, the run loop's ratios, asyncio), in this run."""
    w = "sync_noop_1task"
    c, py, floor = (_rate(results, w, e) for e in ("c", "python", "floor"))
    checks = [
        _check("c >= 10x python on sync_noop_1task", _ratio(c, py), 10.0, at_least=True),
        _check(
            "c within 3x of floor on sync_noop_1task (floor msgs/s / c msgs/s <= 3)",
            _ratio(floor, c),
            3.0,
            at_least=False,
        ),
        # the run loop (issue 3), all on the C engine: ratios of per-message costs in this run
        _check(
            "c on sync_noop_1024tasks within 1.3x per message of sync_noop_1task",
            _ratio(c, _rate(results, "sync_noop_1024tasks", "c")),
            1.3,
            at_least=False,
        ),
        _check(
            "c on async_inline within 2x per message of sync_noop_1task",
            _ratio(c, _rate(results, "async_inline", "c")),
            2.0,
            at_least=False,
        ),
    ]
    for workload, limit in (("async_thread_c64", 1.0), ("pool4_sync", 3.0)):
        per = _us(_rate(results, workload, "c"))
        checks.append(
            _check(f"{workload} on c at most {limit:g} us/msg", per, limit, at_least=False, unit="us/msg")
        )
    # async def tasks (issue 6): the inline cost on the C engine, and asyncio_io against
    # Little's law: 4 tasks x 32 in flight / 10 ms = 12,800 msgs/s is the ceiling.
    us = _us(_rate(results, "asyncio_inline", "c"))
    checks.append(_check("asyncio_inline on c at most 1.5 us/msg", us, 1.5, at_least=False, unit="us/msg"))
    for engine in ("c", "python"):
        io = _rate(results, "asyncio_io", engine)
        checks.append(
            _check(
                f"asyncio_io on {engine} >= 90% of 12,800 msgs/s (fraction of the bound)",
                None if io is None else io / 12_800,
                0.9,
                at_least=True,
            )
        )
    # per-key ordering (issue 17): key lanes against partition ordering, same job
    keyed = _rate(results, "asyncio_io_keyed", "c")
    checks.append(
        _check(
            "asyncio_io_keyed on c >= 80% of ordering partition at concurrency 64",
            _ratio(keyed, _rate(results, "asyncio_io_keyed_p64", "c")),
            0.8,
            at_least=True,
        )
    )
    checks.append(
        _check(
            "asyncio_io_keyed on c >= 5x ordering partition at concurrency 1",
            _ratio(keyed, _rate(results, "asyncio_io_keyed_p1", "c")),
            5.0,
            at_least=True,
        )
    )
    # state stores (issue 12 asked 2x, issue 34 1.5x): the same counting job with a store
    # instead of a dict
    checks.append(
        _check(
            "c on sync_state_16tasks_store within 1.5x per message of sync_state_16tasks",
            _ratio(
                _rate(results, "sync_state_16tasks", "c"), _rate(results, "sync_state_16tasks_store", "c")
            ),
            1.5,
            at_least=False,
        )
    )
    return checks


def plot(results: Sequence[Result], engines: Sequence[str], path: Path, title: str) -> str | None:
    """Grouped bars (msgs/s, log scale) per workload and engine; a note when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot needs matplotlib (`pip install matplotlib`); no chart written"
    workloads = list(dict.fromkeys(r.workload for r in results))
    shown = [e for e in engines if any(r.engine == e for r in results)]
    if not workloads or not shown:
        return "nothing measured; no chart written"
    fig, ax = plt.subplots(figsize=(max(8.0, 1.3 * len(workloads) + 2), 5.5))
    width = 0.8 / len(shown)
    colors = {e: f"C{i}" for i, e in enumerate(DEFAULT_ENGINES)}
    for k, engine in enumerate(shown):
        xs, ys = [], []
        for i, w in enumerate(workloads):
            rate = _rate(results, w, engine)
            if rate is not None:
                xs.append(i - 0.4 + width * (k + 0.5))
                ys.append(rate)
        ax.bar(xs, ys, width, label=engine, color=colors.get(engine))
    ax.set_yscale("log")
    ax.set_ylabel("messages / s (log scale)")
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads, rotation=30, ha="right")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# -- main -----------------------------------------------------------------------
def _names(value: str, known: Sequence[str], what: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    runners = all_runners()
    parser = argparse.ArgumentParser(
        prog="bench/run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~0.3 s per measurement, best of 2")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write machine info and results as JSON")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="write a PNG bar chart (needs matplotlib)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list (default: all)")
    parser.add_argument(
        "--engines", default=",".join(DEFAULT_ENGINES), help="comma list (default: %(default)s)"
    )
    parser.add_argument(
        "--messages", type=int, help="fixed message count per measurement (skips calibration)"
    )
    parser.add_argument("--repeats", type=int, help="runs per measurement, best kept (default: 3, quick: 2)")
    parser.add_argument("--seconds", type=float, help="target seconds per run (default: 1.5, quick: 0.3)")
    parser.add_argument(
        "--max-messages", type=int, help="cap per engine run (default: 10,000,000; quick: 3,000,000)"
    )
    parser.add_argument("--list", action="store_true", help="list workloads and engines, then exit")
    args = parser.parse_args(argv)

    if args.list:
        for w in WORKLOADS.values():
            floor = f"floor: {w.floor}" if w.floor else "no floor"
            print(f"{w.name:<22} {w.doc} ({floor}{'; guarded' if w.guard else ''})")
        print("engines:", ", ".join(runners))
        return 0
    workloads = [WORKLOADS[n] for n in _names(args.workloads, list(WORKLOADS), "workload")]
    engines = _names(args.engines, list(runners), "engine")
    if args.messages is not None and args.messages < 1:
        raise SystemExit("--messages must be >= 1")
    settings = Settings(
        target_s=args.seconds or (0.3 if args.quick else 1.5),
        repeats=max(1, args.repeats or (2 if args.quick else 3)),
        max_messages=args.max_messages or (3_000_000 if args.quick else 10_000_000),
        messages=args.messages,
        timeout_s=120.0,
    )

    machine = machine_info(list(runners.values()))
    results: list[Result] = []
    skips: list[Skip] = []
    errors: list[Skip] = []
    active: list[Runner] = []
    for name in engines:
        runner = runners[name]
        note = runner.unavailable()
        if note is None:
            active.append(runner)
        else:
            skips.append(Skip("*", name, note))
            print(f"note: skipping {name}: {note}", flush=True)

    how = (
        f"{settings.messages:,} messages per run"
        if settings.messages is not None
        else f"~{settings.target_s:g} s per run (calibrated, at most {settings.max_messages:,} messages)"
    )
    print(
        f"tailrace bench: {len(workloads)} workloads x {len(active)} engines; "
        f"{how}, best of {settings.repeats}"
    )
    for w in workloads:
        for runner in active:
            if not runner.supports(w):
                continue
            try:
                res = measure(runner, w, settings)
            except Unsupported as e:
                skips.append(Skip(w.name, runner.name, str(e)))
                print(f"  {w.name:<22} {runner.name:<8} skipped (see the notes below)", flush=True)
                continue
            except (BenchError, Exception) as e:  # noqa: BLE001 - one broken engine must not hide the others
                errors.append(Skip(w.name, runner.name, f"{type(e).__name__}: {e}"))
                print(f"  {w.name:<22} {runner.name:<8} ERROR {type(e).__name__}: {e}", flush=True)
                continue
            results.append(res)
            print(
                f"  {w.name:<22} {runner.name:<8} {_fmt_rate(res.msgs_per_s):>8} msgs/s "
                f"({res.messages:,} in {res.seconds:.4f} s)",
                flush=True,
            )

    print()
    print(table(results))
    print(f"\n(best of {settings.repeats} runs each; ratios: msgs/s of the row / msgs/s of floor or python)")
    checks = target_checks(results)
    print("\ntargets:")
    for chk in checks:
        if chk["pass"] is None:
            print(f"  n/a   {chk['target']} (not measured in this run)")
        else:
            unit = f" {chk['unit']}" if "unit" in chk else "x"
            print(f"  {'PASS' if chk['pass'] else 'MISS'}  {chk['target']}: {chk['ratio']:.2f}{unit}")
    for s in skips:
        if s.workload != "*":
            print(f"note: {s.workload} on {s.engine} skipped: {s.reason}")
    for s in skips:
        if s.workload == "*":
            print(f"note: {s.engine} not measured: {s.reason}")
    for err in errors:
        print(f"ERROR: {err.workload} on {err.engine}: {err.reason}")

    if args.json is not None:
        doc = {
            "machine": machine,
            "settings": asdict(settings),
            "results": [asdict(r) for r in results],
            "skipped": [asdict(s) for s in skips],
            "errors": [asdict(err) for err in errors],
            "targets": checks,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if args.plot is not None:
        title = f"tailrace bench: {machine['cpu']}, Python {machine['python']}, {machine['date']}"
        note = plot(results, engines, args.plot, title)
        print(f"note: {note}" if note else f"wrote {args.plot}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
