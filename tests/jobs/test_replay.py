"""``tailrace replay``: dead letters back to the partitions they came from (docs/bad-messages.md,
"Replaying dead letters after a fix"), end to end through real ``tailrace`` processes."""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

from tailrace.files import read_stream
from tailrace.sqlite import SqliteCheckpointStore

from .conftest import run_cli

TASK = """
import tailrace

class Sums(tailrace.StreamTask):
    def init(self, context):
        self.sums = context.store("sums")

    def process(self, envelope, collector, coordinator):
        m = envelope.message
        amount = {AMOUNT}
        self.sums[m["user"]] = self.sums.get(m["user"], 0) + amount
        collector.send("files.totals", {{"user": m["user"], "amount": amount, "id": m["id"]}}, key=m["user"])
"""
BROKEN = 'm["amount"]'
FIXED = 'm["amount"] if "amount" in m else m["amont"]'


def _example(tmp_path: Path, partitions: int = 2, records: int = 50) -> tuple[Path, list[dict[str, object]]]:
    """The worked example: sums per user, a few records spelling ``amont``."""
    d = tmp_path / "data" / "clicks"
    d.mkdir(parents=True)
    inputs: list[dict[str, object]] = []
    for p in range(partitions):
        with open(d / f"partition-{p}.jsonl", "w") as f:
            for i in range(records):
                m: dict[str, object] = {"user": f"u{i % 5}", "id": f"{p}-{i}"}
                m["amont" if i % 17 == 3 else "amount"] = i + p
                inputs.append(m)
                f.write(json.dumps(m) + "\n")
    (tmp_path / "task.py").write_text(TASK.format(AMOUNT=BROKEN))
    (tmp_path / "job.toml").write_text(
        """
[job]
name = "sums"
task = "task.py:Sums"
inputs = ["files.clicks"]

[config]
"task.error.policy" = "dead-letter"
"task.error.stream" = "files.dead-letters"

[systems.files]
type = "file"
path = "data"
key_field = "user"

[checkpoints]
type = "sqlite"
path = "state/checkpoints.db"

[stores.sums]
"""
    )
    return tmp_path / "job.toml", inputs


def _sums(tmp_path: Path) -> dict[str, int]:
    store = SqliteCheckpointStore(tmp_path / "state" / "checkpoints.db")
    store.open("sums")
    try:
        out: dict[str, int] = {}
        for task in ("Partition 0", "Partition 1"):
            for k, v in store.state_scan(task, "sums"):
                out[json.loads(k)] = out.get(json.loads(k), 0) + json.loads(v)
    finally:
        store.close()
    return out


def test_the_worked_example_replays_the_dead_letters_after_the_fix(engine: str, tmp_path: Path) -> None:
    job, inputs = _example(tmp_path)
    bad = [m for m in inputs if "amont" in m]
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert f"{len(bad)} bad messages dead-lettered" in r.stdout, r.stdout
    letters = [x for part in read_stream(tmp_path / "data" / "dead-letters") for x in part]
    assert sorted(json.loads(x["bytes"])["id"] for x in letters) == sorted(str(m["id"]) for m in bad)
    assert {x["error"]["type"] for x in letters} == {"KeyError"}

    (tmp_path / "task.py").write_text(TASK.format(AMOUNT=FIXED))  # the fix
    r = run_cli(["replay", str(job), str(tmp_path / "data" / "dead-letters")])
    assert r.returncode == 0, r.stderr
    per_partition = Counter(int(str(m["id"]).split("-")[0]) for m in bad)
    assert f"appended {len(bad)} messages of {len(bad)} dead letters" in r.stdout, r.stdout
    for p, n in per_partition.items():
        assert f"files.clicks[{p}]: {n}\n" in r.stdout, r.stdout
    (tmp_path / "data" / "dead-letters").rename(tmp_path / "replayed")  # moved aside, as the doc says

    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "dead-lettered" not in r.stdout, r.stdout
    assert not (tmp_path / "data" / "dead-letters").exists()
    # every input exactly once in the outputs, and the state folds them all
    totals = [x for part in read_stream(tmp_path / "data" / "totals") for x in part]
    assert Counter(t["id"] for t in totals) == Counter(m["id"] for m in inputs)
    expected: Counter[str] = Counter()
    for m in inputs:
        expected[str(m["user"])] += int(m.get("amount", m.get("amont")))  # type: ignore[call-overload]
    assert _sums(tmp_path) == dict(expected)


def _letters_file(tmp_path: Path, letters: list[dict[str, object]]) -> Path:
    path = tmp_path / "letters.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in letters))
    return path


def _letter(partition: int, offset: int, **message: object) -> dict[str, object]:
    letter: dict[str, object] = {
        "system": "files",
        "stream": "clicks",
        "partition": partition,
        "offset": offset,
    }
    letter.update(message)
    return letter


