"""Wiring: searches -> windower -> model_calculator -> spike_detector / dip_detector -> anomalies.

    injector  searches          --queries-->  windower, spike_detector
    windower                    --windows-->  model_calculator
    model_calculator            --model---->  spike_detector, dip_detector
    spike_detector, dip_detector --anomalies--> sinks (JSON lines and Parquet)
"""

from __future__ import annotations

import os
from typing import Any
from dataclasses import dataclass, field, replace

from millstream.apps.zeitgeist.computations import (
    DIPS,
    SPIKES,
    DetectorSettings,
    DipDetector,
    ModelCalculator,
    ModelSettings,
    SpikeDetector,
    Windower,
)
from millstream.apps.zeitgeist.generator import ZeitgeistConfig, ZeitgeistInjector
from millstream.model.pipeline import Pipeline

INJECTOR = "searches"
COMPUTATIONS = ("windower", "model_calculator", "spike_detector", "dip_detector")
STREAMS = ("queries", "windows", "model", "anomalies")


@dataclass(frozen=True)
class PipelineConfig:
    """The generator's settings plus how the pipeline treats them. `output_dir`: where the anomaly
    sinks write (`anomalies-jsonl/`, `anomalies-parquet/`); None: no sinks (harness runs)."""

    generator: ZeitgeistConfig = field(default_factory=ZeitgeistConfig)
    output_dir: str | None = None
    model: ModelSettings | None = None  # None: derived from the generator's day length
    spikes: DetectorSettings = SPIKES
    dips: DetectorSettings = DIPS
    watermark: str = "honest"  # or "naive" (see ZeitgeistInjector)
    records_per_second: float | None = None  # pace the injector in wall time (None: as fast as possible)
    max_records_per_read: int = 20_000  # searches per micro-batch at most
    # The Windower's windows go only to the ModelCalculator, so weak productions can fuse the two
    # into one query (MillWheel section 5.4). Off by default: strong productions keep `windows` logged.
    weak_windower: bool = False

    def model_settings(self) -> ModelSettings:
        return self.model or ModelSettings(day_ms=self.generator.day_ms)


def build_pipeline(config: PipelineConfig | ZeitgeistConfig | None = None) -> Pipeline:
    if config is None:
        config = PipelineConfig()
    elif isinstance(config, ZeitgeistConfig):
        config = PipelineConfig(generator=config)
    gen = config.generator
    model = config.model_settings()
    injector = ZeitgeistInjector(gen, records_per_second=config.records_per_second,
                                 max_records_per_read=config.max_records_per_read, watermark=config.watermark)
    pipeline = (
        Pipeline("zeitgeist")
        .add_injector(INJECTOR, injector, "queries")
        .add_computation("windower", Windower(quiet_ms=gen.day_ms, stream_start=gen.start_ms, stream_end=gen.end_ms),
                         ["queries"], ["windows"], production="weak" if config.weak_windower else "strong")
        .add_computation("model_calculator", ModelCalculator(model), ["windows"], ["model"])
        .add_computation("spike_detector", SpikeDetector(config.spikes, model), ["queries", "model"], ["anomalies"])
        .add_computation("dip_detector", DipDetector(config.dips), ["model"], ["anomalies"])
    )
    if config.output_dir is not None:
        pipeline.add_sink("anomalies_jsonl", "anomalies", os.path.join(config.output_dir, "anomalies-jsonl"), "jsonl")
        pipeline.add_sink("anomalies_parquet", "anomalies", os.path.join(config.output_dir, "anomalies-parquet"),
                          "parquet")
    return pipeline


def with_generator(config: PipelineConfig, **changes: Any) -> PipelineConfig:
    return replace(config, generator=replace(config.generator, **changes))
