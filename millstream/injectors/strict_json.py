"""JSON as the pipeline's JSON codec accepts it, for injectors reading external input: NaN and the
infinities, which Python's json module reads, are refused here, so a line or message holding one
becomes a dead letter where it is read instead of stopping the step that encodes it.

>>> loads(b'{"n": 1, "big": 123456789012345678901}')
{'n': 1, 'big': 123456789012345678901}
>>> loads('{"n": NaN}')
Traceback (most recent call last):
...
ValueError: JSON has no NaN
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# orjson is fast and strict but reads integers beyond 64 bits as floats: those take the stdlib path.
_BIG_INTEGER_BYTES = re.compile(rb"\d{20}")
_BIG_INTEGER_TEXT = re.compile(r"\d{20}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"JSON has no {name}")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


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
