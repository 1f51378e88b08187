"""Helpers of the Photon pipeline tests: complete Photon pipelines on the in-process harness, fed by
hand, writing their outputs where the verifier reads them (the harness has no sinks)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any, Iterable

from millstream.model.records import Record
from millstream.photon import (JOINED, STATS, UNJOINABLE, PhotonFaults, PhotonPipelineSpec, RetryPolicy,
                               build_photon_pipeline)
from millstream.photon.credentials import move_password_to_environment
from millstream.photon.dispatcher import sum_stats
from millstream.photon.pipeline import check_owner_may_start
from millstream.testing import PipelineHarness

T0 = 1_700_000_000_000


def query(seq: int, at_ms: int, text: str | None = None, server: str = "web-1") -> Record[Any]:
    """A query record: its key is its Photon event id, stamped `at_ms`."""
    query_id = f"{server}:7:{at_ms}:{seq}"
    return Record(query_id, {"text": text or f"query {seq}"}, at_ms, f"q-{seq}")


def click(click_id: str, of: Record[Any] | str, at_ms: int, record_id: str | None = None) -> Record[Any]:
    """A click record on query `of` (a query record or id); `record_id` tells duplicates apart."""
    query_id = of if isinstance(of, str) else of.key
    return Record(click_id, {"query_id": query_id, "ad": f"ad-{click_id}"}, at_ms, record_id or f"rec-{click_id}")


def write_click_log(base: str, clicks: Iterable[Record[Any]]) -> str:
    """The click log as the verifier reads it (one file, named by its creation time)."""
    directory = os.path.join(base, "logs", "clicks")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"clicks-{T0}.jsonl"), "w") as out:
        for c in clicks:
            out.write(json.dumps({"key": c.key, "value": c.value, "timestamp": c.timestamp, "id": c.id}) + "\n")
    return directory


class HarnessPhoton:
    """One redundant pipeline on the harness: owner, directory under `base`, shared registry `url`."""

    def __init__(self, base: str, owner: str, url: str, registry_options: dict[str, Any] | None = None,
                 retry: RetryPolicy | None = None, faults: PhotonFaults | None = None, wall_time: int = T0,
                 max_outstanding: int = 1_000, shards: int = 4) -> None:
        logs = os.path.join(base, "logs")
        url = move_password_to_environment(url)  # as a driver does: the password stays out of the spec
        self.spec = PhotonPipelineSpec(
            owner, os.path.join(base, owner), os.path.join(logs, "queries"), os.path.join(logs, "clicks"),
            os.path.join(logs, "reinjected"), url, registry_options or {},
            retry=retry or RetryPolicy(first_retry_ms=500, max_retry_ms=4_000, unjoinable_after_ms=20_000),
            dispatch_shards=shards, max_outstanding=max_outstanding, max_disorder_ms=10_000,
            faults=faults or PhotonFaults())
        self.layout = self.spec.layout
        check_owner_may_start(self.spec)  # as run_pipeline does; the root is `layout.run_root`
        self.harness = PipelineHarness(build_photon_pipeline(self.spec, sinks=False), wall_time=wall_time)
        self._written = {JOINED: 0, UNJOINABLE: 0}
        self._batches = 0

    def restart(self, faults: PhotonFaults | None = None) -> "HarnessPhoton":
        """A fresh harness on the same spec and the same root: nothing of this one's state or output
        is kept (as if Spark had never committed anything it did). A lost root is another thing:
        delete `layout.run_root` and make a new HarnessPhoton, which is refused its owner name."""
        self.spec = replace(self.spec, faults=faults or PhotonFaults())
        check_owner_may_start(self.spec)
        self.harness = PipelineHarness(build_photon_pipeline(self.spec, sinks=False), wall_time=self.harness.wall_time)
        self._written = {JOINED: 0, UNJOINABLE: 0}
        return self

    def feed(self, injector: str, records: Iterable[Record[Any]]) -> None:
        self.harness.feed(injector, list(records))
        self.run()

    def at(self, wall_time: int) -> None:
        """Move the wall clock to `wall_time` and run (fires due retries)."""
        self.harness.advance_wall_time(wall_time)
        self.run()

    def run(self) -> None:
        self.harness.run()
        self.write_outputs()

    def pull_reinjected(self) -> None:
        self.harness.pull_injectors()
        self.run()

    def write_outputs(self) -> None:
        """Deliver what the harness produced since the last call into the layout's sink directories,
        one JSON-lines file per call, as the Spark runner's file sinks do."""
        self._batches += 1
        for stream, directory in ((JOINED, self.layout.joined_dir), (UNJOINABLE, self.layout.unjoinable_dir)):
            records = self.harness.output(stream)[self._written[stream]:]
            self._written[stream] += len(records)
            if records:
                os.makedirs(directory, exist_ok=True)
                with open(os.path.join(directory, f"dispatcher-{self._batches:012d}-0.jsonl"), "w") as out:
                    for r in records:
                        out.write(json.dumps({"key": r.key, "value": r.value, "timestamp": r.timestamp, "id": r.id})
                                  + "\n")

    def joined(self) -> list[str]:
        return [r.key for r in self.harness.output(JOINED)]

    def unjoinable(self) -> dict[str, str]:
        return {r.key: r.value["reason"] for r in self.harness.output(UNJOINABLE)}

    def stats(self) -> Any:
        return sum_stats(r.value for r in self.harness.output(STATS))

    def pending(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for key in self.harness.keys("dispatcher"):
            found.update(self.harness.state("dispatcher", key).get("pending", {}))
        return found
