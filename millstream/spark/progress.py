"""A running pipeline's progress as SparkRunner reports it, read from the status files its driver
publishes under the root (rootfiles.py), so any process can read it: the runner itself, a command
watching drivers it started, a dashboard."""

from __future__ import annotations

from dataclasses import dataclass, field

from millstream.core.plan import producer_of
from millstream.core.watermarks import declared_keyed
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME
from millstream.spark.rootfiles import latest_status
from millstream.spark.storage import Storage


@dataclass
class ComputationProgress:
    low_watermark: int = BEGINNING_OF_TIME
    input_watermark: int = BEGINNING_OF_TIME
    records: int = 0
    duplicates: int = 0
    late: int = 0
    timers_fired: int = 0
    productions: int = 0
    dead_letters: int = 0
    pending_timers: int = 0
    batches: int = 0
    wall_ms: int = 0
    next_wall_timer: int | None = None
    keyed_watermarks: dict[str, int] = field(default_factory=dict)  # published, per watermark key


@dataclass
class InjectorProgress:
    """An injector's published low watermark (the minimum over its partitions). Records are counted
    where they are delivered: see ComputationProgress.records of its consumers."""

    low_watermark: int = BEGINNING_OF_TIME


@dataclass
class PipelineProgress:
    computations: dict[str, ComputationProgress] = field(default_factory=dict)
    injectors: dict[str, InjectorProgress] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """Every injector has finished and every computation's low watermark reached END_OF_TIME: all
        input was processed. (An idle injector has not finished: it may still send.)"""
        return bool(self.computations) and all(c.low_watermark >= END_OF_TIME for c in self.computations.values()) \
            and all(i.low_watermark >= END_OF_TIME for i in self.injectors.values())

    @property
    def pending_wall_timers(self) -> dict[str, int]:
        """Computations with wall-time timers still pending, and the earliest one."""
        return {n: c.next_wall_timer for n, c in self.computations.items() if c.next_wall_timer is not None}


def read_progress(storage: Storage, computations: list[str], injectors: set[str]) -> PipelineProgress:
    """A pipeline's progress from the status files its driver writes under the root: what
    `SparkRunner.progress` returns, readable by any process (a command watching drivers it started)."""
    result = PipelineProgress()
    for name in computations:
        status = storage.read_json(latest_status(name)) or {}
        metrics = status.get("metrics", {})
        result.computations[name] = ComputationProgress(
            low_watermark=status.get("low_watermark", BEGINNING_OF_TIME),
            input_watermark=status.get("input_watermark", BEGINNING_OF_TIME),
            records=metrics.get("records", 0),
            duplicates=metrics.get("duplicates", 0),
            late=metrics.get("late", 0),
            timers_fired=metrics.get("timers_fired", 0),
            productions=metrics.get("productions", 0),
            dead_letters=metrics.get("dead_letters", 0),
            pending_timers=metrics.get("pending_timers", 0),
            batches=status.get("batch", -1) + 1,
            wall_ms=status.get("wall_ms", 0),
            next_wall_timer=status.get("next_wall_timer"),
            keyed_watermarks=declared_keyed(status.get("keyed_watermarks", {})),
        )
        watermarks: dict[str, int] = {}
        for sender, watermark in status.get("senders", {}).items():
            producer = producer_of(sender)
            if producer in injectors:
                watermarks[producer] = min(watermarks.get(producer, END_OF_TIME), watermark)
        for producer, watermark in watermarks.items():
            injector = result.injectors.setdefault(producer, InjectorProgress())
            injector.low_watermark = max(injector.low_watermark, watermark)
    return result
