import signal, time
from pathlib import Path
from typing import Any
import pytest
from tests.kafka.test_kafka_cli import HUNG_TASK, _items, write_job, _start, _wait, _outputs


@pytest.mark.parametrize("n", range(8))
def test_wake(kafka_cluster: Any, tmp_path: Path, n: int) -> None:
    cluster = kafka_cluster({"in": 2, "out": 1})
    cluster.produce("in", _items(400, 2))
    job = write_job(tmp_path, cluster, 'type = "sqlite"\npath = "state/ckpt.db"')
    (tmp_path / "hung.py").write_text(HUNG_TASK)
    text = job.read_text().replace('task = "forward.py:Forward"', 'task = "hung.py:Hung"')
    text = text.replace("[config]", 'engine = "c"\n\n[config]')
    config = '"task.commit.ms" = 200'
    text = text.replace(config, '"task.commit.ms" = 60000\n"task.shutdown.ms" = 1500\n"task.max.concurrency" = 8')
    job.write_text(text)
    log = tmp_path / "run.log"
    proc = _start(job, log)
    started = lambda: 10 in _outputs(cluster) and len(_outputs(cluster)) >= 100  # noqa: E731
    assert _wait(started, 90), log.read_text()[-3000:]
    want = set(range(12, 26, 2))
    ok = _wait(lambda: want <= set(_outputs(cluster)), 10)
    evens = sorted(i for i in _outputs(cluster) if i % 2 == 0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    assert ok, (evens[:20], len(_outputs(cluster)))
