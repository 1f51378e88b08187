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
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# orjson is fast and strict but reads integers outside [-2**63, 2**64) as floats: 20 digits, or 19
# after a minus sign (as model/codecs.py's JSON codec). Those take the stdlib path.
_BIG_INTEGER_BYTES = re.compile(rb"-\d{19}|\d{20}")
_BIG_INTEGER_TEXT = re.compile(r"-\d{19}|\d{20}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"JSON has no {name}")


def _finite(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):  # 1e400: no float holds it
        raise ValueError(f"JSON number {text} is out of a float's range")
    return number


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite)


def loads(data: bytes | str) -> Any:
    """The JSON value of `data` (UTF-8 bytes or text); ValueError where it is not strict JSON."""
    if isinstance(data, str):
        if _BIG_INTEGER_TEXT.search(data) is None:
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
        return _DECODER.decode(data)
    if _BIG_INTEGER_BYTES.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return _DECODER.decode(bytes(data).decode("utf-8"))
