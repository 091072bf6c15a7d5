"""One member of a distributed test job, in its own process: ``member_main.py SPEC_JSON``.

SPEC: url, job, partitions (of stream "in"), task ("forward" or "slow"), lease_ms,
engine, commit_ms, cluster (bool). The task copies each input message to stream
"out", tagged with the member that processed it. Prints the MemberResult as JSON.
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


class Forward(StreamTask):
    delay = 0.0

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if self.delay:
            time.sleep(self.delay)
        collector.send("redis.out", {**envelope.message, "by": MEMBER}, key=envelope.partition)


class Slow(Forward):
    delay = 0.01


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {MEMBER} %(name)s %(levelname)s %(message)s")
    url, cluster = spec["url"], spec.get("cluster", False)

    def systems() -> list[RedisSystem]:
        return [RedisSystem("redis", url, cluster=cluster, streams={"in": spec["partitions"]}, batch=200)]

    result = run_member(
        MemberSpec(
            task={"forward": Forward, "slow": Slow}[spec.get("task", "forward")],
            inputs=["redis.in"],
            systems=systems,
            url=url,
            cluster=cluster,
            config={"job.name": spec["job"], "task.commit.ms": spec.get("commit_ms", 200)},
            engine=spec.get("engine", "python"),
            lease_ms=spec.get("lease_ms", 1500),
            member_id=MEMBER,
        )
    )
    print("RESULT " + json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    main()
