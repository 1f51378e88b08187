"""The dispatcher: a millstream computation that reads clicks and gets each joined exactly once.

Per click, as in the paper:

1. **Lookup before dispatch.** Ask the IdRegistry whether the click id is registered; if another
   pipeline (or another record of the same click) registered it, skip it: it is joined or decided.
2. **Dispatch** to the stateless `Joiner`, which looks the query up in the EventStore, registers the
   click id with the token of this attempt and hands back the joined event, which the dispatcher
   then produces on `joined`. A wasted join (the registry says another token won) is counted.
3. **Retry** what failed (query not there yet, joiner overloaded, registry down) with exponential
   backoff on wall-time timers; the click waits in the dispatcher's state meanwhile, so a restart
   resumes its retries where they were.
4. **Give up** once the click has been retried for `unjoinable_after_ms` of wall time: register it
   with an "unjoinable" token (so exactly one pipeline reports it) and produce it on `unjoinable`
   with the reason of the last failure.

A click behind the registry's GC boundary (EXPIRED) is skipped and reported on `unjoinable` with
reason "expired": the registry can no longer say whether it was joined, so it is never joined again.
Expired clicks are not registered, so each pipeline that sees one reports it.

**Keys.** The dispatcher is keyed by click *shard* (a hash of the click id, `shards` of them), with
each shard's waiting clicks in a map keyed by click id: all records of one click id meet under one
key, so a click is handled by one invocation at a time (duplicates are merged in the map), and one
invocation sends the registry one lookup and one commit for all of its clicks (the paper's batching of
registry requests), where a key per click id would cost two registry transactions per click.

**Exactly once with Spark.** The registry commit happens while Spark runs the micro-batch, before Spark
commits it; what is published is only the attempt Spark committed. A micro-batch run again after a
crash sends the same tokens (see joiner.py), so its commits are answered COMMITTED (or RECLAIMED) and
it produces the joined events the crashed attempt could not publish. A pipeline that dies for good
between the commit and the publication leaves ids registered with nothing written: the verifier
repairs those (verifier.py).

Every invocation that did something produces one record on `photon_stats` with its counters (what the
progress display and the report read): counted once per committed micro-batch, like everything else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Mapping

import xxhash

from millstream.core.deadletters import describe_error
from millstream.model.computation import Computation, ComputationInfo, Context
from millstream.model.records import Record, TimeDomain, Timer
from millstream.model.state import MapState
from millstream.photon.adapter import JoinAdapter
from millstream.photon.eventreader import open_event_store
from millstream.photon.factory import open_registry
from millstream.photon.faults import PhotonFaults
from millstream.photon.joiner import (REGISTRY_FAILURES, UNJOINABLE_ATTEMPT, JoinBatch, Joiner, JoinRequest,
                                      JoinStatus, claims_same_record, dispatch_token)
from millstream.photon.registry import IdRegistry, LookupResult, OpenedOnFirstUse

JOINED = "joined"
UNJOINABLE = "unjoinable"
STATS = "photon_stats"
RETRY_TIMER = "retry"
EXPIRED_REASON = "expired"
# The reason of a click the adapter could not read (`query_id_of_click` raised), with its error:
# decided unjoinable at once, through the registry like any other, so one pipeline reports it.
MALFORMED_REASON = "malformed"


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff between dispatch attempts of a click, and when to give up.

    The n-th retry waits `first_retry_ms * 2**(n-1)`, at most `max_retry_ms`, plus up to a quarter
    more: a jitter drawn from the click id and attempt (not at random, so a re-run of a micro-batch
    schedules the same retries), which keeps clicks that failed together from retrying together.

    >>> policy = RetryPolicy(first_retry_ms=500, max_retry_ms=4_000)
    >>> bases = [500, 1_000, 2_000, 4_000, 4_000]
    >>> all(base <= policy.delay_ms(n, "c-1") <= base * 1.25 for n, base in enumerate(bases, 1))
    True
    >>> policy.delay_ms(4, "c-1") == policy.delay_ms(4, "c-1")
    True
    """

    first_retry_ms: int = 500
    max_retry_ms: int = 8_000
    unjoinable_after_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.first_retry_ms < 1 or self.max_retry_ms < self.first_retry_ms or self.unjoinable_after_ms < 0:
            raise ValueError("need 1 <= first_retry_ms <= max_retry_ms and unjoinable_after_ms >= 0")

    def delay_ms(self, attempts: int, click_id: str) -> int:
        base = min(self.max_retry_ms, self.first_retry_ms << max(0, attempts - 1))  # first * 2**(attempts-1)
        return base + int(xxhash.xxh3_64_intdigest(f"{click_id}/{attempts}".encode())) % (base // 4 + 1)


@dataclass
class DispatchStats:
    """What one dispatcher invocation did (a `photon_stats` record's counters); `+=` sums them.

    >>> total = DispatchStats(joined=2, commit_calls=1, commit_claims=2)
    >>> total += DispatchStats(joined=1, wasted=1, commit_calls=1, commit_claims=2); total.joined, total.mean_commit_batch
    (3, 2.0)
    """

    clicks: int = 0  # click records received
    duplicates: int = 0  # records of a click already waiting here
    skipped: int = 0  # registered by another token at the lookup before dispatch
    dispatched: int = 0  # join requests sent to the joiner
    joined: int = 0
    reclaimed: int = 0  # joined by an earlier attempt of ours that Spark never committed
    wasted: int = 0
    filtered: int = 0
    expired: int = 0
    not_found: int = 0
    overloaded: int = 0
    registry_unavailable: int = 0
    malformed: int = 0  # clicks the adapter could not read (no query id): decided unjoinable
    retries: int = 0  # retries scheduled
    unjoinable: int = 0
    decided_elsewhere: int = 0  # given up here, but another pipeline decided the click first
    lookup_calls: int = 0
    lookup_ids: int = 0
    commit_calls: int = 0
    commit_claims: int = 0
    commit_retries: int = 0  # commits sent again with the same tokens (lost replies, registry failures)
    dispatch_ms_total: int = 0  # wall time from first seen to joined, summed over joined clicks

    def __iadd__(self, other: "DispatchStats") -> "DispatchStats":
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))
        return self

    @property
    def mean_commit_batch(self) -> float:
        return self.commit_claims / self.commit_calls if self.commit_calls else 0.0

    @property
    def busy(self) -> bool:
        return any(getattr(self, item.name) for item in fields(self))

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "DispatchStats":
        names = {item.name for item in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})


