"""Seeded kill -9 trials of a windowed job (issue 35; SEMANTICS rules 20, 25-27, 32-38, mainly
36): a real ``tailrace run`` process over JSON Lines file inputs (3 partitions, so 3 tasks,
each key in one partition as a producer places it), event time from ``task.timestamp.field``,
messages out of order within ``task.watermark.lag.ms`` plus a few far behind (late on
purpose), a short ``task.commit.ms``; a Tumbling window (Fold of count, sum and ids, grace,
``late_output``) and a Session window (Fold with merge, grace, ``late_output``), both written
to file streams; checkpoints (offsets, window state, watermark) in SQLite or in a real
redis-server. Each trial kills the job with SIGKILL at seeded moments (most after outputs
were written, before the end), restarts it until a run ends at end of stream, then checks:

(a) the final result of every window (the last emitted for each (key, start)) is the fold of
    exactly the messages that belong to it and are not late, ids in the order added;
(b) every input message is in exactly one final window per kind or on that kind's late
    stream, never both; copies of a window's result (at-least-once) are identical;
(c) no message is lost, and the late streams hold exactly the messages that are late.

Which messages are late is computed here from the rules: each task reads one partition, so
its watermark before a message is the largest timestamp before it minus the lag (rule 33;
after a restart it resumes from the committed one, which is the same number, rule 36) and a
message is late as windows.py defines it (rule 35: a tumbling window with end + grace <=
watermark; a session when ts + gap + grace < watermark or ts is within the gap of a closed
session of its key). With one partition per task that decision does not depend on how a run
interleaves partitions, so it is the same in every run and the checks can be exact (a task
of several partitions may decide differently after a restart, rule 36: that case is
tests/behaviour/test_windows_property.py's, without kills).

Used by test_window_kills.py; stress mode: ``TAILRACE_WINDOW_TRIALS=200 python -m pytest
tests/jobs/test_window_kills.py`` (trials per engine and store).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .faults import wait_exit as _wait
from .window_checker import GAP_MS, GRACE_MS, SIZE_MS

TASK = Path(__file__).with_name("window_checker.py")
LAG_MS = 400
REDIS_SERVER = shutil.which("redis-server")
STREAMS = ("tumbling", "tumbling_late", "sessions", "sessions_late")
Results = dict[tuple[Any, int], dict[str, Any]]  # (key, start) -> {"end", "value"}


class Redis:
    """A redis-server of its own on a unix socket in ``dir`` (AOF fsync always, no RDB)."""

    def __init__(self, dir: Path) -> None:
        assert REDIS_SERVER is not None
        dir.mkdir(parents=True, exist_ok=True)
        self.sock = str(dir / "redis.sock")
        self.url = f"unix://{self.sock}?db=0"
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--dir", str(dir), "--save", "", "--appendonly", "yes", "--appendfsync",
             "always", "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--loglevel", "warning", "--logfile", str(dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis.from_url(self.url) as c:
                    c.ping()
                return
            except Exception:  # noqa: BLE001 - not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"redis-server did not start in {dir}") from None
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@dataclass
class WindowJob:
    """The job in ``root``: 'partitions' input files of 'records' lines, 'keys' keys each."""

    root: Path
    seed: int
    store: str = "sqlite"  # or a redis URL
    partitions: int = 3
    records: int = 160
    keys: int = 3
    late_rate: float = 0.04
    commit_ms: int = 10
    rows: list[list[dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        d = self.root / "data" / "in"
        d.mkdir(parents=True)
        for p in range(self.partitions):
            rows, t = [], 1_700_000_000_000 + rng.randrange(-5000, 5000)
            for i in range(self.records):
                t += rng.choice((0, 10, 50, 100, 200, 300)) + (2500 if rng.random() < 0.04 else 0)
                if rng.random() < self.late_rate:
                    ts = t - LAG_MS - rng.randrange(0, 3 * SIZE_MS)  # far behind: late, or not
                else:
                    ts = t - rng.randrange(LAG_MS)  # out of order within the lag: never late
                rows.append({"id": f"{p}-{i}", "k": f"p{p}k{rng.randrange(self.keys)}", "ts": ts,
                             "v": rng.randrange(100)})  # fmt: skip
            (d / f"partition-{p}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            self.rows.append(rows)
        if self.store == "sqlite":
            inputs, redis = "files.in", ""
            checkpoints = 'type = "sqlite"\npath = "state/checkpoints.db"'
        else:  # a job with Redis checkpoints reads Redis streams: the same lines, one entry each
            from tailrace.redis import RedisSystem

            system = RedisSystem("redis", self.store, prefix=self.root.name)
            try:
                system.create_stream("in", self.partitions)
                for p, rows in enumerate(self.rows):
                    for r in rows:
                        system.append("in", p, r, key=r["k"])
                system.end_stream("in")
            finally:
                system.close()
            inputs = "redis.in"
            redis = f'[systems.redis]\ntype = "redis"\nurl = "{self.store}"\nprefix = "{self.root.name}"\n'
            checkpoints = f'type = "redis"\nurl = "{self.store}"\nlease_ms = 300'
        (self.root / "job.toml").write_text(
            f"""
