"""One complete Photon pipeline as an ordinary millstream pipeline, and running it on Spark.

    queries  (FileInjector: the primary log)        --> event_reader  (writes the EventStore)
    clicks   (FileInjector: the foreign log)      --+
    reinjected (FileInjector: the verifier's files) +--> dispatcher --> joined, unjoinable, photon_stats
                                                                        (JSON-lines sinks under out/)

Redundant pipelines are several of these, each with its own directory (its millstream root, EventStore
and outputs), its own Spark driver, and its own owner name, reading the same logs and sharing one
IdRegistry. `PhotonPipelineSpec` describes one in JSON, so that a driver process can be started
with `python -m millstream.photon.driver SPEC.json` (which runs `run_pipeline`).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping

from millstream.injectors.files import FileInjector
from millstream.model.pipeline import Pipeline
from millstream.photon.adapter import JoinAdapter
from millstream.photon.dispatcher import (JOINED, STATS, UNJOINABLE, ClickShard, Dispatcher, RegistrySpec,
                                          RetryPolicy)
from millstream.photon.eventreader import EventReader, primary_key
from millstream.photon.faults import PhotonFaults
from millstream.photon.liveness import OwnerHeartbeat, check_not_retired
from millstream.photon.outputs import PipelineLayout
from millstream.photon.ownership import claim_owner_root

INJECTORS = ("queries", "clicks", "reinjected")
REINJECTED_IDLE_AFTER_MS = 5_000  # the re-injection input, quiet this long, stops holding the dispatcher
COMPUTATIONS = ("event_reader", "dispatcher")


def load_adapter(path: str) -> JoinAdapter:
    """An adapter named `module:Class` (made with no arguments).

    >>> type(load_adapter("millstream.photon.adapter:JoinAdapter")).__name__
    'JoinAdapter'
    """
    module_name, _, class_name = _adapter_parts(path)
    try:
        kind = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"adapter {path!r}: {error}") from None
    adapter = kind()
    if not isinstance(adapter, JoinAdapter):
        raise TypeError(f"{path} is not a millstream.photon.JoinAdapter")
    return adapter


def _adapter_parts(path: str) -> tuple[str, str, str]:
    module_name, colon, class_name = path.partition(":")
    if not (module_name and colon and class_name):
        raise ValueError(f"adapter must be 'module:Class', got {path!r}")
    return module_name, colon, class_name


@dataclass(frozen=True)
class PhotonPipelineSpec:
    """Everything one redundant pipeline needs; JSON round-trips (`to_json`/`from_json`).

    - `owner`: the pipeline's name in registry tokens and heartbeats (unique among the pipelines);
    - `directory`: its own directory (see `PipelineLayout`);
    - `query_log`, `click_log`, `reinject_dir`: directories of JSON-lines files, shared by all pipelines;
      `log_creation` is how their files' creation times are read ("name": epoch ms in the file name);
    - `registry_url` (no password: see credentials.py) and `registry_options`;
    - `adapter`: `module:Class` of the JoinAdapter;
    - the dispatcher's `retry`, `dispatch_shards`, `max_outstanding`, and the EventStore's
      `max_disorder_ms` (how late a query may reach its log, in event time);
    - Spark: `master`, `key_groups`, `trigger_ms`; `faults` for tests and demos.

    >>> spec = PhotonPipelineSpec("photon-a", "/data/a", "/logs/q", "/logs/c", "/logs/r", "sqlite:////data/ids.db")
    >>> PhotonPipelineSpec.from_json(spec.to_json()) == spec
    True
    """

    owner: str
    directory: str
    query_log: str
    click_log: str
    reinject_dir: str
    registry_url: str
    registry_options: Mapping[str, Any] = field(default_factory=dict)
    adapter: str = "millstream.photon.adapter:JoinAdapter"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    dispatch_shards: int = 8
    max_outstanding: int = 1_000
    max_disorder_ms: int = 30_000
    log_creation: str = "name"
    master: str = "local[2]"
    key_groups: int = 8
    trigger_ms: int = 200
    faults: PhotonFaults = field(default_factory=PhotonFaults)

    def __post_init__(self) -> None:
        # Refused here, where the user wrote it: not inside a Spark task (the dispatcher's setup).
        if not isinstance(self.owner, str) or not self.owner or "/" in self.owner:
            raise ValueError(f"owner must be a non-empty string without '/', got {self.owner!r}")
        for name, least in (("dispatch_shards", 1), ("max_outstanding", 1), ("key_groups", 1),
                            ("max_disorder_ms", 0), ("trigger_ms", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be at least {least}, got {value!r}")
        _adapter_parts(self.adapter)

    @property
    def layout(self) -> PipelineLayout:
        return PipelineLayout(self.directory)

    @property
    def registry(self) -> RegistrySpec:
        return RegistrySpec(self.registry_url, self.registry_options)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["registry_options"] = dict(self.registry_options)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PhotonPipelineSpec":
        values = dict(data)
        values["retry"] = RetryPolicy(**values.get("retry", {}))
        values["faults"] = PhotonFaults.from_json(values.get("faults"))
        values["registry_options"] = dict(values.get("registry_options") or {})
        return cls(**values)

    def save(self, path: str) -> None:
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            json.dump(self.to_json(), out, indent=1)
        os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, path: str) -> "PhotonPipelineSpec":
        with open(path, encoding="utf-8") as data:
            return cls.from_json(json.load(data))

    def without_faults(self) -> "PhotonPipelineSpec":
        return replace(self, faults=PhotonFaults())


def build_photon_pipeline(spec: PhotonPipelineSpec, adapter: JoinAdapter | None = None,
                          sinks: bool = True) -> Pipeline:
    """The millstream pipeline of `spec` (see the module doc); `adapter` overrides `spec.adapter`;
    `sinks=False` leaves the sinks out (the in-process harness has no sinks)."""
    adapter = adapter or load_adapter(spec.adapter)
    layout = spec.layout
    creation = spec.log_creation
    # The logs' writers may start after the pipelines (missing_ok). The re-injection directory is
    # written rarely (by the verifier), its files named by the time they are written. Its files'
    # names, not the clock, move its watermark: an injector whose watermark followed the clock would
    # change its offset at every trigger and make Spark run a micro-batch each time, for nothing. So
    # it declares itself idle when quiet: otherwise, until the first re-injection, it would hold the
    # dispatcher's low watermark at the beginning of time, and every event-time consumer of `joined`
    # with it. (A re-injected click is late whenever it comes: the verifier re-injects what was lost
    # long after its time.)
    pipeline = (
        Pipeline("photon")
        .add_injector("queries", FileInjector(spec.query_log, creation=creation, missing_ok=True), "queries")
        .add_injector("clicks", FileInjector(spec.click_log, creation=creation, missing_ok=True), "clicks")
        .add_injector("reinjected", FileInjector(spec.reinject_dir, creation="name", missing_ok=True), "reinjected",
                      idle_after_ms=REINJECTED_IDLE_AFTER_MS)
        .add_computation("event_reader", EventReader(layout.event_store, adapter), {"queries": primary_key},
                         on_error="dead_letter")
        .add_computation(
            "dispatcher",
            Dispatcher(spec.owner, spec.registry, layout.event_store, adapter, retry=spec.retry,
                       max_outstanding=spec.max_outstanding, max_disorder_ms=spec.max_disorder_ms, faults=spec.faults),
            {"clicks": ClickShard(adapter, spec.dispatch_shards), "reinjected": ClickShard(adapter, spec.dispatch_shards)},
            [JOINED, UNJOINABLE, STATS])
    )
    if sinks:
        pipeline.add_sink("joined_out", JOINED, layout.joined_dir, "jsonl")
        pipeline.add_sink("unjoinable_out", UNJOINABLE, layout.unjoinable_dir, "jsonl")
        pipeline.add_sink("stats_out", STATS, layout.stats_dir, "jsonl")
    return pipeline


def check_owner_may_start(spec: PhotonPipelineSpec) -> None:
    """Refuse to start a pipeline whose owner name the verifier retired (OwnerRetired) or that belongs
    to another root (ownership.OwnerOfAnotherRoot); bind a new owner name to this pipeline's root."""
    with spec.registry.open() as registry:
        check_not_retired(registry, spec.owner)
        claim_owner_root(registry, spec.owner, spec.layout.run_root)


def run_pipeline(spec: PhotonPipelineSpec, *, timeout_s: float | None = None,
                 on_progress: Callable[[Any], None] | None = None) -> Any:
    """Run the pipeline of `spec` on Spark until its three logs are finished (a `_DONE` file in each
    directory) and every click is settled; returns the runner's final progress. Refuses (OwnerRetired,
    OwnerOfAnotherRoot: `check_owner_may_start`) before Spark starts. Writes the owner's heartbeat while
    it runs."""
    from millstream.spark.runner import SparkRunner

    check_owner_may_start(spec)
    os.makedirs(spec.directory, exist_ok=True)
    pipeline = build_photon_pipeline(spec)
    runner = SparkRunner(pipeline, root=spec.layout.run_root, master=spec.master, key_groups=spec.key_groups,
                         trigger_ms=spec.trigger_ms)
    with OwnerHeartbeat(spec.registry.open, spec.owner):
        # Retries come due up to max_retry_ms ahead: the run waits for them rather than leaving clicks
        # pending at the end of input.
        drain_s = (spec.retry.max_retry_ms * 1.25 + spec.retry.unjoinable_after_ms) / 1000 + 10
        return runner.run(on_progress=on_progress, timeout=timeout_s, wall_timer_drain_s=drain_s)
