"""Time in Photon's components: integer milliseconds since the epoch, from an injectable clock."""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], int]
"""Returns the current time in milliseconds since the epoch (tests pass a fake one)."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