[job]
name = "windows-{self.root.name}"
task = "{TASK.as_posix()}:WindowChecker"
inputs = ["{inputs}"]

[config]
"task.commit.ms" = {self.commit_ms}
"task.timestamp.field" = "ts"
"task.watermark.lag.ms" = {LAG_MS}

{redis}
[systems.files]
type = "file"
path = "data"
output_partitions = 2

[checkpoints]
{checkpoints}
"""
        )

    def start(self, engine: str, delay_ms: float) -> subprocess.Popen[bytes]:
        env = dict(os.environ, CHECKER_DELAY_MS=str(delay_ms))
        return subprocess.Popen(
            [sys.executable, "-m", "tailrace", "run", str(self.root), "--engine", engine, "--no-progress"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def lines(self, stream: str) -> list[dict[str, Any]]:
        """The complete lines of an output stream (a partial last one is a killed write)."""
        out: list[dict[str, Any]] = []
        for f in sorted((self.root / "data" / stream).glob("partition-*.jsonl")):
            out.extend(json.loads(line) for line in f.read_bytes().split(b"\n")[:-1])
        return out

    def written(self) -> int:
        return sum(len(self.lines(s)) for s in STREAMS)

    # the model ----------------------------------------------------------------------------
    def expected(self) -> tuple[Results, set[str], Results, set[str]]:
        """The final results a run without a crash must give, computed from the rules:
        tumbling windows by (key, start), the ids late for them, sessions by (key, start)
        and the ids late for them (each result ``{"end", "value"}``)."""
        tumbling: dict[tuple[Any, int], dict[str, Any]] = {}
        sessions: dict[Any, list[list[Any]]] = defaultdict(list)  # key -> [start, last, acc] by start
        t_late: set[str] = set()
        s_late: set[str] = set()
        gap, grace = GAP_MS, GRACE_MS
        for rows in self.rows:  # one task per partition: its own watermark
            watermark = -float("inf")
            for m in rows:
                ts, key = m["ts"], m["k"]
                start = ts - ts % SIZE_MS
                if start + SIZE_MS + grace <= watermark:
                    t_late.add(m["id"])
                else:
                    w = tumbling.setdefault((key, start), {"end": start + SIZE_MS, "value": _initial()})
                    w["value"] = _add(w["value"], m)
                near = [s for s in sessions[key] if s[0] - gap <= ts <= s[1] + gap]
                if ts + gap + grace < watermark or any(s[1] + gap + grace < watermark for s in near):
                    s_late.add(m["id"])
                else:
                    if near:
                        acc = near[0][2]
                        for s in near[1:]:
                            acc = _merge(acc, s[2])
                        session = [min(ts, near[0][0]), max(ts, *(s[1] for s in near)), acc]
                    else:
                        session = [ts, ts, _initial()]
                    session[2] = _add(session[2], m)
                    rest = [s for s in sessions[key] if s not in near]
                    sessions[key] = sorted([*rest, session], key=lambda s: s[0])
                watermark = max(watermark, ts - LAG_MS)
        by_start = {(key, s[0]): {"end": s[1], "value": s[2]} for key, ss in sessions.items() for s in ss}
        return tumbling, t_late, by_start, s_late


def _initial() -> dict[str, Any]:
    return {"n": 0, "sum": 0, "ids": []}


def _add(acc: dict[str, Any], m: dict[str, Any]) -> dict[str, Any]:
    return {"n": acc["n"] + 1, "sum": acc["sum"] + m["v"], "ids": [*acc["ids"], m["id"]]}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"n": a["n"] + b["n"], "sum": a["sum"] + b["sum"], "ids": a["ids"] + b["ids"]}


@dataclass
class TrialResult:
    kills: int
    mid_run_kills: int  # kills that landed after some window result was written, before the end
    late: int  # messages late for some window kind (by the model)
    duplicates: int  # copies beyond the first of window results
    errors: list[str]


def window_trial(
    root: Path, engine: str, rng: random.Random, *, store: str = "sqlite", max_kills: int = 3,
    delay_ms: float = 1.0, **job: Any,
) -> TrialResult:  # fmt: skip
    """Kill -9 the job 1..max_kills times at seeded moments, run it to its end, check (a)-(c)."""
    w = WindowJob(root, rng.randrange(1 << 30), store, **job)
    errors: list[str] = []
    kills = mid = 0
    for _ in range(rng.randint(1, max_kills)):
        proc = w.start(engine, delay_ms)
        try:
            if rng.random() < 0.15:
                time.sleep(rng.uniform(0.0, 0.3))  # maybe before anything is read or committed
            else:
                target = w.written() + rng.randrange(1, 60)
                deadline = time.monotonic() + 30
                while w.written() < target and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.003)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            rc, err = _wait(proc)
        if rc == 0:
            break  # it ended before the kill: that was the last run
        if rc != -signal.SIGKILL:
            return TrialResult(kills, mid, 0, 0, [f"run {kills + 1} exited with {rc}: {err[-2000:]}"])
        kills += 1
        mid += w.written() > 0
    else:
        rc, err = _wait(w.start(engine, delay_ms))
        if rc != 0:
            return TrialResult(kills, mid, 0, 0, [f"the last run exited with {rc}: {err[-2000:]}"])
    tumbling, t_late, sessions, s_late = w.expected()
    ids = {m["id"] for rows in w.rows for m in rows}
    duplicates = 0
    for kind, want, late in (("tumbling", tumbling, t_late), ("sessions", sessions, s_late)):
        final: dict[tuple[Any, int], dict[str, Any]] = {}
        for r in w.lines(kind):
            if r["final"] is not True:
                errors.append(f"{kind}: a result that is not final: {r}")
            got = {"end": r["end"], "value": r["value"]}
            before = final.get((r["key"], r["start"]))
            if before is not None:
                duplicates += 1
                if before != got:  # (b): at-least-once copies must be the same result
                    errors.append(f"{kind} window {(r['key'], r['start'])} written twice differently: "
                                  f"{_short(before)} then {_short(got)}")  # fmt: skip
            final[r["key"], r["start"]] = got
        for wkey in sorted(set(final) | set(want), key=repr):  # (a)
            if final.get(wkey) != want.get(wkey):
                got_, want_ = _short(final.get(wkey)), _short(want.get(wkey))
                errors.append(f"{kind} window {wkey}: got {got_}, want {want_}")
        for wkey, r in final.items():
            v = r["value"]
            if v["n"] != len(v["ids"]):
                errors.append(f"{kind} window {wkey}: n {v['n']} but {len(v['ids'])} ids")
        reported = [x["message"]["id"] for x in w.lines(kind + "_late")]
        for x in w.lines(kind + "_late"):
            if x["message"]["ts"] != x["timestamp"]:
                errors.append(f"{kind}: a late line with the wrong timestamp: {x}")
        if set(reported) != late:  # (c) and the late decisions
            errors.append(f"{kind}: late {sorted(set(reported) - late)[:5]} not late by the rules, "
                          f"{sorted(late - set(reported))[:5]} late but not reported")  # fmt: skip
        seen: dict[str, int] = defaultdict(int)
        for r in final.values():
            for i in r["value"]["ids"]:
                seen[i] += 1
        for i in set(reported):
            seen[i] += 1
        wrong = {i: seen.get(i, 0) for i in ids | set(seen) if seen.get(i, 0) != 1}
        if wrong:  # (b), (c)
            errors.append(f"{kind}: messages not in exactly one window or late (id: times): "
                          f"{dict(sorted(wrong.items())[:8])}")  # fmt: skip
    return TrialResult(kills, mid, len(t_late | s_late), duplicates, errors)


def _short(r: dict[str, Any] | None) -> str:
    if r is None:
        return "nothing"
    v = r["value"]
    return f"end {r['end']} n {v['n']} sum {v['sum']} ids {v['ids'][:6]}{'...' if len(v['ids']) > 6 else ''}"
