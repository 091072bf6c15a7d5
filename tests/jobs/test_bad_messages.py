"""Bad messages in file jobs with SQLite checkpoints (rules 39, 40): the regressions of issue
36's findings and the dead letters of a real job, end to end through ``tailrace run``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tailrace.files import read_stream
from tailrace.sqlite import SqliteCheckpointStore

from .conftest import run_cli

TASK = """
import tailrace

class Count(tailrace.StreamTask):
    def init(self, context):
        self.n = context.store("n")

    def process(self, envelope, collector, coordinator):
        u = envelope.message["user"]
        self.n[u] = self.n.get(u, 0) + 1
        if envelope.message.get("amount") == "boom":
            raise ValueError("amount is not a number: " + envelope.message["amount"])
        collector.send("files.out", {"user": u, "i": envelope.message["i"]}, key=u)
"""


def _job(tmp_path: Path, ordering: str, config: str = "", bad_at: tuple[int, int] = (0, 30)) -> Path:
    d = tmp_path / "data" / "ev"
    d.mkdir(parents=True)
    for p in range(2):
        with open(d / f"partition-{p}.jsonl", "w") as f:
            for i in range(300):
                if (p, i) == bad_at:
                    f.write('{"user": "u1", "amount": \n')
                elif (p, i) == (1, 200):
                    f.write(json.dumps({"user": "u2", "i": i, "amount": "boom"}) + "\n")
                else:
                    f.write(json.dumps({"user": f"u{i % 7}", "i": i}) + "\n")
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "job.toml").write_text(
        f"""
[job]
name = "badline"
task = "task.py:Count"
inputs = ["files.ev"]

[config]
"task.commit.ms" = 600000
"task.ordering" = "{ordering}"
{config}

[systems.files]
type = "file"
path = "data"
key_field = "user"

[checkpoints]
type = "sqlite"
path = "state/checkpoints.db"

[stores.n]
"""
    )
    return tmp_path / "job.toml"


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_a_bad_line_costs_nothing_before_it_its_commit(engine: str, tmp_path: Path, ordering: str) -> None:
    # issue 36's finding (../shared/repro/bad-messages/key_ordering_bad_line.sh): with
    # task.ordering = key and a store, a malformed line committed nothing in any partition;
    # rule 40: everything before it in its partition is committed, with or without key ordering
    job = _job(tmp_path, ordering)
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1, r.stderr
    assert "partition-0.jsonl:31: line is not valid JSON" in r.stderr, r.stderr
    shown = run_cli(["checkpoints", "show", str(job)]).stdout
    line_30 = sum(len(json.dumps({"user": f"u{i % 7}", "i": i})) + 1 for i in range(29))
    assert re.search(rf"files\.ev\[0\] +{line_30}\n", shown), shown


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_dead_letters_keep_every_bad_message_and_the_state_folds_the_good_ones(
    engine: str, tmp_path: Path, ordering: str
) -> None:
    # rules 39, 40: the bad line and the record process raised on are dead-lettered with
    # their bytes; every good message is processed once; the store holds the good ones only
    job = _job(
        tmp_path, ordering, '"task.error.policy" = "dead-letter"\n"task.error.stream" = "files.dead"\n'
    )
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "2 bad messages dead-lettered" in r.stdout, r.stdout
    letters = [x for part in read_stream(tmp_path / "data" / "dead") for x in part]
    assert sorted((d["partition"], d["error"]["type"]) for d in letters) == [
        (0, "tailrace.errors.InputError"),
        (1, "ValueError"),
    ]
    by_partition = {d["partition"]: d for d in letters}
    assert by_partition[0]["bytes"] == '{"user": "u1", "amount": '
    assert json.loads(by_partition[1]["bytes"]) == {"user": "u2", "i": 200, "amount": "boom"}
    assert by_partition[1]["error"]["frame"].endswith("in process")
    out = [x for part in read_stream(tmp_path / "data" / "out") for x in part]
    assert len(out) == 598
    shown = run_cli(["checkpoints", "show", str(job)]).stdout
    assert "files.ev[0]" in shown and "files.ev[1]" in shown, shown
    # the state: the good messages' counts exactly; the failed one's increment undone
    store = SqliteCheckpointStore(tmp_path / "state" / "checkpoints.db")
    store.open("badline")
    try:
        counts: dict[str, int] = {}
        for task in ("Partition 0", "Partition 1"):
            for k, v in store.state_scan(task, "n"):
                counts[json.loads(k)] = counts.get(json.loads(k), 0) + json.loads(v)
    finally:
        store.close()
    expected: dict[str, int] = {}
    for p in range(2):
        for i in range(300):
            if (p, i) not in ((0, 30), (1, 200)):
                expected[f"u{i % 7}"] = expected.get(f"u{i % 7}", 0) + 1
    assert counts == expected


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_skip_goes_on_past_both_bad_messages(engine: str, tmp_path: Path, ordering: str) -> None:
    job = _job(tmp_path, ordering, '"task.error.policy" = "skip"\n')
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "2 bad messages skipped" in r.stdout, r.stdout
    assert r.stderr.count("bad message at files.ev[") == 1, r.stderr  # the first, in full
    out = [x for part in read_stream(tmp_path / "data" / "out") for x in part]
    assert len(out) == 598


def test_a_misspelled_key_field_stops_at_the_first_message(engine: str, tmp_path: Path) -> None:
    # issue 36's finding: key_field = "user_id" when the messages have "user" ran to the end with
    # every key None (and, with key ordering, the whole partition as one key)
    job = _job(tmp_path, "key")
    job.write_text(job.read_text().replace('key_field = "user"', 'key_field = "user_id"'))
    r = run_cli(["run", str(job), "--engine", engine, "--no-progress"])
    assert r.returncode == 1
    assert "key_field 'user_id' is not a field of the first message" in r.stderr, r.stderr
    assert "its fields: user, i" in r.stderr, r.stderr
