"""The Photon demo's run: logs written live, redundant pipelines as driver processes, faults, repairs.

    start N pipeline drivers (python -m millstream.photon.driver), wait until each has run a batch
    write the query and click logs live (generator.LogWriter)
        at --kill-at: the pipeline ahead dies right after its next registry commit (SIGKILL of its processes)
        --restart-after later: it is started again on its root (or never)
        at 60% of the traffic: the registry is resharded while everything runs
    once the logs are done: the verifier, every few seconds, until every click is written exactly once
        (it re-injects what a dead pipeline registered and never wrote, once its heartbeat is old)
    GC: once no live pipeline holds a click for a retry, the registry forgets the first quarter of the
        traffic; old clicks replayed then are answered "expired" and skipped, never joined twice
    the re-injection log is closed; the drivers finish; the report is computed from the files

Everything is under the data directory (see `DemoLayout`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from millstream.apps.photon.generator import LogWriter, PhotonData, PhotonDataConfig, generate
from millstream.apps.photon.report import (RegistryLoad, Truth, batch_cadence, check_outputs, join_latencies_ms,
                                           latency_parts_ms, latency_summary)
from millstream.console.progress import ComputationStatus, ProgressDisplay, Snapshot, format_duration
from millstream.console.running import RunFailed
from millstream.injectors.files import DONE_MARKER
from millstream.photon import IdRegistry, PhotonFaults, PhotonPipelineSpec, RetryPolicy, Verifier, open_registry
from millstream.photon.dispatcher import DispatchStats
from millstream.photon.faults import read_fault_records
from millstream.photon.joiner import REGISTRY_FAILURES
from millstream.photon.outputs import SinkRecord, SinkTail
from millstream.photon.pipeline import COMPUTATIONS, INJECTORS
from millstream.photon.verifier import VerifierReport

STARTUP_LIMIT_S = 420.0  # two Spark drivers starting at once on a loaded 2-core machine
FINISH_LIMIT_S = 240.0
KILL_WAIT_S = 60.0  # after arming the kill, how long to wait for the victim's next registry commit
VERIFY_EVERY_S = 3.0
GC_REPLAYS = 10
GC_ANSWER_LIMIT_S = 240.0


@dataclass(frozen=True)
class DemoOptions:
    """What a demo run does (the command line's options, checked)."""

    data_dir: str
    registry_url: str  # without a password (it is in PGPASSWORD)
    registry_options: dict[str, Any]
    data: PhotonDataConfig
    pipelines: int = 2
    kill_at_s: float | None = 20.0
    restart_after_s: float | None = 15.0
    reshard_to: int = 8
    gc_demo: bool = True
    lose_reply_every: int = 0
    unjoinable_after_ms: int = 20_000
    owner_timeout_ms: int = 10_000
    dispatch_shards: int = 8
    master: str = "local[1]"
    trigger_ms: int = 250
    timeout_s: float | None = None


@dataclass(frozen=True)
class DemoLayout:
    data_dir: str

    def path(self, *parts: str) -> str:
        return os.path.join(self.data_dir, *parts)

    @property
    def query_log(self) -> str:
        return self.path("logs", "queries")

    @property
    def click_log(self) -> str:
        return self.path("logs", "clicks")

    @property
    def reinject_dir(self) -> str:
        return self.path("logs", "reinjected")


def owner_name(index: int) -> str:
    return f"photon-{chr(ord('a') + index)}"


class Driver:
    """One pipeline's driver process, in a process group of its own (so a kill takes its JVM too)."""

    def __init__(self, spec: PhotonPipelineSpec) -> None:
        self.spec = spec
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def owner(self) -> str:
        return self.spec.owner

    def start(self, spec: PhotonPipelineSpec | None = None) -> None:
        self.spec = spec or self.spec
        os.makedirs(self.spec.directory, exist_ok=True)
        spec_path = os.path.join(self.spec.directory, "spec.json")
        self.spec.save(spec_path)
        project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (project, env.get("PYTHONPATH", "")) if p)
        log = open(os.path.join(self.spec.directory, "driver.log"), "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "millstream.photon.driver", spec_path],
                                        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def log_tail(self, lines: int = 3) -> str:
        try:
            with open(os.path.join(self.spec.directory, "driver.log"), encoding="utf-8", errors="replace") as log:
                return " | ".join(line.strip() for line in log.readlines()[-lines:] if line.strip())
        except OSError:
            return ""


@dataclass
class PipelineView:
    """What the command reads of one pipeline while it runs: its outputs, as delivered."""

    driver: Driver
    stats: SinkTail
    joined: SinkTail
    unjoinable: SinkTail
    stats_values: list[dict[str, Any]] = field(default_factory=list)
    joined_records: list[SinkRecord] = field(default_factory=list)
    unjoinable_records: list[SinkRecord] = field(default_factory=list)
    pending_by_shard: dict[str, int] = field(default_factory=dict)  # as of each shard's latest stats record

    def poll(self) -> None:
        for record in self.stats.poll():  # delivered in batch order, each shard's records in production order
            self.stats_values.append(record.value)
            self.pending_by_shard[record.key] = record.value["pending"]
        self.joined_records.extend(self.joined.poll())
        self.unjoinable_records.extend(self.unjoinable.poll())

    def clicks_pending(self) -> int:
        """How many clicks the pipeline still holds for a retry, as of its latest delivered batch."""
        return sum(self.pending_by_shard.values())

    def totals(self) -> DispatchStats:
        total = DispatchStats()
        for value in self.stats_values:
            total += DispatchStats.from_json(value)
        return total


class PhotonDemo:
    """Runs the demo (see the module doc) under `display`; `run()` returns the report (a dict)."""

    def __init__(self, options: DemoOptions, display: ProgressDisplay, log: Callable[[str], None] = print) -> None:
        self.options = options
        self.display = display
        self.log = log
        self.layout = DemoLayout(options.data_dir)
        self.events: list[str] = []
        self.started = time.time()
        self.phase = "starting"
        self.writer: LogWriter | None = None
        self.data: PhotonData | None = None
        self.config = options.data
        self.victim: Driver | None = None  # the pipeline chosen to die (the leader when the kill is armed)
        self.views = [self._view(index) for index in range(options.pipelines)]
        self.verifier_reports: list[VerifierReport] = []
        self.killed_at: float | None = None
        self.restarted = False
        self.restarted_ms = 0
        self.victim_batches = 0
        self.replayed = 0  # old clicks replayed after GC (counted in the progress's total)

    # -- setting up ---------------------------------------------------------------------------------
    def _spec(self, index: int) -> PhotonPipelineSpec:
        options, layout = self.options, self.layout
        owner = owner_name(index)
        faults = PhotonFaults(lose_reply_every=options.lose_reply_every,
                              die_when=self.kill_file(owner) if options.kill_at_s is not None else None,
                              record_to=layout.path(owner, "faults.jsonl"))
        return PhotonPipelineSpec(
            owner, layout.path(owner), layout.query_log, layout.click_log, layout.reinject_dir, options.registry_url,
            options.registry_options, adapter="millstream.apps.photon.adapter:AdClickAdapter",
            retry=RetryPolicy(first_retry_ms=250, max_retry_ms=4_000, unjoinable_after_ms=options.unjoinable_after_ms),
            dispatch_shards=options.dispatch_shards, max_disorder_ms=options.data.late_query_max_ms
            + options.data.max_click_delay_ms, master=options.master, trigger_ms=options.trigger_ms, faults=faults)

    def kill_file(self, owner: str) -> str:
        """The file whose appearance makes `owner` die after its next registry commit."""
        return self.layout.path(f"kill-switch-{owner}")

    def _view(self, index: int) -> PipelineView:
        spec = self._spec(index)
        layout = spec.layout
        return PipelineView(Driver(spec), SinkTail(layout.stats_dir), SinkTail(layout.joined_dir),
                            SinkTail(layout.unjoinable_dir))

    def note(self, text: str) -> None:
        stamped = f"{time.time() - self.started:5.0f} s  {text}"
        self.events.append(stamped)

    def elapsed_traffic(self) -> float:
        return time.time() - self.config.start_ms / 1000 if self.config.start_ms else 0.0

    # -- the run ------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        for directory in (self.layout.query_log, self.layout.click_log, self.layout.reinject_dir):
            os.makedirs(directory, exist_ok=True)
        try:
            with open_registry(self.options.registry_url, **self.options.registry_options) as registry:
                with self.display:
                    self._start_pipelines()
                    self._traffic(registry)
                    self._verify(registry)
                    gc = self._gc_demo(registry) if self.options.gc_demo else None
                    self._finish()
                    self._update()
            return self._report(gc)
        finally:
            if self.writer is not None:
                self.writer.stop()
            for view in self.views:
                if view.driver.alive:
                    view.driver.kill()

    def _deadline_check(self) -> None:
        if self.options.timeout_s is not None and time.time() - self.started > self.options.timeout_s:
            raise RunFailed(f"not finished after {self.options.timeout_s:g} s (drivers' logs: "
                            f"{', '.join(os.path.join(v.driver.spec.directory, 'driver.log') for v in self.views)})")

    def _check_drivers(self, allowed_dead: set[str]) -> None:
        for view in self.views:
            driver = view.driver
            code = driver.exit_code
            if code is not None and driver.owner not in allowed_dead and code != 0:
                raise RunFailed(f"pipeline {driver.owner} stopped (exit {code}): {driver.log_tail()} (log: "
                                f"{os.path.join(driver.spec.directory, 'driver.log')})")

    def _start_pipelines(self) -> None:
        self.phase = "starting Spark"
        deadline = time.time() + STARTUP_LIMIT_S
        # One driver at a time: each query's first batch starts Python workers that must connect back
        # to the JVM within Spark's fixed timeout, which several drivers starting at once on a small,
        # busy machine can miss.
        for view in self.views:
            view.driver.start()
            while not self._ready(view):
                self._check_drivers(set())
                self._deadline_check()
                if time.time() > deadline:
                    raise RunFailed(f"the pipelines did not start within {STARTUP_LIMIT_S:g} s; see their "
                                    "driver.log files")
                time.sleep(0.5)
        self.note(f"{len(self.views)} pipelines running ({', '.join(v.driver.owner for v in self.views)}), "
                  f"each its own Spark driver")

    @staticmethod
    def _ready(view: PipelineView) -> bool:
        progress = _progress(view.driver.spec)
        return all(progress.computations[name].batches > 0 for name in COMPUTATIONS)

    def _traffic(self, registry: IdRegistry) -> None:
        self.phase = "traffic"
        self.config = replace(self.options.data, start_ms=int(time.time() * 1000) + 500)
        self.data = generate(self.config)
        with open(self.layout.path("data.json"), "w", encoding="utf-8") as out:
            json.dump(self.config.to_json(), out, indent=1)
        self.writer = LogWriter(self.config, self.data, self.layout.query_log, self.layout.click_log).start()
        self.note(f"traffic started: {len(self.data.queries):,} queries, {len(self.data.clicks):,} click records "
                  f"over {self.config.seconds:g} s (+ the clicks' tail)")
        armed = resharded = False
        armed_at = 0.0
        kill = self.options.kill_at_s is not None
        while not self.writer.done or (kill and self.killed_at is None) or (
                self.options.restart_after_s is not None and self.killed_at is not None and not self.restarted) or (
                self.restarted and not self._back(registry)):
            if self.writer.error is not None:
                raise RunFailed(f"the log writer failed: {self.writer.error}")
            now = self.elapsed_traffic()
            if kill and not armed and now >= self.options.kill_at_s:  # type: ignore[operator]
                self.victim = self._leader()
                open(self.kill_file(self.victim.owner), "w").close()
                armed, armed_at = True, time.time()
                self.note(f"kill armed: {self.victim.owner} (the pipeline ahead) dies right after its next registry "
                          "commit")
            victim = self.victim
            if armed and victim is not None and self.killed_at is None:
                if not victim.alive:
                    self._died(victim)
                elif time.time() - armed_at > KILL_WAIT_S:  # no commit came: kill it from outside
                    victim.kill()
                    self._died(victim, outside=True)
            if victim is not None and self.killed_at is not None and not self.restarted \
                    and self.options.restart_after_s is not None \
                    and time.time() - self.killed_at >= self.options.restart_after_s:
                faults = replace(victim.spec.faults, die_when=None, die_after_commit=0)
                victim.start(replace(victim.spec, faults=faults))
                # On the registry's clock: `_back` compares it with a heartbeat, which is stamped with it.
                self.restarted, self.restarted_ms = True, registry.now_ms()
                self.note(f"{victim.owner} restarted on its root (same owner name): it re-runs the batch it died in")
            if self.options.reshard_to and not resharded and now >= 0.6 * self.config.seconds:
                before = registry.sharding().entries[-1].shard_count
                entry = registry.reshard(self.options.reshard_to, safety_margin_ms=2_000)
                resharded = True
                self.note(f"registry resharded while running: {before} -> {entry.shard_count} shards for ids stamped "
                          f"from {entry.effective_from_ms - self.config.start_ms} ms of traffic on (now + 2 s)")
            self._check_drivers(self._dead())
            self._deadline_check()
            self._update()
            time.sleep(0.5)
        self.note("the query and click logs are complete")

    def _leader(self) -> Driver:
        """The pipeline that has joined the most clicks so far (ties: the one that read the most): a
        pipeline that lags finds every click registered by the other and commits nothing, so it could
        never die right after a commit."""
        def lead(view: PipelineView) -> tuple[int, int]:
            return len(view.joined_records), _progress(view.driver.spec).computations["dispatcher"].records

        return max(self.views, key=lead).driver

    def _back(self, registry: IdRegistry) -> bool:
        """Whether the restarted victim is running again: a heartbeat since its restart, and its
        dispatcher has published a micro-batch since (the one it died in, run again). Until then the
        verifier must not run (it could take the owner for gone and retire it while Spark starts), and
        nothing may wait on the victim's answers with a deadline meant for a running pipeline."""
        assert self.victim is not None
        seen = registry.owner_last_seen(self.victim.owner)
        dispatcher = _progress(self.victim.spec).computations["dispatcher"]
        return seen is not None and seen >= self.restarted_ms and dispatcher.batches > self.victim_batches

    def _dead(self) -> set[str]:
        """The owners allowed to be dead now: the victim, between its death and its restart (or for good)."""
        if self.victim is not None and self.killed_at is not None and not self.restarted:
            return {self.victim.owner}
        return set()

    def _died(self, victim: Driver, outside: bool = False) -> None:
        self.killed_at = time.time()
        self.victim_batches = _progress(victim.spec).computations["dispatcher"].batches  # published before death
        fired = [f for f in read_fault_records(os.path.join(victim.spec.directory, "faults.jsonl"))
                 if f["fault"] == "die_after_commit"]
        if outside or not fired:
            self.note(f"{victim.owner} SIGKILLed from outside (no registry commit came)")
        else:
            self.note(f"{victim.owner} SIGKILLed right after registering {len(fired[-1]['committed'])} click ids, "
                      f"before writing them (driver, JVM and Spark workers)")
        if self.options.restart_after_s is None:
            self.note(f"{victim.owner} stays dead: the verifier will repair what it registered and never wrote")

    def _verifier(self, registry: IdRegistry) -> Verifier:
        from millstream.apps.photon.adapter import AdClickAdapter

        return Verifier(registry, self.layout.click_log, [v.driver.spec.layout for v in self.views],
                        self.layout.reinject_dir, owner_timeout_ms=self.options.owner_timeout_ms,
                        adapter=AdClickAdapter())

    def _verify(self, registry: IdRegistry) -> None:
        self.phase = "verifying"
        verifier = self._verifier(registry)
        dead = self._dead()
        while True:
            self._update()
            try:
                report = verifier.run()
            except REGISTRY_FAILURES as error:  # a registry restarting: the next round tries again
                self.note(f"verifier: the registry failed ({type(error).__name__}); trying again in "
                          f"{VERIFY_EVERY_S:g} s")
                self._check_drivers(dead)
                self._deadline_check()
                time.sleep(VERIFY_EVERY_S)
                continue
            self.verifier_reports.append(report)
            if report.repaired:
                self.note(f"verifier: {len(report.repaired)} clicks registered by {', '.join(report.retired_owners)} "
                          f"(gone, now retired) and written nowhere: deleted from the registry and re-injected")
            if report.settled:
                self.note(f"verifier: every click written exactly once ({report.summary()})")
                return
            self._check_drivers(dead)
            self._deadline_check()
            time.sleep(VERIFY_EVERY_S)

    def _gc_demo(self, registry: IdRegistry) -> dict[str, Any]:
        """Forget the first quarter of the traffic, then replay some of its clicks."""
        self.phase = "GC"
        assert self.data is not None
        boundary = self.config.start_ms + int(self.config.seconds * 1000 / 4)
        self._wait_for_pending_clicks()
        result = registry.gc(boundary)
        joined = {r.key for v in self.views for r in v.joined_records}
        old = [c for c in self.data.clicks if c.timestamp < boundary and c.key in joined]
        old = list({c.key: c for c in old}.values())[:GC_REPLAYS]
        name = f"replayed-{int(time.time() * 1000)}.jsonl"
        with open(os.path.join(self.layout.reinject_dir, "." + name), "w", encoding="utf-8") as out:
            for c in old:
                out.write(json.dumps({"key": c.key, "value": c.value, "timestamp": c.timestamp,
                                      "id": f"replayed:{c.id}"}) + "\n")
        os.replace(os.path.join(self.layout.reinject_dir, "." + name), os.path.join(self.layout.reinject_dir, name))
        replayed = {c.key for c in old}
        self.replayed = len(old)
        deadline = time.time() + GC_ANSWER_LIMIT_S
        live = [v for v in self.views if v.driver.alive]
        while time.time() < deadline:
            self._update()
            answered = [replayed <= {r.key for r in v.unjoinable_records if r.value["reason"] == "expired"}
                        for v in live]
            if all(answered):
                break
            time.sleep(1.0)
        else:
            raise RunFailed(f"replayed old clicks were not answered 'expired' within {GC_ANSWER_LIMIT_S:g} s")
        self.note(f"GC: boundary at {boundary - self.config.start_ms} ms of traffic, {result.deleted} ids deleted; "
                  f"{len(replayed)} old clicks replayed: answered 'expired' and skipped by every live pipeline")
        return {"boundary_ms": boundary, "deleted": result.deleted, "replayed": sorted(replayed)}

    def _wait_for_pending_clicks(self) -> None:
        """Wait until no live pipeline holds a click for a retry. A click still waiting in a pipeline
        (one restarted late, say) when the registry forgets its id would be answered "expired" there,
        though another pipeline decided it: Photon's GC threshold is days, far behind any click in
        flight, and the demo's is seconds, so the demo waits for the clicks in flight instead."""
        deadline = time.time() + GC_ANSWER_LIMIT_S
        while True:
            self._update()
            holding = {v.driver.owner: v.clicks_pending() for v in self.views if v.driver.alive}
            if not any(holding.values()):
                return
            if time.time() > deadline:
                raise RunFailed(f"clicks still waiting for a retry after {GC_ANSWER_LIMIT_S:g} s: {holding}")
            time.sleep(1.0)

    def _finish(self) -> None:
        self.phase = "finishing"
        open(os.path.join(self.layout.reinject_dir, DONE_MARKER), "w").close()
        deadline = time.time() + FINISH_LIMIT_S
        live = [v.driver for v in self.views if v.driver.alive]
        while any(d.alive for d in live):
            self._update()
            if time.time() > deadline:
                raise RunFailed(f"the pipelines did not finish within {FINISH_LIMIT_S:g} s of the end of the logs")
            time.sleep(0.5)
        self._check_drivers(self._dead())
        self.note("the pipelines finished")

    # -- progress -------------------------------------------------------------------------------------
    def _update(self) -> None:
        for view in self.views:
            view.poll()
        self.display.update(self.snapshot())

    def snapshot(self) -> Snapshot:
        rows = []
        clicks_in = 0
        for view in self.views:
            progress = _progress(view.driver.spec)
            for name in COMPUTATIONS:
                c = progress.computations[name]
                rows.append(ComputationStatus(f"{view.driver.owner}.{name}", c.low_watermark, c.records, c.late,
                                              c.dead_letters))
            clicks_in = max(clicks_in, progress.computations["dispatcher"].records)
        total = DispatchStats()
        for view in self.views:
            total += view.totals()
        joined = {r.key for v in self.views for r in v.joined_records}
        unjoinable = {r.key for v in self.views for r in v.unjoinable_records if r.value["reason"] != "expired"}
        latencies = self.latencies()
        p50 = latencies.get("p50_s")
        p90 = latencies.get("p90_s")
        truth = Truth.of(self.data) if self.data is not None else None
        states = []
        for view in self.views:
            driver = view.driver
            state = "running" if driver.alive else ("killed" if self.killed_at and driver is self.victim
                                                    else "stopped")
            states.append((driver.owner, state + (" (restarted)" if driver.starts > 1 and driver.alive else "")))
        totals = (
            ("joined", f"{len(joined):,}" + (f"/{len(truth.joinable):,}" if truth else "")),
            ("wasted", f"{total.wasted:,}"), ("retries", f"{total.retries:,}"),
            ("unjoinable", f"{len(unjoinable):,}"), ("registry batch", f"{total.mean_commit_batch:.1f}"),
            ("latency p50/p90", f"{format_duration(None if p50 is None else p50 * 1000)}/"
                                f"{format_duration(None if p90 is None else p90 * 1000)}"),
            *states,
        )
        newest = int(time.time() * 1000) if self.config.start_ms else None
        return Snapshot(clicks_in, tuple(rows), total=len(self.data.clicks) + self.replayed if self.data else None,
                        newest_event=newest, totals=totals, phase=self.phase)

    def latencies(self) -> dict[str, Any]:
        if self.data is None or self.writer is None:
            return {}
        records = [r for v in self.views for r in v.joined_records]
        return latency_summary(join_latencies_ms(Truth.of(self.data), self.writer.visible_ms, records))

    # -- the report -----------------------------------------------------------------------------------
    def _report(self, gc: dict[str, Any] | None) -> dict[str, Any]:
        assert self.data is not None and self.writer is not None
        truth = Truth.of(self.data)
        joined = [r for v in self.views for r in v.joined_records]
        unjoinable = [r for v in self.views for r in v.unjoinable_records]
        check = check_outputs(truth, joined, unjoinable)
        latencies = join_latencies_ms(truth, self.writer.visible_ms, joined)
        stats_values = [value for v in self.views for value in v.stats_values]
        total = DispatchStats()
        for view in self.views:
            total += view.totals()
        traffic_s = (self.config.traffic_end_ms - self.config.start_ms) / 1000
        load = RegistryLoad.of(stats_values, traffic_s)
        report = {
            "ok": check.ok,
            "config": self.config.to_json(),
            "options": {"pipelines": self.options.pipelines, "registry": self.options.registry_url.split("://")[0],
                        "kill_at_s": self.options.kill_at_s, "restart_after_s": self.options.restart_after_s,
                        "reshard_to": self.options.reshard_to, "master": self.options.master,
                        "trigger_ms": self.options.trigger_ms},
            "latency": latency_summary(latencies),
            "latencies_ms": latencies,
            "latency_parts": {name: latency_summary(values) for name, values in
                              latency_parts_ms(truth, self.writer.visible_ms, joined).items()},
            "check": {**check.__dict__},
            "stats": total.to_json(),
            "per_pipeline": {v.driver.owner: v.totals().to_json() for v in self.views},
            "batches": {v.driver.owner: batch_cadence(_batch_times(v.driver.spec), self.config.start_ms,
                                                      self.config.traffic_end_ms) for v in self.views},
            "registry": {**load.__dict__, "ids_per_second": load.ids_per_second},
            "verifier": [r.to_json() for r in self.verifier_reports if r.repaired or r.settled],
            "gc": gc,
            "events": self.events,
            "elapsed_s": round(time.time() - self.started, 1),
        }
        with open(self.layout.path("report.json"), "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1)
        return report


def _batch_times(spec: PhotonPipelineSpec) -> list[int]:
    """When each of the dispatcher's published micro-batches ran (wall ms), oldest first."""
    from millstream.spark.storage import Storage

    status = Storage(spec.layout.run_root).child("status/dispatcher")
    entries = (status.read_json(f"history/{name}") for name in status.list("history") if name.endswith(".json"))
    return sorted(entry["wall_ms"] for entry in entries if entry is not None and entry.get("wall_ms"))


def _progress(spec: PhotonPipelineSpec) -> Any:
    from millstream.spark.progress import read_progress
    from millstream.spark.storage import Storage

    return read_progress(Storage(spec.layout.run_root), list(COMPUTATIONS), set(INJECTORS))


__all__ = ["DemoLayout", "DemoOptions", "Driver", "PhotonDemo", "owner_name"]
