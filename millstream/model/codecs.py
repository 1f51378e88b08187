"""Serialization of stream values and persistent state: the user chooses, JSON is the default.

A codec must round-trip what it accepts (decode(encode(v)) == v, same types) and refuse the rest
with an error, never change a value silently. Codec errors are reported by the framework with the
state or stream they happened in.
"""

from __future__ import annotations

import inspect
import json
import math
import pickle
import re
from typing import Any, Protocol, runtime_checkable

import orjson


class CodecError(TypeError):
    """A value a codec cannot store faithfully; the framework adds where it happened."""


@runtime_checkable
class Codec(Protocol):
    """Turns values into bytes and back. Must be deterministic: equal values -> equal bytes."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


def is_codec(codec: Any) -> bool:
    """Whether `codec` can encode and decode as it is: encode() and decode() callable on it, and, on
    a class, static or class methods (`PickleCodec` where `PickleCodec()` was meant has both, but
    unbound: each call would fail).

    >>> class Upper:
    ...     encode = staticmethod(lambda value: value.upper().encode())
    ...     decode = staticmethod(lambda data: data.decode())
    >>> is_codec(PickleCodec()), is_codec(PickleCodec), is_codec(Upper), is_codec("json")
    (True, False, True, False)
    """
    if isinstance(codec, type):
        return all(isinstance(inspect.getattr_static(codec, name, None), (staticmethod, classmethod))
                   for name in ("encode", "decode"))
    return callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))


_JSON_SCALARS = frozenset({str, int, bool, type(None)})
_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS
# Built once: json.dumps with options builds a new encoder per call.
_JSON_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_JSON_DECODER = json.JSONDecoder()
# orjson reads integers outside [-2**63, 2**64) as floats: 20 digits, or 19 after a minus sign.
BIG_INTEGER = re.compile(rb"-\d{19}|\d{20}")


# Two empty parts: joined with orjson's bytes as the separator, they copy those bytes (see _orjson).
_TWO_EMPTY = (b"", b"")


def _orjson(value: Any, option: int = 0) -> bytes:
    """orjson's bytes, copied to an object of their own size: the object orjson returns keeps its whole
    output buffer (a kilobyte or more) for as long as it lives, and encoded values live on in
    productions and state until the step ends."""
    # Joining copies (cheaper than a memoryview); the bytes as the separator of two constant empty
    # parts spare building a tuple per call.
    return orjson.dumps(value, option=option).join(_TWO_EMPTY)


def _stdlib_json(value: Any) -> bytes:
    """The stdlib's JSON text of what orjson refuses: integers beyond 64 bits (written exactly) and
    text with surrogates (escaped). A high surrogate followed by a low one is refused: JSON reads the
    two escapes back as one character."""
    text = _JSON_ENCODER.encode(value)
    if "\\ud" in text and _JSON_DECODER.decode(text) != value:
        raise CodecError(
            "JSON cannot store text holding a surrogate pair as two characters (JSON reads it back as "
            "one character); join it with .encode('utf-16', 'surrogatepass').decode('utf-16'), or use "
            "a codec such as millstream.PickleCodec()"
        )
    return text.encode()


def _json_problem(value: Any) -> str | None:
    """Why `value` would not come back from JSON unchanged (None: it would)."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return None
    if kind is float:
        return None if math.isfinite(value) else f"{value!r} (JSON has no NaN or infinity)"
    if kind is list:
        for item in value:
            if type(item) not in _JSON_SCALARS and (problem := _json_problem(item)) is not None:
                return problem
        return None
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"a dict key {key!r} of type {type(key).__name__} (JSON keys are strings)"
            if type(item) not in _JSON_SCALARS and (problem := _json_problem(item)) is not None:
                return problem
        return None
    if kind is tuple:
        return f"a tuple {value!r} (JSON would return a list)"
    return f"a {kind.__name__} {value!r} (JSON would return {_json_would_return(value)})"


def _json_would_return(value: Any) -> str:
    try:
        return repr(json.loads(orjson.dumps(value)))
    except (TypeError, ValueError, orjson.JSONEncodeError):
        return "nothing: it is not JSON at all"


