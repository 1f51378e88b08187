"""millstream: Google's MillWheel programming model for Python, executed by Spark Structured Streaming."""

from millstream.injectors.files import FileInjector
from millstream.injectors.generator import GeneratorInjector
from millstream.injectors.kafka import KafkaInjector, KafkaInjectorError, KafkaMessage
from millstream.injectors.scripted import ScriptedInjector
from millstream.model.codecs import BytesCodec, Codec, CodecError, JsonCodec, PickleCodec, StrCodec
from millstream.model.computation import Computation, ComputationInfo, Context
from millstream.model.injector import Injector, Malformed, Offset
from millstream.model.pipeline import DEAD_LETTERS, ErrorPolicy, Pipeline, PipelineError, Production
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, TimeDomain, Timer
from millstream.model.state import ListState, MapState, ValueState

__all__ = [
    "BEGINNING_OF_TIME", "DEAD_LETTERS", "END_OF_TIME", "BytesCodec", "Codec", "CodecError", "Computation",
    "ComputationInfo", "Context", "ErrorPolicy", "FileInjector", "GeneratorInjector", "Injector", "JsonCodec",
    "KafkaInjector", "KafkaInjectorError", "KafkaMessage",
    "ListState", "Malformed", "MapState", "Offset", "PickleCodec", "Pipeline", "PipelineError", "Production",
    "Record", "ScriptedInjector", "StrCodec", "TimeDomain", "Timer", "ValueState",
]
