"""The commit protocol: checkpoint, then deliver (MillWheel's strong productions on Spark).

For a computation's Spark batch N:

1. The stager (Spark's foreachBatch for the batch) runs the batch: the stateful operator updates the
   key groups' state, the executors write the output files of this *attempt* under a directory no one
   reads (writer.py). The driver collects only file names and counters, and writes the attempt's
   *staged manifest* (`staged/<computation>/e<epoch>/<N>.json`): files, output watermarks, status.
   A re-run of batch N (after a crash, or a failed attempt) overwrites nothing of another attempt:
   its files and manifest are its own.
2. Spark commits the batch: state store version N, then `commits/N` in the checkpoint. The state Spark
   keeps is the state of the last attempt that ran, the one whose manifest was staged last.
3. The publisher sees `commits/N` and appends the staged manifest to the computation's fenced
   publication log (publog.py). Only now do consumers see the records, and sinks receive them.

So what is published for batch N is exactly the output of the attempt whose state Spark committed,
whatever the code did (random draws, clocks, external calls): a crash between the publication and
Spark's commit cannot happen (the publication waits for the commit), and a crash between the commit
and the publication is repaired at the next start, which publishes every committed batch that was not
published yet from its staged manifest. A computation with exactly_once=False publishes in step 1
instead (first attempt wins) and trades that guarantee for latency.

Sinks are delivered after publication (sinks.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from millstream.core.plan import ComputationPlan
from millstream.core.watermarks import earliest_holds, output_keyed_watermarks, output_watermarks, published_idle
from millstream.model.records import BEGINNING_OF_TIME
from millstream.spark import faults
from millstream.spark.fencing import Lease
from millstream.spark.operator import METRICS
from millstream.spark.pacing import LastBatch
from millstream.spark.publog import BATCH, FencedWriter, PublicationLog
from millstream.spark.rootfiles import latest_status, status_history, wake_file
from millstream.spark.source import batch_segments
from millstream.spark.storage import Storage
from millstream.spark.writer import WRITER_SCHEMA, BatchWriter, FileSink

if TYPE_CHECKING:
    from millstream.spark.sinks import SinkDelivery


class Checkpoint:
    """Reads Spark's checkpoint of one query: its offset and commit logs."""

    def __init__(self, location: str) -> None:
        self.storage = Storage(location)
        self.location = location

    def end_offset(self, batch: int) -> dict[str, Any] | None:
        """The source's end offset of `batch` (Spark writes it before running the batch)."""
        lines = self._offset_lines(batch)
        if lines is None:
            return None
        offset: dict[str, Any] = json.loads(lines[-1])
        return offset

    def batch_conf(self, batch: int) -> dict[str, str]:
        """The session settings Spark froze into `batch`'s offsets (spark.sql.shuffle.partitions, ...)."""
        lines = self._offset_lines(batch)
        metadata = json.loads(lines[1]) if lines is not None and len(lines) > 1 and lines[1].startswith("{") else {}
        return dict(metadata.get("conf", {}))

    def _offset_lines(self, batch: int) -> list[str] | None:
        """Spark's offsets file of `batch`: its version, the batch's metadata, then one line per source."""
        text = self.storage.read(f"offsets/{batch}")
        return None if text is None else text.decode().strip().splitlines()

    def committed_offset(self) -> dict[str, Any] | None:
        """The end offset of the last batch Spark committed (None: none yet): where a restart resumes."""
        last = self.last_committed()
        return self.end_offset(last) if last >= 0 else None

    def is_committed(self, batch: int) -> bool:
        return self.storage.exists(f"commits/{batch}")

    def last_committed(self) -> int:
        batches = [int(n) for n in self.storage.list("commits") if n.isdigit()]
        return max(batches, default=-1)

    def last_planned(self) -> int:
        """The newest batch Spark logged offsets for (committed or not: a restart runs it again)."""
        batches = [int(n) for n in self.storage.list("offsets") if n.isdigit()]
        return max(batches, default=-1)


def staged_path(computation: str, epoch: int, batch: int) -> str:
    return f"staged/{computation}/e{epoch:06d}/{batch:012d}.json"


