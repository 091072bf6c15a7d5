"""The framework's share of a Kafka consume loop: a no-op tailrace task against a
bare confluent-kafka loop doing the same work, over the same messages.

    python bench/kafka_bench.py [--messages 200000] [--partitions 4] [--batch 500]

Starts its own Mokapi (build/npm, installed by scripts/test.sh) unless
KAFKA_BOOTSTRAP_SERVERS names a broker, produces the messages (JSON values,
str keys), then times, each from its first ``consume`` to the last message:

1. bare: one confluent-kafka consumer assigned every partition from the start,
   ``consume(batch)`` until every message was seen, decoding key and value with
   the same serdes tailrace uses and calling a no-op function per message;
2. tailrace: a Container (C engine) with a no-op sync task over a bounded
   KafkaSystem with the same batch size (the consumer's fetch thread, the
   per-partition buffers, envelopes, dispatch, one final commit).

The ratio tailrace / bare is the figure of merit (goal: <= 1.2); the difference
divided by the message count is tailrace's cost per message over the bare loop.
Both runs read from the same broker, so the broker's speed cancels out only to
the extent both are broker-bound: see bench/README.md (Kafka) for how to read it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tailrace.container import EngineName

ROOT = Path(__file__).resolve().parent.parent
MOKAPI = ROOT / "build" / "npm" / "node_modules" / ".bin" / "mokapi"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_mokapi(partitions: int, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    spec = workdir / "mokapi.yaml"
    channel = (
        f"  bench:\n    address: bench\n    bindings:\n      kafka:\n        partitions: {partitions}\n"
        "    messages:\n      any:\n        payload: {}\n"
    )
    template = (ROOT / "tests" / "kafka" / "mokapi.yaml").read_text()
    spec.write_text(template.replace("{port}", str(port)).replace("{channels}", channel))
    args = [
        str(MOKAPI),
        f"--api-port={_free_port()}",
        f"--mcp-server-port={_free_port()}",
        f"--health-port={_free_port()}",
        "--api-search-enabled=false",  # indexing every record for the dashboard: 650 msg/s, not 10k
        "--log-level=error",
        str(spec),
    ]
    # its own process group: the npm launcher runs the Go binary as a child (see stop_mokapi)
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir, start_new_session=True
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    stop_mokapi(proc)
    raise SystemExit("mokapi did not start")


def stop_mokapi(proc: subprocess.Popen[bytes]) -> None:
    """Stop Mokapi's process group: a signal to the launcher alone leaves the Go binary running."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    import confluent_kafka as ck

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
    for i in range(n):
        while True:
            try:
                p.produce(topic, json.dumps({"i": i}).encode(), f"k{i}".encode(), i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def bare(bootstrap: str, topic: str, n: int, partitions: int, batch: int) -> tuple[float, float]:
    import confluent_kafka as ck

    from tailrace.serdes import serde

    dk, dv = serde("str").decode, serde("json").decode

    def noop(key: Any, value: Any) -> None:
        pass

    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bare-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
    seen = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    while seen < n:
        for m in c.consume(batch, 0.1):
            if m.error():
                continue
            noop(dk(m.key() or b""), dv(m.value() or b"null"))
            seen += 1
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    c.close()
    return dt, cpu


def framework(bootstrap: str, topic: str, n: int, batch: int, engine: EngineName) -> tuple[float, float]:
    import tailrace
    from tailrace.kafka import KafkaSystem

    system = KafkaSystem("kafka", bootstrap, bounded=True, batch=batch, group_id=f"tr-{uuid.uuid4().hex}")

    class Noop(tailrace.StreamTask):
        """A no-op task (the container ends at the partitions' end)."""

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

    c0 = time.process_time()
    t0 = time.perf_counter()
    result = tailrace.Container(Noop, inputs=[f"kafka.{topic}"], systems=[system], engine=engine).run()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    assert result.processed == n, result.processed
    return dt, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--engine", default="c")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    real = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        if real:
            import confluent_kafka.admin as admin

            bootstrap, topic = real, f"tr-bench-{uuid.uuid4().hex[:8]}"
            futs = admin.AdminClient({"bootstrap.servers": real}).create_topics(
                [admin.NewTopic(topic, args.partitions, replication_factor=-1)]
            )
            for f in futs.values():
                f.result(30)
        else:
            proc, bootstrap = start_mokapi(args.partitions, Path(tmp))
            topic = "bench"
        try:
            t0 = time.perf_counter()
            produce(bootstrap, topic, args.messages, args.partitions)
            print(f"produced {args.messages:,} messages in {time.perf_counter() - t0:.1f} s", flush=True)
            n = args.messages
            rows = []
            for r in range(args.rounds):
                b, bc = bare(bootstrap, topic, n, args.partitions, args.batch)
                t, tc = framework(bootstrap, topic, n, args.batch, args.engine)
                rows.append((b, bc, t, tc))
                print(
                    f"round {r}: wall: bare {b:.2f} s ({n / b:,.0f} msg/s), tailrace {t:.2f} s "
                    f"({n / t:,.0f} msg/s), ratio {t / b:.2f}; client CPU: bare {bc / n * 1e6:.1f} us/msg, "
                    f"tailrace {tc / n * 1e6:.1f} us/msg, ratio {tc / bc:.2f}",
                    flush=True,
                )
            b = min(x[0] for x in rows)
            bc = min(x[1] for x in rows)
            t = min(x[2] for x in rows)
            tc = min(x[3] for x in rows)
            print(
                f"best of {args.rounds} ({args.engine} engine, batch {args.batch}): wall ratio {t / b:.2f}; "
                f"client CPU bare {bc / n * 1e6:.1f} us/msg, tailrace {tc / n * 1e6:.1f} us/msg "
                f"(ratio {tc / bc:.2f}, tailrace's share {(tc - bc) / n * 1e6:+.1f} us/msg)"
            )
        finally:
            if proc is not None:
                stop_mokapi(proc)
    sys.exit(0)


if __name__ == "__main__":
    main()