class JsonCodec:
    """Strict JSON with sorted keys (deterministic bytes): None, bool, int (any size), finite float,
    str, and lists and str-keyed dicts of those. Anything else (tuples, sets, dataclasses, datetimes,
    enums, non-str dict keys, NaN) is refused, since JSON would hand back a different value.

    >>> codec = JsonCodec()
    >>> codec.decode(codec.encode({"b": [1, 2.5, None], "a": "x"}))
    {'a': 'x', 'b': [1, 2.5, None]}
    >>> codec.encode((1, 2))
    Traceback (most recent call last):
    ...
    millstream.model.codecs.CodecError: JSON cannot store a tuple (1, 2) (JSON would return a list); use a list, or a codec such as millstream.PickleCodec()
    """

    def encode(self, value: Any) -> bytes:
        kind = type(value)
        if kind is int:
            return b"%d" % value  # JSON's text of any int, exactly
        if kind is str:
            try:
                return _orjson(value)
            except orjson.JSONEncodeError:
                return _stdlib_json(value)
        if kind is dict:  # the common flat record: str keys, scalar values (what _json_problem allows)
            for item in value.values():
                item_kind = type(item)
                # int and str, the common values, before the set: comparing is cheaper than hashing
                if item_kind is not int and item_kind is not str and item_kind not in _JSON_SCALARS:
                    break
            else:
                # orjson itself refuses keys that are not exactly str (subclasses too): those, like what
                # orjson cannot write (big integers, surrogates), take the general path below.
                try:  # _orjson(value, _ORJSON_OPTIONS), inlined: most productions come this way
                    return orjson.dumps(value, option=_ORJSON_OPTIONS).join(_TWO_EMPTY)
                except orjson.JSONEncodeError:
                    pass
        problem = _json_problem(value)
        if problem is not None:
            raise CodecError(
                f"JSON cannot store {problem}; use a list, or a codec such as millstream.PickleCodec()"
                if type(value) is tuple else
                f"JSON cannot store {problem}; convert it, or use a codec such as millstream.PickleCodec()"
            )
        try:
            return _orjson(value, _ORJSON_OPTIONS)
        except orjson.JSONEncodeError:
            return _stdlib_json(value)

    def decode(self, data: bytes) -> Any:
        # Texts that may hold such an integer take the exact stdlib path.
        if len(data) < 20 or BIG_INTEGER.search(data) is None:
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
        return _JSON_DECODER.decode(bytes(data).decode())

    def __repr__(self) -> str:
        return "JsonCodec()"


class PickleCodec:
    """Any picklable Python object. Opt-in: only for data the pipeline itself wrote (unpickling
    data from elsewhere can run arbitrary code).

    >>> PickleCodec().decode(PickleCodec().encode((1, {2: "x"})))
    (1, {2: 'x'})
    """

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=5)

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)

    def __repr__(self) -> str:
        return "PickleCodec()"


class BytesCodec:
    """Raw bytes, passed through untouched.

    >>> BytesCodec().encode(b"\\x00\\x01")
    b'\\x00\\x01'
    """

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise CodecError(f"BytesCodec needs bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes) -> Any:
        return bytes(data)

    def __repr__(self) -> str:
        return "BytesCodec()"


class StrCodec:
    """UTF-8 text.

    >>> StrCodec().decode(StrCodec().encode("héllo"))
    'héllo'
    """

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise CodecError(f"StrCodec needs str, got {type(value).__name__}")
        try:
            return value.encode()
        except UnicodeEncodeError as error:
            raise CodecError(
                f"StrCodec cannot store {value[error.start:error.end]!r} in {value[:40]!r}: a lone surrogate "
                "has no UTF-8; use millstream.JsonCodec(), which writes it as an escape"
            ) from None

    def decode(self, data: bytes) -> Any:
        return bytes(data).decode()

    def __repr__(self) -> str:
        return "StrCodec()"


DEFAULT_CODEC: Codec = JsonCodec()