def staged_paths(storage: Storage, computation: str, batch: int) -> list[str]:
    """Where any driver may have staged `batch`'s manifest, the newest epoch first."""
    return [f"staged/{computation}/{epoch_dir}/{batch:012d}.json"
            for epoch_dir in sorted(storage.list(f"staged/{computation}"), reverse=True)]


def staged_after(storage: Storage, computation: str, batch: int) -> list[str]:
    """The manifests any driver staged for batches after `batch`."""
    return [f"staged/{computation}/{epoch_dir}/{name}"
            for epoch_dir in storage.list(f"staged/{computation}")
            for name in storage.list(f"staged/{computation}/{epoch_dir}")
            if (number := name.split(".")[0]).isdigit() and int(number) > batch]


def offsets_digest(end: dict[str, Any] | None) -> str | None:
    """What a staged manifest records of the offsets its attempt ran: a batch id Spark reuses for
    other offsets (a state repartition's batch) must not take the output of an attempt of the old one."""
    if end is None:
        return None
    return hashlib.sha256(json.dumps(end, sort_keys=True).encode()).hexdigest()[:32]


def empty_status() -> dict[str, Any]:
    return {"batch": -1, "low_watermark": BEGINNING_OF_TIME, "input_watermark": BEGINNING_OF_TIME,
            "senders": {}, "metrics": {m: 0 for m in METRICS}, "next_wall_timer": None, "wall_ms": 0,
            "state_bytes_written": 0, "state_bytes_changed": 0}


def next_status(previous: dict[str, Any], reports: list[dict[str, Any]], batch: int, end: dict[str, Any],
                output: list[int], keyed_output: list[dict[str, int]] | None = None,
                hold: int | None = None) -> dict[str, Any]:
    """A computation's status after a batch: cumulative counters, watermarks, the next wall timer."""
    metrics = dict(previous["metrics"])
    for report in reports:
        for name in METRICS:
            metrics[name] = metrics.get(name, 0) + (report.get(name) or 0)
    walls = [r["wake_wall"] for r in reports if r.get("wake_wall") is not None]
    return {
        "batch": batch,
        "low_watermark": output[-1] if output else previous["low_watermark"],
        "input_watermark": end["watermark"],
        "hold": hold,  # the earliest hold of the computation's pending timers after the batch, if any
        # Published keyed watermarks (watermark key -> value), and the coalesced keyed input ones.
        "keyed_watermarks": keyed_output[-1] if keyed_output else previous.get("keyed_watermarks", {}),
        "keyed_input_watermarks": end.get("keyed", {}),
        "senders": {name: item["watermark"] for name, item in end["senders"].items()},
        # The last position read of each upstream publication log (its backlog: the entries after it).
        "positions": {name: item["position"] for name, item in end["senders"].items() if "position" in item},
        "idle_inputs": end.get("idle", []),
        "metrics": metrics,
        "next_wall_timer": min(walls) if walls else None,
        "wall_ms": int(time.time() * 1000),
        # This batch's state: bytes Spark's state store was given, and bytes of the state it changed.
        "state_bytes_written": sum(r.get("bytes_written") or 0 for r in reports),
        "state_bytes_changed": sum(r.get("state_bytes") or 0 for r in reports),
    }


@dataclass
class ComputationCommit:
    """What the commit protocol knows of one strong computation and its query. `fused` are the weak
    computations fused ahead of it: they publish no log of their own, only their status, in the
    strong computation's entries."""

    plan: ComputationPlan
    checkpoint: Checkpoint
    writer: FencedWriter
    file_sinks: tuple[FileSink, ...]
    last_published: int = -1
    fused: tuple[ComputationPlan, ...] = ()
    # Statuses staged by this driver: batch -> computation -> status.
    statuses: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def source_reader(self) -> ComputationPlan:
        """The computation that reads the query's inputs: the first one fused ahead, or its own."""
        return self.fused[0] if self.fused else self.plan


