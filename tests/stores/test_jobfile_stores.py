"""``[stores.NAME]`` tables in job files and ``--config stores.NAME.*`` overrides (rules 25, 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailrace import ConfigError
from tailrace.config import DEFAULT_CACHE_SIZE, StoreSpec
from tailrace.jobfile import load_job
from tailrace.sqlite import SqliteCheckpointStore

TASK = """
import tailrace

class Count(tailrace.StreamTask):
    def init(self, context):
        self.s = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.s[envelope.message] = self.s.get(envelope.message, 0) + 1
"""


def _job(tmp_path: Path, stores: str) -> Path:
    (tmp_path / "count.py").write_text(TASK)
    (tmp_path / "data" / "words").mkdir(parents=True, exist_ok=True)
    (tmp_path / "data" / "words" / "partition-0.txt").write_text("a\nb\na\n")
    (tmp_path / "job.toml").write_text(
        f"""
[job]
name = "count"
task = "count.py:Count"
inputs = ["files.words"]

[systems.files]
type = "file"
path = "data"
{stores}
"""
    )
    return tmp_path / "job.toml"


def test_empty_table_dotted_and_quoted_keys(tmp_path: Path) -> None:
    spec = load_job(_job(tmp_path, '[stores.counts]\n[stores.other]\nkey.serde = "str"\n"cache.size" = 7\n'))
    assert spec.config.stores == {"counts": StoreSpec(), "other": StoreSpec("str", "json", 7)}
    assert StoreSpec().cache_size == DEFAULT_CACHE_SIZE


def test_overrides_and_errors_name_the_key(tmp_path: Path) -> None:
    job = _job(tmp_path, '[stores.counts]\n"value.serde" = "int"\n')
    spec = load_job(job, {"stores.counts.cache.size": 5})
    assert spec.config.stores["counts"] == StoreSpec("json", "int", 5)
    with pytest.raises(ConfigError, match=r"job\.toml: config key 'stores\.counts\.value\.serde'.*yaml"):
        load_job(_job(tmp_path, '[stores.counts]\n"value.serde" = "yaml"\n'))
    with pytest.raises(ConfigError, match=r"stores\.counts\.size.*unknown store option"):
        load_job(_job(tmp_path, "[stores.counts]\nsize = 3\n"))
    with pytest.raises(ConfigError, match=r"task\.async\.commit.*counts"):
        load_job(_job(tmp_path, '[config]\n"task.async.commit" = true\n[stores.counts]\n'))


def test_a_job_file_store_is_durable_and_reset_clears_it(tmp_path: Path) -> None:
    job = _job(tmp_path, '[stores.counts]\n"key.serde" = "str"\n"value.serde" = "int"\n')
    spec = load_job(job)
    spec.container().run()
    db = SqliteCheckpointStore(tmp_path / "state" / "checkpoints.db")
    db.open("count")
    try:
        got = {k.decode(): v for k, v in db.state_scan("Partition 0", "counts")}
        assert set(got) == {"a", "b"}
        db.reset()  # `tailrace checkpoints reset` forgets the state with the offsets
        assert list(db.state_scan("Partition 0", "counts")) == []
    finally:
        db.close()
