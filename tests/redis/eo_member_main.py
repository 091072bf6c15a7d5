"""One member of a distributed job with exactly-once Redis outputs (rule 41), in its own
process: ``eo_member_main.py SPEC_JSON``.

SPEC: url, job, partitions (of stream "in"), engine, lease_ms, commit_ms, delay_s. The task
counts each key's messages per task (store ``counts``) and sends ``{"k", "p", "seq", "n"}``
(n: the key's count in its partition so far) to ``redis.out`` keyed by ``k``. Prints the
MemberResult as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from tailrace import StreamTask
from tailrace.redis.membership import MemberSpec, run_member
from tailrace.redis.system import RedisSystem

MEMBER = f"m{os.getpid()}"
DELAY_S = 0.0


class Counter(StreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if DELAY_S:
            time.sleep(DELAY_S)
        m = envelope.message
        n = self.counts.get(m["k"], 0) + 1
        self.counts[m["k"]] = n
        collector.send("redis.out", {"k": m["k"], "p": m["p"], "seq": m["seq"], "n": n}, key=m["k"])


def main() -> None:
    global DELAY_S
    spec = json.loads(sys.argv[1])
    DELAY_S = spec.get("delay_s", 0.0)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {MEMBER} %(name)s %(levelname)s %(message)s")
    url = spec["url"]
    config: dict[str, Any] = {
        "job.name": spec["job"],
        "task.commit.ms": spec.get("commit_ms", 20),
        "task.output.guarantee": spec.get("guarantee", "exactly-once"),
        "stores.counts.key.serde": "str",
        "stores.counts.value.serde": "int",
    }

    def systems() -> list[RedisSystem]:
        return [RedisSystem("redis", url, streams={"in": spec["partitions"], "out": 4}, batch=50)]

    result = run_member(
        MemberSpec(
            task=Counter,
            inputs=["redis.in"],
            systems=systems,
            url=url,
            config=config,
            engine=spec.get("engine", "python"),
            lease_ms=spec.get("lease_ms", 1000),
            member_id=MEMBER,
        )
    )
    print("RESULT " + json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    main()