def test_replay_appends_bytes_base64_and_values_once_each_and_dry_run_appends_nothing(tmp_path: Path) -> None:
    job, _ = _example(tmp_path, records=3)
    before = [(tmp_path / "data" / "clicks" / f"partition-{p}.jsonl").read_bytes() for p in range(2)]
    raw = b'{"user": "u9", "amount": 1, "id": "x"}'
    letters = _letters_file(
        tmp_path,
        [
            _letter(0, 7, bytes=raw.decode()),
            _letter(1, 8, bytes_base64=base64.b64encode(b"\xff not UTF-8").decode()),
            _letter(1, 9, value={"user": "u8", "amount": 2, "id": "y"}),
            _letter(0, 7, bytes=raw.decode()),  # dead-lettered twice (a crash before the commit)
        ],
    )
    r = run_cli(["replay", str(job), str(letters), "--dry-run"])
    assert r.returncode == 0, r.stderr
    assert "would append 3 messages of 4 dead letters" in r.stdout, r.stdout
    assert "1 duplicate skipped" in r.stdout and "dry run: nothing was appended" in r.stdout, r.stdout
    after = [(tmp_path / "data" / "clicks" / f"partition-{p}.jsonl").read_bytes() for p in range(2)]
    assert after == before
    r = run_cli(["replay", str(job), str(letters)])
    assert r.returncode == 0, r.stderr
    assert "files.clicks[0]: 1\n" in r.stdout and "files.clicks[1]: 2\n" in r.stdout, r.stdout
    after = [(tmp_path / "data" / "clicks" / f"partition-{p}.jsonl").read_bytes() for p in range(2)]
    assert after[0] == before[0] + raw + b"\n"
    assert after[1] == before[1] + b"\xff not UTF-8\n" + b'{"user":"u8","amount":2,"id":"y"}\n'


def test_replay_to_another_stream_keeps_the_partition_modulo_its_count(tmp_path: Path) -> None:
    job, _ = _example(tmp_path, records=3)
    other = tmp_path / "data" / "retry"
    other.mkdir()
    (other / "partition-0.jsonl").write_text('{"user": "u0", "amount": 0, "id": "first"}')  # no newline
    letters = _letters_file(tmp_path, [_letter(1, 5, value={"id": "a"}), _letter(0, 6, value={"id": "b"})])
    r = run_cli(["replay", str(job), str(letters), "--stream", "files.retry"])
    assert r.returncode == 0, r.stderr
    assert "files.retry[0]: 2\n" in r.stdout, r.stdout
    # the last line gets its newline first: the appended ones are lines of their own
    assert (other / "partition-0.jsonl").read_text().splitlines()[1:] == ['{"id":"a"}', '{"id":"b"}']


def test_replay_refuses_a_letter_it_cannot_place_naming_its_line_and_appends_nothing(tmp_path: Path) -> None:
    job, _ = _example(tmp_path, records=3)
    before = [(tmp_path / "data" / "clicks" / f"partition-{p}.jsonl").read_bytes() for p in range(2)]
    good = _letter(0, 1, value={"id": "ok"})
    cases = [
        ({"stream": "clicks", "partition": 0, "value": 1}, "letters.jsonl:2: dead letter without 'system'"),
        ({**good, "partition": None}, "letters.jsonl:2: dead letter without 'partition'"),
        ({**good, "partition": -1}, "letters.jsonl:2: dead letter with partition -1"),
        (
            {**good, "system": "kafka"},
            "the job (" + str(job) + ") has no system 'kafka' (its systems: files)",
        ),
        ({**good, "stream": "views"}, "files.views is not an input of the job"),
        ({**good, "partition": 5}, "stream files.clicks has 2 partitions, no partition 5"),
        (_letter(0, 2, bytes="two\nlines"), "its message holds a newline"),
        (_letter(0, 3), "dead letter without its message"),
        ({**good, "bytes_base64": "not base64!"}, "'bytes_base64' is not base64"),
    ]
    for letter, expected in cases:
        letters = _letters_file(tmp_path, [good, letter])
        r = run_cli(["replay", str(job), str(letters)])
        assert r.returncode == 1, (letter, r.stdout, r.stderr)
        assert expected in r.stderr, (letter, r.stderr)
        assert "letters.jsonl:2:" in r.stderr, r.stderr
    (tmp_path / "letters.jsonl").write_text(json.dumps(good) + "\n{not json\n" + json.dumps(good) + "\n")
    r = run_cli(["replay", str(job), str(tmp_path / "letters.jsonl")])
    assert r.returncode == 1 and "letters.jsonl:2: line is not valid JSON" in r.stderr, r.stderr
    after = [(tmp_path / "data" / "clicks" / f"partition-{p}.jsonl").read_bytes() for p in range(2)]
    assert after == before  # nothing appended by any refused replay
    r = run_cli(["replay", str(job), str(tmp_path / "letters.jsonl"), "--stream", "mem.x"])
    assert r.returncode == 2 and "the job has no system 'mem'" in r.stderr, r.stderr
    r = run_cli(["replay", str(job), str(tmp_path / "nowhere")])
    assert r.returncode == 2 and "nowhere: no such file or directory" in r.stderr, r.stderr