class BatchStager:
    """Spark's foreachBatch of one computation's query: runs the batch, stages its output."""

    def __init__(self, root: str, commit: ComputationCommit, lease: Lease, publisher: "Publisher") -> None:
        self.root = root
        self.commit = commit
        self.lease = lease
        self.publisher = publisher
        self.storage = Storage(root)

    def __call__(self, frame: Any, batch_id: int) -> None:
        started = time.monotonic()
        self.lease.check()  # a driver that was taken over runs nothing more
        commit = self.commit
        plan = commit.plan
        attempt = uuid.uuid4().hex[:12]
        writer = BatchWriter(self.root, plan.name, batch_id, attempt, commit.file_sinks)
        rows = frame.mapInArrow(writer, WRITER_SCHEMA).collect()  # the one action: runs the stateful operator
        streams: dict[str, list[list[Any]]] = {}
        sinks: dict[str, list[list[Any]]] = {}
        reports: list[dict[str, Any]] = []
        for row in rows:
            for item in row["files"]:
                streams.setdefault(item["stream"], []).append([item["path"], item["rows"]])
            for item in row["sink_files"]:
                sinks.setdefault(item["sink"], []).append([item["path"], item["rows"]])
            reports.extend(r.asDict() for r in row["reports"])
        end = commit.checkpoint.end_offset(batch_id)
        if end is None:
            raise RuntimeError(f"Spark's offset log has no batch {batch_id} in {commit.checkpoint.location}")
        statuses: dict[str, dict[str, Any]] = {}
        segments = batch_segments(end)
        output: list[int] = []
        keyed_output: list[dict[str, int]] = []
        idle: list[bool] = []
        for member in (*commit.fused, plan):  # a fused computation's output points are its consumer's input
            previous = self.status_before(member.name, batch_id)
            mine = [r for r in reports if r["computation"] == member.name]
            holds: list[int | None] | None = None
            for report in mine:  # every key group reports every batch (the heartbeat): all holds are here
                holds = earliest_holds(holds, report.get("holds"))
            output = output_watermarks(previous["low_watermark"], segments, holds)
            keyed_output = output_keyed_watermarks(previous.get("keyed_watermarks", {}), segments)
            idle = published_idle(segments, holds)
            statuses[member.name] = next_status(previous, mine, batch_id, end, output, keyed_output,
                                                holds[-1] if holds else None)
        # output, keyed_output and idle are now the strong computation's (the last member), for its log.
        status = statuses[plan.name]
        for files in streams.values():
            files.sort()
        manifest = {"type": BATCH, "batch": batch_id, "attempt": attempt, "offsets": offsets_digest(end),
                    "output": output, "idle": idle, "keyed": keyed_output, "streams": streams,
                    "sinks": sinks, "status": status, "fused": {m.name: statuses[m.name] for m in commit.fused}}
        self.storage.write_json(staged_path(plan.name, commit.writer.epoch, batch_id), manifest)
        with commit.lock:
            commit.statuses[batch_id] = statuses
            for old in [b for b in commit.statuses if b < batch_id - 2]:
                del commit.statuses[old]
        # For the source's next batch: the wall timer to tick for, and this batch's speed (pacing.py).
        reader = (*commit.fused, plan)[0]  # the computation that read the batch's input
        ran = LastBatch(records=sum(r.get("records") or 0 for r in reports if r["computation"] == reader.name),
                        run_ms=int((time.monotonic() - started) * 1000))
        # The earliest wall timer of every member: a fused computation's timers tick with its consumer's query.
        walls = [s["next_wall_timer"] for s in statuses.values() if s["next_wall_timer"] is not None]
        self.storage.write_json(wake_file(plan.name), {"batch": batch_id, "next_wall_timer": min(walls, default=None),
                                                       "last_batch": ran.to_json()})
        if not plan.exactly_once:
            self.publisher.publish(plan.name, batch_id, manifest)
        faults.reached("staged", plan.name)

    def status_before(self, computation: str, batch_id: int) -> dict[str, Any]:
        """A computation's status after batch_id - 1: staged by this driver, or else published (a
        query starts after every committed batch was published)."""
        commit = self.commit
        with commit.lock:
            staged = commit.statuses.get(batch_id - 1, {}).get(computation)
        if staged is not None:
            return staged
        _, entry = commit.writer.log.last_batch()
        if entry is None:
            return empty_status()
        if computation == commit.plan.name:
            return entry["status"]  # type: ignore[no-any-return]
        return entry.get("fused", {}).get(computation) or empty_status()


