"""The verifier: finds clicks registered but never written, and gives them back to the pipelines.

A pipeline that dies for good between registering a click id and publishing the joined event leaves
the id registered to its token with no output anywhere; every other pipeline's dispatcher skips the
click (the registry says it is joined), so without repair it is lost. As in the paper, the verifier
compares the click log with the union of the pipelines' outputs and, for each click that is
registered but appears in no output:

1. checks the token's owner: alive (a heartbeat within `owner_timeout_ms`), it may still publish, so
   the click is left alone ("waiting for owner");
2. gone: retires the owner (it may then never start again under that name, see liveness.py), reads
   the outputs again (the owner might have published in the meantime), deletes the id from the
   registry, conditionally on the token still being that owner's, and
3. re-injects the click: writes its record, with a new record id, to a file in the re-injection
   directory, which every pipeline reads with a FileInjector. The next pipeline to dispatch it finds
   the id absent and joins it.

It also reports what else it sees: clicks joined more than once (must be none), clicks in both
outputs, records in the outputs that are not in the click log, and clicks neither registered nor
written (still being retried somewhere). A click neither registered nor written whose query one of
the pipelines' EventStores holds and which the verifier's adapter (the pipelines' adapter, a pure
function) filters out is counted as filtered, not unsettled: no pipeline will ever register it. Click
ids behind the registry's GC boundary cannot be verified and are counted as expired.

A registry failure in the middle of a run does not lose what the run already deleted: those clicks
are re-injected before the error is raised. `wait_until_settled` tries again at its next round.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from millstream.model.records import Record
from millstream.photon.adapter import JoinAdapter
from millstream.photon.clock import Clock, wall_clock_ms
from millstream.photon.dispatcher import EXPIRED_REASON
from millstream.photon.eventstore import LOG_MAP_FILE, LogEventStore
from millstream.photon.joiner import REGISTRY_FAILURES
from millstream.photon.liveness import is_gone, retire_owner
from millstream.photon.outputs import PipelineLayout, read_log, read_sink
from millstream.photon.registry import DeleteStatus, IdRegistry, LookupResult

logger = logging.getLogger(__name__)

LOOKUP_CHUNK = 1_000


@dataclass
class VerifierReport:
    """What one verifier run found and did (lists of click ids).

    >>> VerifierReport(clicks=3, joined=2, unjoinable=1).consistent
    True
    """

    clicks: int = 0  # distinct click ids in the click log
    joined: int = 0  # distinct click ids in the joined outputs
    unjoinable: int = 0  # distinct click ids reported unjoinable (expired ones included)
    expired: list[str] = field(default_factory=list)  # behind the GC boundary: cannot be verified
    duplicated: list[str] = field(default_factory=list)  # joined more than once across the outputs
    unjoinable_twice: list[str] = field(default_factory=list)  # reported unjoinable more than once (not expired)
    joined_and_unjoinable: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # in an output, not in the click log
    unsettled: list[str] = field(default_factory=list)  # neither registered nor written (yet)
    filtered: list[str] = field(default_factory=list)  # neither registered nor written: the adapter drops it
    waiting_for_owner: list[str] = field(default_factory=list)  # registered, unwritten, owner alive
    repaired: list[str] = field(default_factory=list)  # deleted from the registry and re-injected
    retired_owners: list[str] = field(default_factory=list)
    reinjection_file: str | None = None

    @property
    def consistent(self) -> bool:
        """Nothing joined twice, nothing reported unjoinable twice (but for `expired`, which each
        pipeline reports), nothing both joined and unjoinable, nothing unknown."""
        return not (self.duplicated or self.unjoinable_twice or self.joined_and_unjoinable or self.unknown)

    @property
    def settled(self) -> bool:
        """Every click of the log is written exactly once (joined, or reported unjoinable) or is
        filtered out by the adapter."""
        return self.consistent and not (self.unsettled or self.waiting_for_owner or self.repaired)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        extra = "".join(f", {len(found)} {what}" for found, what in (
            (self.unjoinable_twice, "reported unjoinable twice"), (self.filtered, "filtered")) if found)
        return (f"{self.clicks} clicks: {self.joined} joined, {self.unjoinable} unjoinable, "
                f"{len(self.unsettled)} unsettled, {len(self.waiting_for_owner)} waiting for a live owner, "
                f"{len(self.repaired)} repaired (re-injected), {len(self.duplicated)} joined twice{extra}")


@dataclass(frozen=True)
class OutputsSeen:
    joined: Counter[str]
    unjoinable: set[str]
    decided_unjoinable: Counter[str]  # unjoinable reports other than `expired`: one per click at most


def read_outputs(pipelines: Iterable[PipelineLayout]) -> OutputsSeen:
    """The click ids in the union of the pipelines' `joined` and `unjoinable` sinks."""
    joined: Counter[str] = Counter()
    unjoinable: set[str] = set()
    decided: Counter[str] = Counter()
    for layout in pipelines:
        joined.update(record.key for record in read_sink(layout.joined_dir))
        for record in read_sink(layout.unjoinable_dir):
            unjoinable.add(record.key)
            reason = record.value.get("reason") if isinstance(record.value, dict) else None
            if reason != EXPIRED_REASON:
                decided[record.key] += 1
    return OutputsSeen(joined, unjoinable, decided)