class ClickShard:
    """Key extractor of the click log: the click's shard, `shard-<n>` of `shards` (see the module doc).

    >>> ClickShard(JoinAdapter(), 8)(Record("c-17", {"query_id": "q"}, 0)) == ClickShard(JoinAdapter(), 8)(
    ...     Record("c-17", {"query_id": "other"}, 5))
    True
    """

    def __init__(self, adapter: JoinAdapter, shards: int) -> None:
        if shards < 1:
            raise ValueError("shards must be at least 1")
        self.adapter = adapter
        self.shards = shards

    def __call__(self, record: Record[Any]) -> str:
        click_id = self.adapter.click_id(record)
        return f"shard-{xxhash.xxh3_64_intdigest(click_id.encode()) % self.shards}"


@dataclass(frozen=True)
class RegistrySpec:
    """How a worker process opens the registry: a URL without a password (take it from PGPASSWORD or
    PGPASSFILE) and the backend's options (e.g. {"namespace": "photon"} for PostgreSQL).

    >>> RegistrySpec("sqlite:////tmp/ids.db").options
    {}
    """

    url: str
    options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        from millstream.photon.credentials import has_password

        if has_password(self.url):
            raise ValueError("the registry URL carries a password, which would travel inside Spark's plan: "
                             "set PGPASSWORD (or PGPASSFILE) instead (millstream.photon.credentials."
                             "move_password_to_environment does it)")
        object.__setattr__(self, "options", dict(self.options or {}))

    def open(self) -> IdRegistry:
        return open_registry(self.url, **dict(self.options or {}))


