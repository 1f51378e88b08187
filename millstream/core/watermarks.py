"""Low-watermark arithmetic shared by the test harness and the Spark runner: every watermark rule of
millstream lives in this module.

Terms
- *sender*: one input of a computation: a computation's stream log, or one injector partition.
- *sender watermark*: the low watermark a sender has published; it never goes back.
- *idle sender*: one that has declared it has nothing pending and nothing arriving (Hazelcast's idle
  message). It is excluded from the minimum until it publishes again.
- *coalesced (input) watermark*: the minimum over the non-idle senders. It never goes back either: if
  an idle sender wakes up behind it, the coalesced value holds and that sender's older records are late.
- *input point* (`Segment`): one advance of one sender within a step: its records, the coalesced
  watermark before them (what they are judged late against) and after them (what timers then fire by).
  A step's input points follow a fixed order (sender by name, then position), so a step's outcome does
  not depend on how a runner batches: Spark merging three upstream publications into one micro-batch
  runs exactly the input points the harness runs one step at a time.
- *output watermark* of a computation (MillWheel's low watermark of A): min(input watermark, oldest
  pending work of A). A computation publishes after an input point only once every record of it is
  processed and every timer it made due has fired, so its oldest pending work is never older than its
  input watermark there: the output watermark after input point j is the input watermark after it.

Coalescing rules (as Hazelcast's WatermarkCoalescer):
1. A sender's watermark is monotonic; publishing a lower value is a bug in that sender and raises.
2. A sender that has published nothing yet holds the minimum at BEGINNING_OF_TIME.
3. If every sender is idle the coalesced watermark holds where it is (it does not jump ahead).

Worked example (the Hazelcast design's, senders 0 and 1):

>>> c = WatermarkCoalescer(["0", "1"])
>>> c.observe("0", 10), c.observe("1", 12), c.observe("0", 11), c.observe("1", 13), c.observe("0", 14)
(-140737488355328, 10, 11, 11, 13)
>>> c.mark_idle("1"), c.observe("0", 20)
(14, 20)
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

from millstream.model.records import BEGINNING_OF_TIME


class WatermarkRegressionError(RuntimeError):
    """A sender published a watermark lower than one it published before."""


class Segment(NamedTuple):
    """One input point of a step (see the module doc)."""

    low_watermark: int  # coalesced input watermark before the point: its records are judged by it
    advanced_to: int  # coalesced input watermark after it: due timers fire by it


class WatermarkCoalescer:
    def __init__(self, inputs: Iterable[str], coalesced: int = BEGINNING_OF_TIME) -> None:
        self._watermarks: dict[str, int] = {name: BEGINNING_OF_TIME for name in inputs}
        if not self._watermarks:
            raise ValueError("a coalescer needs at least one input")
        self._idle: set[str] = set()
        self._coalesced = coalesced

    @classmethod
    def restore(cls, watermarks: dict[str, int], coalesced: int, idle: Iterable[str] = ()) -> "WatermarkCoalescer":
        coalescer = cls(watermarks, coalesced)
        coalescer._watermarks.update(watermarks)
        coalescer._idle.update(idle)
        return coalescer

    @property
    def coalesced(self) -> int:
        return self._coalesced

    def input_watermark(self, name: str) -> int:
        """One sender's own watermark, for computations that track inputs separately (joins)."""
        return self._watermarks[name]

    def inputs(self) -> dict[str, int]:
        return dict(self._watermarks)

    def idle(self) -> list[str]:
        return sorted(self._idle)

    def is_idle(self, name: str) -> bool:
        return name in self._idle

    def observe(self, name: str, watermark: int) -> int:
        """Record that sender `name` published `watermark`; returns the coalesced watermark."""
        previous = self._watermarks[name]
        if watermark < previous:
            raise WatermarkRegressionError(
                f"input {name!r} published watermark {watermark} after {previous}: watermarks never go back"
            )
        self._watermarks[name] = watermark
        self._idle.discard(name)
        return self._recompute()

    def advance(self, name: str, watermark: int) -> Segment:
        """The input point of sender `name` publishing `watermark` after records: the coalesced
        watermark before and after."""
        before = self._coalesced
        return Segment(before, self.observe(name, watermark))

    def mark_idle(self, name: str) -> int:
        """Exclude sender `name` until it publishes again; returns the coalesced watermark."""
        if name not in self._watermarks:
            raise KeyError(name)
        self._idle.add(name)
        return self._recompute()

    def _recompute(self) -> int:
        active = [wm for name, wm in self._watermarks.items() if name not in self._idle]
        if active:
            self._coalesced = max(self._coalesced, min(active))
        return self._coalesced


def output_watermarks(previous_output: int, segments: Sequence[Segment]) -> list[int]:
    """The computation's output watermark after each input point of a step (see the module doc):
    the input watermark there, never below what it published before.

    >>> output_watermarks(5, [Segment(5, 7), Segment(7, 7), Segment(7, 20)])
    [7, 7, 20]
    """
    published = []
    current = previous_output
    for segment in segments:
        current = max(current, segment.advanced_to)
        published.append(current)
    return published
