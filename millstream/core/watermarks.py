"""Low-watermark arithmetic shared by the test harness and the Spark runner.

Terms
- *input*: one sender feeding a computation: an injector, or a (stream, producing computation) pair.
- *input watermark*: the low watermark an input has published; it never goes back.
- *idle input*: one that has declared it has nothing pending and nothing arriving (Hazelcast's idle
  message). It is excluded from the minimum until it publishes again.
- *coalesced watermark*: the minimum over the non-idle inputs. It never goes back either: if an idle
  input wakes up behind it, the coalesced value holds and that input's older records arrive late.
- *output watermark* of a computation (MillWheel's low watermark of A):
  min(coalesced input watermark, oldest pending work of A), where pending work after a step is the
  earliest pending low-watermark timer.

Rules (as in Hazelcast's WatermarkCoalescer):
1. An input's watermark is monotonic; publishing a lower value is a bug in that input and raises.
2. An input that has published nothing yet holds the minimum at BEGINNING_OF_TIME.
3. If every input is idle the coalesced watermark holds where it is (it does not jump ahead).
"""

from __future__ import annotations

from typing import Iterable

from millstream.model.records import BEGINNING_OF_TIME


class WatermarkRegressionError(RuntimeError):
    """An input published a watermark lower than one it published before."""


class WatermarkCoalescer:
    def __init__(self, inputs: Iterable[str], coalesced: int = BEGINNING_OF_TIME) -> None:
        self._watermarks: dict[str, int] = {name: BEGINNING_OF_TIME for name in inputs}
        if not self._watermarks:
            raise ValueError("a coalescer needs at least one input")
        self._idle: set[str] = set()
        self._coalesced = coalesced

    @property
    def coalesced(self) -> int:
        return self._coalesced

    def input_watermark(self, name: str) -> int:
        """One input's own watermark, for computations that track inputs separately (joins)."""
        return self._watermarks[name]

    def inputs(self) -> dict[str, int]:
        return dict(self._watermarks)

    def is_idle(self, name: str) -> bool:
        return name in self._idle

    def observe(self, name: str, watermark: int) -> int:
        """Record that input `name` published `watermark`; returns the coalesced watermark."""
        previous = self._watermarks[name]
        if watermark < previous:
            raise WatermarkRegressionError(
                f"input {name!r} published watermark {watermark} after {previous}: watermarks never go back"
            )
        self._watermarks[name] = watermark
        self._idle.discard(name)
        return self._recompute()

    def mark_idle(self, name: str) -> int:
        """Exclude input `name` until it publishes again; returns the coalesced watermark."""
        if name not in self._watermarks:
            raise KeyError(name)
        self._idle.add(name)
        return self._recompute()

    def _recompute(self) -> int:
        active = [wm for name, wm in self._watermarks.items() if name not in self._idle]
        if active:
            self._coalesced = max(self._coalesced, min(active))
        return self._coalesced


def output_watermark(coalesced_input: int, earliest_pending_timer: int | None) -> int:
    """MillWheel's low watermark of a computation after a step in which all input was processed."""
    if earliest_pending_timer is None:
        return coalesced_input
    return min(coalesced_input, earliest_pending_timer)
