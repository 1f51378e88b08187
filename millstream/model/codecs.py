"""Serialization of stream values and persistent state: the user chooses, JSON is the default."""

from __future__ import annotations

import json
import pickle
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Codec(Protocol):
    """Turns values into bytes and back. Must be deterministic: equal values -> equal bytes."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


# Built once: json.dumps with options builds a new encoder per call, measurably slow per record.
_JSON_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_JSON_DECODER = json.JSONDecoder()


class JsonCodec:
    """JSON with sorted keys (deterministic bytes). Tuples come back as lists, dict keys as strings."""

    def encode(self, value: Any) -> bytes:
        try:
            return _JSON_ENCODER.encode(value).encode()
        except TypeError as error:
            raise TypeError(
                f"value {value!r} is not JSON-serializable ({error}); give the stream or state a "
                "different codec, e.g. millstream.PickleCodec()"
            ) from None

    def decode(self, data: bytes) -> Any:
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