def write_statuses(storage: Storage, name: str, batch: int, position: int, manifest: dict[str, Any]) -> None:
    """The status files of a published batch: the computation's and its fused computations' latest
    status and history entry (what `millstream status`, the runner's progress and the skew limit read)."""
    for member, status in ((name, manifest["status"]), *manifest.get("fused", {}).items()):
        history = {k: status.get(k) for k in ("batch", "low_watermark", "input_watermark", "hold", "wall_ms",
                                              "state_bytes_written", "state_bytes_changed", "senders", "metrics")}
        storage.write_json(status_history(member, batch), history)
        storage.write_json(latest_status(member), {**status, "position": position})


def repair_statuses(storage: Storage, log: PublicationLog, name: str) -> None:
    """Write the status files of the log's last batch if a driver died between publishing it and
    writing them: they would stay a batch behind the log for good (the published batch is not
    published again), and whatever reads them (the runner's "done", the skew limit) would wait for
    ever. Idempotent."""
    position, entry = log.last_batch()
    if entry is None:
        return
    latest = storage.read_json(latest_status(name))
    if not isinstance(latest, dict) or int(latest.get("batch", -1)) < int(entry["batch"]):
        write_statuses(storage, name, int(entry["batch"]), position, entry)


class Publisher:
    """Publishes committed batches of every computation, then hands them to the sinks."""

    def __init__(self, root: str, commits: dict[str, ComputationCommit], sinks: "SinkDelivery") -> None:
        self.root = root
        self.storage = Storage(root)
        self.commits = commits
        self.sinks = sinks
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- catch-up and the loop -----------------------------------------------------------------
    def catch_up(self) -> None:
        """Publish every batch Spark committed that was not published yet (a crash between Spark's
        commit and the publication), from the manifest its attempt staged."""
        for name in list(self.commits):
            self.publish_committed(name)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="millstream-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for name in list(self.commits):  # computations come and go while the pipeline runs
                    if name in self.commits:
                        self.publish_committed(name)
            except BaseException as error:  # surfaced by the runner (Fenced, storage errors)
                self.failure = error
                return
            self._wake.wait(0.05)
            self._wake.clear()

    # -- publishing ----------------------------------------------------------------------------
    def publish_committed(self, name: str) -> None:
        commit = self.commits[name]
        while commit.checkpoint.is_committed(commit.last_published + 1):
            batch = commit.last_published + 1
            manifest = self.staged_manifest(name, batch)
            ran = offsets_digest(commit.checkpoint.end_offset(batch))  # None: Spark purged the offsets
            if manifest is not None and None not in (ran, manifest.get("offsets")) and manifest["offsets"] != ran:
                manifest = None  # staged by an attempt of other offsets under this batch id
            if manifest is None:
                # A batch Spark made without running it (a state repartition): nothing to publish
                # but the computation's unchanged status, so positions and batch ids stay in step.
                # (Fused computations' statuses too: the next batch's counters go on from them.)
                _, last = commit.writer.log.last_batch()
                status = dict(last["status"] if last else empty_status(), batch=batch)
                fused = {member: dict(was, batch=batch) for member, was in (last or {}).get("fused", {}).items()}
                manifest = {"type": BATCH, "batch": batch, "attempt": None, "output": [], "streams": {},
                            "sinks": {}, "status": status, "fused": fused}
            faults.reached("committed", name)
            self.publish(name, batch, manifest)

    def staged_manifest(self, name: str, batch: int) -> dict[str, Any] | None:
        """The manifest of the attempt Spark committed: this driver's, or at catch-up the newest
        epoch's (one driver at a time: the last one that ran the batch)."""
        commit = self.commits[name]
        mine = self.storage.read_json(staged_path(name, commit.writer.epoch, batch))
        if mine is not None:
            return mine  # type: ignore[no-any-return]
        for path in staged_paths(self.storage, name, batch):
            found = self.storage.read_json(path)
            if found is not None:
                return found  # type: ignore[no-any-return]
        return None

    def publish(self, name: str, batch: int, manifest: dict[str, Any]) -> None:
        commit = self.commits[name]
        with commit.lock:
            if batch <= commit.last_published:
                return  # published already (exactly_once=False: the first attempt won)
            position = commit.writer.append(manifest)
            commit.last_published = batch
        faults.reached("published", name)
        write_statuses(self.storage, name, batch, position, manifest)
        self.sinks.published(name, position, manifest)