class Verifier:
    """Checks the click log in `click_log` against the outputs of `pipelines`, repairing through
    `registry` and `reinject_dir` (see the module doc). `click_log_creation` is how the pipelines'
    FileInjector reads the click log ("name" or "mtime"), so that record ids are the same; `adapter`
    and `max_disorder_ms` must be the pipelines' (to tell filtered clicks from unsettled ones). Owners'
    silence is measured with the registry's clock (`IdRegistry.now_ms`), never with `clock`, which
    only names re-injection files.

    >>> import tempfile, os
    >>> from millstream.photon import open_registry
    >>> base = tempfile.mkdtemp()
    >>> registry = open_registry("sqlite:///" + os.path.join(base, "ids.db"))
    >>> verifier = Verifier(registry, os.path.join(base, "clicks"), [PipelineLayout(os.path.join(base, "a"))],
    ...                     os.path.join(base, "reinject"), owner_timeout_ms=10_000)
    >>> verifier.run().summary()
    '0 clicks: 0 joined, 0 unjoinable, 0 unsettled, 0 waiting for a live owner, 0 repaired (re-injected), 0 joined twice'
    >>> registry.close()
    """

    def __init__(self, registry: IdRegistry, click_log: str, pipelines: Sequence[PipelineLayout], reinject_dir: str,
                 owner_timeout_ms: int = 15_000, adapter: JoinAdapter | None = None, click_log_creation: str = "name",
                 clock: Clock | None = None, max_disorder_ms: int = 30_000) -> None:
        self.registry = registry
        self.click_log = click_log
        self.pipelines = list(pipelines)
        self.reinject_dir = reinject_dir
        self.owner_timeout_ms = owner_timeout_ms
        self.adapter = adapter or JoinAdapter()
        self.click_log_creation = click_log_creation
        self._clock: Clock = clock or wall_clock_ms
        self.max_disorder_ms = max_disorder_ms  # the pipelines' EventStore setting, to find queries there

    def clicks(self) -> dict[str, Record[Any]]:
        """The click log: each click id's first record."""
        first: dict[str, Record[Any]] = {}
        for record in read_log(self.click_log, self.click_log_creation):
            first.setdefault(self.adapter.click_id(record), record)
        return first

    def _lookup(self, clicks: dict[str, Record[Any]], ids: Sequence[str]) -> dict[str, LookupResult]:
        found: dict[str, LookupResult] = {}
        for start in range(0, len(ids), LOOKUP_CHUNK):
            chunk = ids[start:start + LOOKUP_CHUNK]
            found.update(self.registry.lookup({click_id: clicks[click_id].timestamp for click_id in chunk}))
        return found

    def run(self) -> VerifierReport:
        clicks = self.clicks()
        seen = read_outputs(self.pipelines)
        report = VerifierReport(clicks=len(clicks), joined=len(seen.joined), unjoinable=len(seen.unjoinable))
        report.duplicated = sorted(c for c, n in seen.joined.items() if n > 1)
        report.unjoinable_twice = sorted(c for c, n in seen.decided_unjoinable.items() if n > 1)
        report.joined_and_unjoinable = sorted(seen.unjoinable & set(seen.joined))
        report.unknown = sorted((set(seen.joined) | seen.unjoinable) - set(clicks))
        unwritten = sorted(c for c in clicks if c not in seen.joined and c not in seen.unjoinable)
        answers = self._lookup(clicks, unwritten)
        orphans: dict[str, LookupResult] = {}
        for click_id in unwritten:
            answer = answers[click_id]
            if answer.expired:
                report.expired.append(click_id)
            elif not answer.registered:
                report.unsettled.append(click_id)
            else:
                orphans[click_id] = answer
        if report.unsettled and self._adapter_may_filter():
            filtered = self._filtered(clicks, report.unsettled)
            report.filtered = [c for c in report.unsettled if c in filtered]
            report.unsettled = [c for c in report.unsettled if c not in filtered]
        now = self.registry.now_ms()  # heartbeats are stamped with the registry's clock: never compare with ours
        owners = sorted({answer.token.owner for answer in orphans.values() if answer.token is not None})
        gone = {owner for owner in owners if is_gone(self.registry, owner, self.owner_timeout_ms, now)}
        for owner in sorted(gone):
            retire_owner(self.registry, owner)
        report.retired_owners = sorted(gone)
        if gone:
            seen = read_outputs(self.pipelines)  # what a gone owner published before we retired it counts
        repairs: list[Record[Any]] = []
        try:
            for click_id, answer in orphans.items():
                if answer.token is None or answer.token.owner not in gone:
                    report.waiting_for_owner.append(click_id)
                elif click_id in seen.joined or click_id in seen.unjoinable:
                    continue  # written after all
                elif self.registry.delete(click_id, answer.token, clicks[click_id].timestamp) is DeleteStatus.DELETED:
                    report.repaired.append(click_id)
                    repairs.append(clicks[click_id])
        finally:
            # Also when a delete failed: a click deleted and not re-injected would be lost for good.
            if repairs:
                report.reinjection_file = self._reinject(repairs)
        return report

    def _adapter_may_filter(self) -> bool:
        """Whether the adapter can drop a pair: the default JoinAdapter never does (no lookups then)."""
        kind = type(self.adapter)
        return kind.filter is not JoinAdapter.filter or kind.join is not JoinAdapter.join

    def _filtered(self, clicks: dict[str, Record[Any]], click_ids: Sequence[str]) -> set[str]:
        """Those of `click_ids` whose query a pipeline's EventStore holds and which the adapter drops,
        as every pipeline's joiner does (the adapter is a pure function of query and click)."""
        stores = [LogEventStore(layout.event_store, max_disorder_ms=self.max_disorder_ms) for layout in self.pipelines
                  if os.path.exists(os.path.join(layout.event_store, LOG_MAP_FILE))]  # never create one
        filtered: set[str] = set()
        try:
            for click_id in click_ids:
                record = clicks[click_id]
                try:
                    query_id = self.adapter.query_id_of_click(record)
                    query = next((q for q in (store.lookup(query_id) for store in stores) if q is not None), None)
                    if query is not None and self.adapter.join(query, record.value) is None:
                        filtered.add(click_id)
                except Exception:  # a click the adapter cannot read stays unsettled: a pipeline must say
                    logger.debug("verifier: cannot tell whether click %r is filtered", click_id, exc_info=True)
        finally:
            for store in stores:
                store.close()
        return filtered

    def _reinject(self, records: list[Record[Any]]) -> str:
        """Write `records` to a new file of the re-injection directory (visible complete: written
        elsewhere, then renamed), each with a new record id so that no pipeline discards it as a
        duplicate of the record it already processed."""
        os.makedirs(self.reinject_dir, exist_ok=True)
        stamp = self._clock()
        name = f"reinjected-{stamp}-{os.getpid()}.jsonl"
        temporary = os.path.join(self.reinject_dir, "." + name)
        with open(temporary, "w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps({"key": record.key, "value": record.value, "timestamp": record.timestamp,
                                      "id": f"reinjected-{stamp}:{record.id}"}) + "\n")
            out.flush()
            os.fsync(out.fileno())
        final = os.path.join(self.reinject_dir, name)
        os.replace(temporary, final)
        return final


def wait_until_settled(verifier: Verifier, timeout_s: float, every_s: float = 2.0) -> list[VerifierReport]:
    """Run the verifier every `every_s` seconds until a run finds every click written exactly once, or
    `timeout_s` passes; returns every completed run's report. A run that the registry fails (a server
    restarting) is tried again at the next round; if no run completed by the deadline, the last
    failure is raised."""
    reports: list[VerifierReport] = []
    deadline = time.time() + timeout_s
    while True:
        failure: BaseException | None = None
        try:
            reports.append(verifier.run())
        except REGISTRY_FAILURES as error:
            failure = error
            logger.warning("verifier run failed on the registry (%s); trying again in %g s", error, every_s)
        if failure is None and reports[-1].settled:
            return reports
        if time.time() > deadline:
            if not reports and failure is not None:
                raise failure
            return reports
        time.sleep(every_s)
