"""JSON as the pipeline's JSON codec accepts it, for injectors reading external input: NaN and the
infinities, which Python's json module reads, are refused here, so a line or message holding one
becomes a dead letter where it is read instead of stopping the step that encodes it.

>>> loads(b'{"n": 1, "big": 123456789012345678901}')
{'n': 1, 'big': 123456789012345678901}
>>> loads('{"n": NaN}')
Traceback (most recent call last):
...
ValueError: JSON has no NaN
>>> loads(b'[-12345678901234567890, 1e400]')
Traceback (most recent call last):
...
ValueError: JSON number 1e400 is out of a float's range

Text no UTF-8 can hold (an escaped half of a surrogate pair) and nesting too deep to read are
refused as well: Python's json module would read the first, and crash on the second.

>>> try:
...     loads(rb'{"key": "\\ud800"}')
... except ValueError as refused:
...     print(str(refused).split(":")[0])  # then orjson's words
not strict JSON
>>> loads("[" * 5000 + "]" * 5000)
Traceback (most recent call last):
...
ValueError: JSON nested too deeply to read
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from millstream.model.codecs import BIG_INTEGER


def _reject_constant(name: str) -> Any:
    raise ValueError(f"JSON has no {name}")


def _finite(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):  # 1e400: no float holds it
        raise ValueError(f"JSON number {text} is out of a float's range")
    return number


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite)


def loads(data: bytes | str) -> Any:
    """The JSON value of `data` (UTF-8 bytes or text); ValueError where it is not strict JSON (text
    that is not UTF-8 included: UnicodeError is a ValueError)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    refused: orjson.JSONDecodeError | None = None
    if BIG_INTEGER.search(raw) is None:  # orjson reads those as floats: they take the exact stdlib path
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            refused = error  # the stdlib's reading below words NaN and out-of-range numbers better
    try:
        value = _DECODER.decode(raw.decode("utf-8"))
        if refused is None:  # read by the stdlib alone: its strings may hold escaped surrogate halves
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    if refused is not None:  # the stdlib reads what orjson refuses (an escaped surrogate half): refused
        raise ValueError(f"not strict JSON: {refused}") from None
    return value
