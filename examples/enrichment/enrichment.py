"""Async enrichment: look up each order's customer in a (simulated) remote service.

``process_async`` starts the lookup and returns at once; the lookup completes on a
pool thread after a random delay, so completions arrive out of order. The callback
is completed from that thread after the enriched order is sent (partition = the
input partition, so each output partition holds one input partition's orders).
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tailrace

CUSTOMERS = {
    i: {"name": name, "tier": tier}
    for i, (name, tier) in enumerate(
        [
            ("Ada", "gold"),
            ("Brendan", "silver"),
            ("Chioma", "bronze"),
            ("Dmitri", "gold"),
            ("Elif", "silver"),
            ("Farid", "bronze"),
            ("Grace", "gold"),
            ("Hiro", "silver"),
            ("Ines", "bronze"),
            ("Jamal", "gold"),
        ],
        start=1,
    )
}


class CustomerService:
    """A stand-in for a remote lookup: answers on a pool thread after 1-20 ms."""

    def __init__(self, seed: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="customer-lookup")
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def lookup(self, customer_id: int) -> Any:
        with self.lock:
            delay = self.rng.uniform(0.001, 0.020)

        def call() -> dict[str, Any]:
            time.sleep(delay)
            customer = CUSTOMERS.get(customer_id)
            if customer is None:
                raise KeyError(f"no customer {customer_id}")
            return customer

        return self.pool.submit(call)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class Enrich(tailrace.AsyncStreamTask):
    def init(self, context: tailrace.TaskContext) -> None:
        self.partition = context.partitions[0].partition
        self.service = CustomerService(seed=self.partition)
        self.revenue: dict[str, float] = {}
        self.lock = threading.Lock()  # done() runs on pool threads

    def process_async(
        self,
        envelope: tailrace.Envelope,
        collector: tailrace.Collector,
        coordinator: tailrace.Coordinator,
        callback: tailrace.Callback,
    ) -> None:
        order = envelope.message
        future = self.service.lookup(order["customer_id"])

        def done(f: Any) -> None:
            try:
                customer = f.result()
                enriched = dict(order, customer=customer["name"], tier=customer["tier"])
                collector.send("files.enriched", enriched, key=order["order_id"], partition=self.partition)
                with self.lock:
                    self.revenue[customer["tier"]] = self.revenue.get(customer["tier"], 0.0) + order["amount"]
            except Exception as e:  # noqa: BLE001 - handed to the engine, which stops with it
                callback.fail(e)
            else:
                callback.complete()

        future.add_done_callback(done)

    def end_of_stream(self, collector: tailrace.Collector, coordinator: tailrace.Coordinator) -> None:
        with self.lock:
            tiers = ", ".join(f"{tier} {amount:.2f}" for tier, amount in sorted(self.revenue.items()))
        print(f"partition {self.partition}: revenue by customer tier: {tiers or 'none'}", flush=True)

    def close(self) -> None:
        self.service.close()
