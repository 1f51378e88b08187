"""Dead letters: what the `dead_letter` error policy publishes instead of failing.

A dead letter is a record on the `dead_letters` stream (JSON) saying where it happened, what failed
and what the input was. Its id derives from the failed input's identity, so a re-run of the same step
produces the same dead letter, and its timestamp is the input's, so it travels with the watermarks.
"""

from __future__ import annotations

import traceback
from typing import Any

from millstream.core.production import Produced, order_base
from millstream.model.codecs import DEFAULT_CODEC
from millstream.model.pipeline import DEAD_LETTERS
from millstream.model.records import derive_record_id


_MILLSTREAM_FRAMES = ("/millstream/core/", "/millstream/spark/", "/millstream/testing/")


# The formatted frames of tracebacks seen, by the path through the code that raised: a key whose
# records keep failing at one place formats its frames once (Python finds the carets' columns by
# parsing each line again). Bounded: emptied when full.
_FRAMES_TEXT: dict[tuple[tuple[Any, int], ...], str] = {}
_FRAMES_TEXT_LIMIT = 1024


def user_traceback(error: BaseException) -> str:
    """The traceback of `error` without millstream's own frames: what the user's code did."""
    path = []
    entry = error.__traceback__
    while entry is not None:
        path.append((entry.tb_frame.f_code, entry.tb_lasti))  # the code and the instruction in it
        entry = entry.tb_next
    where = tuple(path)
    frames_text = _FRAMES_TEXT.get(where)
    if frames_text is None:
        frames = [f for f in traceback.extract_tb(error.__traceback__)
                  if not any(part in f.filename.replace("\\", "/") for part in _MILLSTREAM_FRAMES)]
        frames_text = "".join(traceback.format_list(frames))
        if len(_FRAMES_TEXT) >= _FRAMES_TEXT_LIMIT:
            _FRAMES_TEXT.clear()
        _FRAMES_TEXT[where] = frames_text
    return ("Traceback (most recent call last):\n" + frames_text
            + "".join(traceback.format_exception_only(type(error), error)))


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def json_safe(value: Any) -> Any:
    """`value` if JSON stores it faithfully, else its repr (a dead letter must always be writable)."""
    try:
        DEFAULT_CODEC.encode(value)
        return value
    except Exception:
        return repr(value)


def dead_letter(computation: str, *, key: str | None, stream: str | None, sender: str | None,
                record_id: str | None, timestamp: int, value: Any, error: BaseException | str,
                segment: int, timer: dict[str, Any] | None = None, traceback_text: str | None = None) -> Produced:
    if isinstance(error, BaseException):
        message = describe_error(error)
        traceback_text = traceback_text or user_traceback(error)
    else:
        message = error
    body = {
        "computation": computation,
        "input": stream,
        "sender": sender,
        "key": key,
        "record_id": record_id,
        "timestamp": timestamp,
        "value": json_safe(value),
        "timer": timer,
        "error": message,
        "traceback": traceback_text,
    }
    cause = record_id if timer is None else f"{key}\x1f{timer['tag']}\x1f{timer['time']}\x1f{timer['setter']}"
    letter_id = derive_record_id(computation, "dead", stream, cause)
    letter_key = key if key is not None else (sender or computation)
    return Produced(DEAD_LETTERS, letter_key, DEFAULT_CODEC.encode(body), timestamp, letter_id, segment,
                    order_base(letter_key) | 0xFFFFFFFF)
