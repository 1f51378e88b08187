"""millstream: Google's MillWheel programming model for Python, executed by Spark Structured Streaming."""

from millstream.injectors.files import FileInjector
from millstream.injectors.generator import GeneratorInjector
from millstream.injectors.scripted import ScriptedInjector
from millstream.model.codecs import BytesCodec, Codec, JsonCodec, PickleCodec, StrCodec
from millstream.model.computation import Computation, Context
from millstream.model.injector import Injector, Offset
from millstream.model.pipeline import Pipeline, PipelineError, Production
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, TimeDomain, Timer
from millstream.model.state import ListState, MapState, ValueState

__all__ = [
    "BEGINNING_OF_TIME", "END_OF_TIME", "BytesCodec", "Codec", "Computation", "Context", "FileInjector",
    "GeneratorInjector", "Injector", "JsonCodec", "ListState", "MapState", "Offset", "PickleCodec",
    "Pipeline", "PipelineError", "Production", "Record", "ScriptedInjector", "StrCodec", "TimeDomain",
    "Timer", "ValueState",
]