class Dispatcher(Computation):
    """Joins clicks (its input, keyed with `ClickShard`) with the EventStore in `event_store_dir`,
    registering them in the registry `registry`; outputs `joined`, `unjoinable` and `photon_stats`.

    `owner` names the pipeline in registry tokens and heartbeats: give each redundant pipeline its
    own. See the module doc; `build_photon_pipeline` wires it with the rest.

    >>> import tempfile, os
    >>> from millstream import Pipeline, ScriptedInjector
    >>> from millstream.testing import PipelineHarness
    >>> from millstream.photon.eventreader import EventReader, primary_key
    >>> folder = tempfile.mkdtemp()
    >>> registry = RegistrySpec("sqlite:///" + os.path.join(folder, "ids.db"))
    >>> dispatcher = Dispatcher("photon-a", registry, os.path.join(folder, "events"))
    >>> pipeline = (Pipeline("photon")
    ...     .add_injector("queries", ScriptedInjector("queries", []), "queries")
    ...     .add_injector("clicks", ScriptedInjector("clicks", []), "clicks")
    ...     .add_computation("event_reader", EventReader(os.path.join(folder, "events")), {"queries": primary_key})
    ...     .add_computation("dispatcher", dispatcher, {"clicks": ClickShard(JoinAdapter(), 4)},
    ...                      [JOINED, UNJOINABLE, STATS]))
    >>> harness = PipelineHarness(pipeline, wall_time=1_700_000_000_000)
    >>> harness.feed("queries", [Record("web:1:1700000000000:0", {"text": "shoes"}, 1_700_000_000_000)])
    >>> harness.run()
    >>> harness.feed("clicks", [Record("c-1", {"query_id": "web:1:1700000000000:0"}, 1_700_000_001_000)])
    >>> harness.run()
    >>> [(r.key, r.value["event"]["query"]["text"]) for r in harness.output(JOINED)]
    [('c-1', 'shoes')]
    """

    pending = MapState[str, dict]("pending")

    def __init__(self, owner: str, registry: RegistrySpec, event_store_dir: str, adapter: JoinAdapter | None = None,
                 *, retry: RetryPolicy | None = None, max_outstanding: int = 1_000, max_disorder_ms: int = 30_000,
                 faults: PhotonFaults | None = None) -> None:
        if not owner or "/" in owner:
            raise ValueError("owner must be a non-empty name without '/'")
        if max_outstanding < 1 or max_disorder_ms < 0:  # refused here, not in setup() inside a Spark task
            raise ValueError(f"max_outstanding must be at least 1 and max_disorder_ms at least 0, got "
                             f"{max_outstanding} and {max_disorder_ms}")
        self.owner = owner
        self.registry = registry
        self.event_store_dir = event_store_dir
        self.adapter = adapter or JoinAdapter()
        self.retry = retry or RetryPolicy()
        self.max_outstanding = max_outstanding
        self.max_disorder_ms = max_disorder_ms
        self.faults = faults or PhotonFaults()
        self._registry: IdRegistry | None = None
        self._joiner: Joiner | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_registry"] = state["_joiner"] = None  # clients are made in setup(), where it runs
        return state

    # -- lifecycle ------------------------------------------------------------------------------
    def setup(self, info: ComputationInfo) -> None:
        # Opened on first use: a registry down while a worker starts is an outage like any other.
        self._registry = self.faults.wrap(OpenedOnFirstUse(self.registry.open))
        self._joiner = Joiner(self._registry, open_event_store(self.event_store_dir, self.max_disorder_ms),
                              self.adapter, max_outstanding=self.max_outstanding)

    def teardown(self) -> None:
        if self._registry is not None:
            self._registry.close()
        self._registry = self._joiner = None

    @property
    def joiner(self) -> Joiner:
        if self._joiner is None:
            raise RuntimeError("the dispatcher was not set up (setup() opens its registry and EventStore)")
        return self._joiner

    # -- hooks ----------------------------------------------------------------------------------
    def process_records(self, ctx: Context, records: list[Record[Any]]) -> None:
        stats = DispatchStats()
        pending = ctx.state(self.pending)
        fresh: dict[str, dict[str, Any]] = {}
        for record in records:
            stats.clicks += 1
            click_id = self.adapter.click_id(record)
            if click_id in fresh or pending.contains(click_id):
                stats.duplicates += 1
                continue
            try:
                query_id, reason = self.adapter.query_id_of_click(record), None
            except Exception as error:  # one bad click must not stop every pipeline reading the log
                query_id, reason = None, f"{MALFORMED_REASON}: {describe_error(error)}"
                stats.malformed += 1
            fresh[click_id] = {"click_id": click_id, "record_id": record.id, "key": record.key,
                               "click": record.value, "ts": record.timestamp, "query_id": query_id,
                               "first_seen": ctx.wall_time, "attempts": 0, "next_try": ctx.wall_time,
                               "reason": reason}
        self._attempt(ctx, list(fresh.values()), stats)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        due = [entry for _, entry in ctx.state(self.pending).items() if entry["next_try"] <= ctx.wall_time]
        self._attempt(ctx, due, DispatchStats())

    # -- one round of attempts ------------------------------------------------------------------
    def _attempt(self, ctx: Context, entries: list[dict[str, Any]], stats: DispatchStats) -> None:
        pending = ctx.state(self.pending)
        to_join, give_up = [], []
        answers = self._lookup(entries, stats)
        for entry in entries:
            answer = answers.get(entry["click_id"])
            if answer is not None and answer.expired:
                self._report_expired(ctx, entry, stats)
                pending.remove(entry["click_id"])
            elif answer is not None and answer.registered and not claims_same_record(
                    answer.token, self.owner, entry["record_id"]):
                stats.skipped += 1
                pending.remove(entry["click_id"])
            elif entry["query_id"] is None:  # the adapter could not read it: there is nothing to join
                give_up.append(entry)
            else:
                to_join.append(entry)
        if to_join:
            requests = [self._request(entry, entry["attempts"] + 1) for entry in to_join]
            stats.dispatched += len(requests)
            batch = self.joiner.join(requests)
            self._count_registry(batch, stats)
            for entry, result in zip(to_join, batch.results):
                entry["attempts"] += 1
                status = result.status
                if status.produce:
                    self._produce_joined(ctx, entry, result.joined, status is JoinStatus.RECLAIMED)
                    stats.joined += 1
                    stats.reclaimed += status is JoinStatus.RECLAIMED
                    stats.dispatch_ms_total += ctx.wall_time - entry["first_seen"]
                    pending.remove(entry["click_id"])
                elif status is JoinStatus.WASTED:
                    stats.wasted += 1
                    pending.remove(entry["click_id"])
                elif status is JoinStatus.EXPIRED:
                    self._report_expired(ctx, entry, stats)
                    pending.remove(entry["click_id"])
                elif status is JoinStatus.FILTERED:
                    stats.filtered += 1
                    pending.remove(entry["click_id"])
                else:
                    setattr(stats, status.value, getattr(stats, status.value) + 1)
                    entry["reason"] = status.value
                    # Never given up while the registry is what failed: the query was found, and the
                    # commit that would register the click unjoinable could as well register its join.
                    if status is not JoinStatus.REGISTRY_UNAVAILABLE and \
                            ctx.wall_time - entry["first_seen"] >= self.retry.unjoinable_after_ms:
                        give_up.append(entry)
                    else:
                        self._schedule(pending, entry, ctx.wall_time, stats)
        if give_up:
            self._give_up(ctx, give_up, stats)
        self._rearm(ctx)
        if stats.busy:
            ctx.produce(Record(ctx.key, {"at": ctx.wall_time, "pipeline": self.owner, "pending": len(pending),
                                         **stats.to_json()}, ctx.wall_time), STATS)

    def _lookup(self, entries: list[dict[str, Any]], stats: DispatchStats) -> dict[str, LookupResult]:
        if not entries:
            return {}
        stats.lookup_calls += 1
        stats.lookup_ids += len(entries)
        try:
            return self.joiner.registry.lookup({entry["click_id"]: entry["ts"] for entry in entries})
        except REGISTRY_FAILURES:
            return {}  # an optimization only: the commit decides

    def _request(self, entry: dict[str, Any], attempt: int | str) -> JoinRequest:
        return JoinRequest(entry["click_id"], entry["query_id"], entry["click"], entry["ts"], entry["record_id"],
                           dispatch_token(self.owner, entry["record_id"], attempt))

    @staticmethod
    def _count_registry(batch: JoinBatch, stats: DispatchStats) -> None:
        stats.commit_calls += batch.commit_calls
        stats.commit_claims += batch.commit_claims
        stats.commit_retries += batch.commit_retries

    def _schedule(self, pending: Any, entry: dict[str, Any], now: int, stats: DispatchStats) -> None:
        entry["next_try"] = now + self.retry.delay_ms(entry["attempts"], entry["click_id"])
        pending.put(entry["click_id"], entry)
        stats.retries += 1

    def _give_up(self, ctx: Context, entries: list[dict[str, Any]], stats: DispatchStats) -> None:
        pending = ctx.state(self.pending)
        batch = self.joiner.decide_unjoinable([self._request(e, UNJOINABLE_ATTEMPT) for e in entries])
        self._count_registry(batch, stats)
        for entry, result in zip(entries, batch.results):
            status = result.status
            if status.produce:
                ctx.produce(Record(entry["click_id"], self._unjoinable_value(entry, entry["reason"], ctx.wall_time),
                                   entry["ts"]), UNJOINABLE)
                stats.unjoinable += 1
                pending.remove(entry["click_id"])
            elif status is JoinStatus.WASTED:
                stats.decided_elsewhere += 1
                pending.remove(entry["click_id"])
            elif status is JoinStatus.EXPIRED:
                self._report_expired(ctx, entry, stats)
                pending.remove(entry["click_id"])
            else:  # the registry is down: the decision waits for it
                self._schedule(pending, entry, ctx.wall_time, stats)

    def _rearm(self, ctx: Context) -> None:
        """The retry timer at the earliest next try, holding the watermark at the earliest pending
        click: a join or an unjoinable decision made on a retry is stamped with its click's time,
        which must not be late for event-time consumers downstream."""
        entries = [entry for _, entry in ctx.state(self.pending).items()]
        if not entries:
            ctx.delete_timer(RETRY_TIMER)
        else:
            ctx.set_timer(RETRY_TIMER, min(entry["next_try"] for entry in entries), TimeDomain.WALL_TIME,
                          hold=min(entry["ts"] for entry in entries))

    # -- productions ----------------------------------------------------------------------------
    def _produce_joined(self, ctx: Context, entry: dict[str, Any], joined: Any, reclaimed: bool) -> None:
        ctx.produce(Record(entry["click_id"], {
            "click_id": entry["click_id"], "query_id": entry["query_id"], "event": joined, "pipeline": self.owner,
            "record_id": entry["record_id"], "attempts": entry["attempts"], "first_seen_ms": entry["first_seen"],
            "joined_ms": ctx.wall_time, "reclaimed": reclaimed}, entry["ts"]), JOINED)

    def _unjoinable_value(self, entry: dict[str, Any], reason: str, now: int) -> dict[str, Any]:
        return {"click_id": entry["click_id"], "query_id": entry["query_id"], "click": entry["click"],
                "reason": reason, "pipeline": self.owner, "record_id": entry["record_id"],
                "attempts": entry["attempts"], "first_seen_ms": entry["first_seen"], "decided_ms": now}

    def _report_expired(self, ctx: Context, entry: dict[str, Any], stats: DispatchStats) -> None:
        stats.expired += 1
        ctx.produce(Record(entry["click_id"], self._unjoinable_value(entry, EXPIRED_REASON, ctx.wall_time),
                           entry["ts"]), UNJOINABLE)


def sum_stats(values: Iterable[Mapping[str, Any]]) -> DispatchStats:
    """The sum of `photon_stats` record values."""
    total = DispatchStats()
    for value in values:
        total += DispatchStats.from_json(value)
    return total
