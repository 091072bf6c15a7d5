"""CPU per message of a Kafka reader turning consumed messages into envelopes
(``_KafkaReader.deliver`` then ``poll``), without a broker: real confluent-kafka
Message objects (str keys, JSON values), batches of 500, ``headers=False``
(the default: compiled since issue 16) and ``headers=True`` (the Python path, which also
builds a KafkaRecord per message).

    python bench/kafka_deliver_bench.py [--messages 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import time

import confluent_kafka as ck

from tailrace.kafka import KafkaSystem
from tailrace.kafka.system import _KafkaReader
from tailrace.types import SystemStreamPartition


def run(headers: bool, batches: list[list[ck.Message]]) -> float:
    system = KafkaSystem("kafka", "127.0.0.1:1", headers=headers, buffer=1 << 30)
    reader = _KafkaReader(system, SystemStreamPartition("kafka", "bench", 0), system.fetcher)
    n = 0
    c0 = time.process_time()
    for b in batches:
        reader.deliver(b)
        n += len(reader.poll(len(b)))
    cpu = time.process_time() - c0
    assert n == sum(map(len, batches))
    return cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    msgs = [
        ck.Message(
            topic="bench", partition=0, offset=i, key=f"k{i}".encode(), value=json.dumps({"i": i}).encode()
        )
        for i in range(args.messages)
    ]
    batches = [msgs[i : i + args.batch] for i in range(0, len(msgs), args.batch)]
    compiled = min(run(False, batches) for _ in range(args.rounds))
    python = min(run(True, batches) for _ in range(args.rounds))
    print(
        f"{args.messages:,} messages, batch {args.batch}, best of {args.rounds}: "
        f"headers=False {compiled:.2f} us/msg, headers=True {python:.2f} us/msg"
    )


if __name__ == "__main__":
    main()
