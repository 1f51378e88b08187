"""Serialization of stream values and persistent state: the user chooses, JSON is the default."""

from __future__ import annotations

import json
import pickle
import re

import orjson
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Codec(Protocol):
    """Turns values into bytes and back. Must be deterministic: equal values -> equal bytes."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


# Built once: json.dumps with options builds a new encoder per call, measurably slow per record.
_JSON_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_JSON_DECODER = json.JSONDecoder()
# orjson is ~10-20x faster per value. Integers beyond 64 bits take the stdlib path both ways (orjson
# refuses to write them and would read them back as floats).
_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
_BIG_INTEGER = re.compile(rb"\d{20}")


class JsonCodec:
    """Strict JSON with sorted keys (deterministic bytes). Tuples come back as lists, dict keys as
    strings, NaN and infinities as None (JSON has no such numbers)."""

    def encode(self, value: Any) -> bytes:
        try:
            return orjson.dumps(value, option=_ORJSON_OPTIONS)
        except (TypeError, orjson.JSONEncodeError):
            pass
        try:
            return _JSON_ENCODER.encode(value).encode()
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"value {value!r} is not JSON-serializable ({error}); give the stream or state a "
                "different codec, e.g. millstream.PickleCodec()"
            ) from None

    def decode(self, data: bytes) -> Any:
        if _BIG_INTEGER.search(data) is None:
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
        return _JSON_DECODER.decode(bytes(data).decode())

    def __repr__(self) -> str:
        return "JsonCodec()"


class PickleCodec:
    """Any picklable Python object. Opt-in: only for data the pipeline itself wrote."""

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=5)

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)

    def __repr__(self) -> str:
        return "PickleCodec()"


class BytesCodec:
    """Raw bytes, passed through untouched."""

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"BytesCodec needs bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes) -> Any:
        return bytes(data)

    def __repr__(self) -> str:
        return "BytesCodec()"


class StrCodec:
    """UTF-8 text."""

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"StrCodec needs str, got {type(value).__name__}")
        return value.encode()

    def decode(self, data: bytes) -> Any:
        return bytes(data).decode()

    def __repr__(self) -> str:
        return "StrCodec()"


DEFAULT_CODEC: Codec = JsonCodec()
