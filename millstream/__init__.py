"""millstream: Google's MillWheel programming model for Python, executed by Spark Structured Streaming."""

from millstream.injectors.dataframe import DataFrameInjector
from millstream.injectors.files import FileInjector
from millstream.injectors.generator import GeneratorInjector
from millstream.injectors.heuristic import HeuristicWatermark
from millstream.injectors.kafka import KafkaInjector, KafkaInjectorError, KafkaMessage
from millstream.injectors.scripted import ScriptedInjector
from millstream.joins import IntervalJoin
from millstream.model.codecs import BytesCodec, Codec, CodecError, JsonCodec, PickleCodec, StrCodec
from millstream.model.computation import Computation, ComputationInfo, Context
from millstream.model.injector import Injector, Malformed, Offset
from millstream.model.pipeline import DEAD_LETTERS, ErrorPolicy, Pipeline, PipelineError, Production
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, TimeDomain, Timer
from millstream.model.state import ListState, MapState, ValueState
from millstream.windows import (
    Collect, Count, Fold, Max, Min, SlidingWindows, Sum, TumblingWindows, Window, WindowAggregate,
)

__all__ = [
    "BEGINNING_OF_TIME", "DEAD_LETTERS", "END_OF_TIME", "BytesCodec", "Codec", "CodecError", "Collect",
    "Computation", "ComputationInfo", "Context", "Count", "DataFrameInjector", "ErrorPolicy", "FileInjector", "Fold",
    "GeneratorInjector", "HeuristicWatermark", "Injector", "IntervalJoin", "JsonCodec", "KafkaInjector", "KafkaInjectorError", "KafkaMessage",
    "ListState", "Malformed", "MapState", "Max", "Min", "Offset", "PickleCodec", "Pipeline", "PipelineError",
    "Production", "Record", "ScriptedInjector", "SlidingWindows", "StrCodec", "Sum", "TimeDomain", "Timer",
    "TumblingWindows", "ValueState", "Window", "WindowAggregate",
]
