"""Sink delivery threads (spark/sinks.py) without Spark: what a stopped delivery may still do."""

from __future__ import annotations

import threading
import time

from millstream.spark.sinks import SinkDelivery


def test_a_stopped_delivery_delivers_nothing_more_after_stop_returns(tmp_path):
    """stop() queued its end mark behind the backlog: a slow sink went on delivering the whole backlog
    from its thread after the runner had stopped and released the root, beside the next runner, which
    delivered the same batches (a user writer saw 14 batches twice, at the same time)."""
    calls = []
    first_started = threading.Event()

    def deliver(producer, batch, entry):
        first_started.set()
        time.sleep(0.1)
        calls.append((batch, time.monotonic()))

    delivery = SinkDelivery(str(tmp_path), {"slow": (None, ["producer"], deliver)})  # type: ignore[dict-item]
    for batch in range(30):
        delivery.published("producer", batch, {"batch": batch, "type": "batch"})
    delivery.start()
    assert first_started.wait(10)
    delivery.stop()
    stopped = time.monotonic()
    count = len(calls)
    time.sleep(0.5)
    assert len(calls) == count <= 2  # the delivery under way when stop() came, at most
    assert all(at <= stopped for _, at in calls)
    assert [batch for batch, _ in calls] == list(range(count))
