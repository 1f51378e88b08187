"""Low-watermark arithmetic shared by the test harness and the Spark runner: every watermark rule of
millstream lives in this module.

Terms
- *sender*: one input of a computation: a computation's stream log, or one injector partition.
- *sender watermark*: the low watermark a sender has published; it never goes back.
- *idle sender*: one that has declared it has nothing pending and nothing arriving (Hazelcast's idle
  message): an injector partition that found nothing new for its idle timeout, or a computation all of
  whose senders are idle. It is excluded from the minimum until it publishes again.
- *input watermark of a stream*: the minimum over that stream's non-idle senders; what
  `ctx.input_watermark(stream)` shows, so a join can follow each side separately (seed 001).
- *coalesced (input) watermark*: the minimum over the non-idle senders. It never goes back either: if
  an idle sender wakes up behind it, the coalesced value holds and that sender's older records are late.
- *input point* (`Segment`): one advance of one sender within a step: its records, the coalesced
  watermark before them (what they are judged late against) and after them (what timers then fire by).
  A step's input points follow a fixed order (sender by name, then position), so a step's outcome does
  not depend on how a runner batches: Spark merging three upstream publications into one micro-batch
  runs exactly the input points the harness runs one step at a time.
- *keyed watermark* (seed 001): a stream may carry watermarks besides its low watermark, each named by
  a *watermark key* (say "shipped_at" for a second time column of its records). Each key is coalesced
  on its own, exactly as the low watermark is, over the senders that carry it: a sender that does not
  carry a key says nothing about it and does not hold it. Idleness is the sender's, not the key's: an
  idle sender is left out of every key's minimum (seed 001: "the key in idle messages is ignored").
- *output watermark* of a computation (MillWheel's low watermark of A): min(input watermark, oldest
  pending work of A). A computation publishes after an input point only once every record of it is
  processed and every timer it made due has fired, so its oldest pending work is never older than its
  input watermark there: the output watermark after input point j is the input watermark after it,
  unless a hold keeps it back.
- *hold*: a pending timer may hold the output watermark at a time (`ctx.set_timer(..., hold=t)`, as
  Beam's timer output timestamps): it is pending work stamped t, for records that user code keeps in
  state and produces when the timer fires (Photon's dispatcher retrying a click's join). Until the
  timer fires or is deleted or set again without it, the output watermark does not pass t, so what the
  firing produces at t or after is on time downstream. The *hold after point j* is the earliest hold
  of any key of the computation once point j is processed (`earliest_holds` folds keys and key groups).
  The output watermark never goes back: a hold behind what was already published keeps it where it is.

Coalescing rules (as Hazelcast's WatermarkCoalescer):
1. A sender's watermark is monotonic; publishing a lower value is a bug in that sender and raises.
2. A sender that has published nothing yet holds the minimum at BEGINNING_OF_TIME.
3. An idle sender is left out of the minimum until it publishes again (a watermark or records).
4. If every sender is idle the computation is idle too, and says so downstream (seed 001 forwards the
   idle message), unless a timer holds its watermark (a hold is pending work: downstream must wait for
   it, not leave the computation out); its watermark holds where it is rather than jumping ahead.
   Jumping ahead would turn whatever arrives when an input wakes up into late data; holding keeps it
   on time here, and downstream, where the idle computation is left out, the active senders move the
   watermark. Event-time timers without a hold (a window still open) do not keep a computation from
   being idle: what they produce once an input wakes up is judged downstream against the watermark
   its other senders moved on, and may be late there, as a woken injector partition's records may.
   A timer set with `hold=` is what keeps such output on time: downstream then waits for it.

Worked example (the Hazelcast design's, senders 0 and 1):

>>> c = WatermarkCoalescer(["0", "1"])
>>> c.observe("0", 10), c.observe("1", 12), c.observe("0", 11), c.observe("1", 13), c.observe("0", 14)
(-140737488355328, 10, 11, 11, 13)
>>> c.mark_idle("1"), c.observe("0", 20)
(14, 20)

Keyed: sender "a" carries watermark key "ship", "b" does not, so "ship" is a's alone; the low
watermark is still the minimum of both.

>>> c = WatermarkCoalescer(["a", "b"], keyed={"ship": ["a"]})
>>> point = c.advance("a", 50, keyed={"ship": 30})
>>> point.advanced_to, point.keyed
(-140737488355328, (('ship', -140737488355328, 30),))
>>> c.advance("b", 40).advanced_to, c.keyed_watermark("ship")
(40, 30)
"""

from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple, Sequence

from millstream.model.pipeline import UNHELD_WATERMARK_KEY
from millstream.model.records import BEGINNING_OF_TIME


class WatermarkRegressionError(RuntimeError):
    """A sender published a watermark lower than one it published before."""


class Segment(NamedTuple):
    """One input point of a step (see the module doc)."""

    low_watermark: int  # coalesced input watermark before the point: its records are judged by it
    advanced_to: int  # coalesced input watermark after it: due timers fire by it
    # Per input stream: (stream, its watermark before the point, after it), for ctx.input_watermark.
    inputs: tuple[tuple[str, int, int], ...] = ()
    idle: bool = False  # every sender is idle after the point: the computation is idle
    # Per watermark key: (key, its coalesced watermark before the point, after it).
    keyed: tuple[tuple[str, int, int], ...] = ()

    def keyed_after(self) -> dict[str, int]:
        """Each watermark key's coalesced watermark after the point."""
        return {key: after for key, _, after in self.keyed}


class WatermarkCoalescer:
    """Coalesces senders' watermarks; `groups` names the input streams (stream -> its senders).

    >>> c = WatermarkCoalescer(["a/x", "b/y"], groups={"a": ["a/x"], "b": ["b/y"]})
    >>> c.advance("a/x", 50)
    Segment(low_watermark=-140737488355328, advanced_to=-140737488355328, inputs=(('a', -140737488355328, 50), ('b', -140737488355328, -140737488355328)), idle=False, keyed=())
    >>> c.advance("b/y", 20, idle=True).advanced_to  # b goes quiet: a alone holds the minimum
    50
    """

    def __init__(self, inputs: Iterable[str], coalesced: int = BEGINNING_OF_TIME,
                 groups: dict[str, list[str]] | None = None, keyed: dict[str, list[str]] | None = None) -> None:
        """`groups`: input stream -> its senders; `keyed`: watermark key -> the senders carrying it."""
        self._watermarks: dict[str, int] = {name: BEGINNING_OF_TIME for name in inputs}
        if not self._watermarks:
            raise ValueError("a coalescer needs at least one input")
        self._idle: set[str] = set()
        self._coalesced = coalesced
        self._groups = {name: list(members) for name, members in sorted((groups or {}).items())}
        self._group_marks = {name: BEGINNING_OF_TIME for name in self._groups}
        # One coalescer per watermark key, over the senders that carry it (seed 001: "as if it was two
        # separate streams").
        self._keyed = {key: WatermarkCoalescer(carriers) for key, carriers in sorted((keyed or {}).items())}

    @classmethod
    def restore(cls, watermarks: dict[str, int], coalesced: int, idle: Iterable[str] = (),
                groups: dict[str, list[str]] | None = None,
                group_marks: dict[str, int] | None = None, keyed: dict[str, list[str]] | None = None,
                keyed_marks: dict[str, dict[str, int]] | None = None,
                keyed_coalesced: dict[str, int] | None = None) -> "WatermarkCoalescer":
        """A coalescer as `inputs()`, `coalesced`, `idle()`, `group_marks()`, `keyed_inputs()` and
        `keyed_watermarks()` described it."""
        coalescer = cls(watermarks, coalesced, groups, keyed)
        coalescer._watermarks.update(watermarks)
        coalescer._idle.update(idle)
        coalescer._group_marks.update(group_marks or {})
        for key, sub in coalescer._keyed.items():
            sub._watermarks.update((keyed_marks or {}).get(key, {}))
            sub._idle.update(name for name in idle if sub.has_input(name))
            sub._coalesced = (keyed_coalesced or {}).get(key, BEGINNING_OF_TIME)
        return coalescer

    def keyed_watermark(self, key: str) -> int:
        """The coalesced watermark of one watermark key."""
        return self._keyed[key].coalesced

    def keyed_watermarks(self) -> dict[str, int]:
        return {key: sub.coalesced for key, sub in self._keyed.items()}

    def keyed_inputs(self) -> dict[str, dict[str, int]]:
        """Per watermark key, each carrying sender's own watermark."""
        return {key: sub.inputs() for key, sub in self._keyed.items()}

    def sender_keyed(self, name: str) -> dict[str, int]:
        """The keyed watermarks sender `name` has published."""
        return {key: sub.input_watermark(name) for key, sub in self._keyed.items() if sub.has_input(name)}

    @property
    def all_idle(self) -> bool:
        return len(self._idle) == len(self._watermarks)

    def group_marks(self) -> dict[str, int]:
        return dict(self._group_marks)

    @property
    def coalesced(self) -> int:
        return self._coalesced

    def input_watermark(self, name: str) -> int:
        """One sender's own watermark, for computations that track inputs separately (joins)."""
        return self._watermarks[name]

    def has_input(self, name: str) -> bool:
        return name in self._watermarks

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

    def advance(self, name: str, watermark: int, idle: bool = False,
                keyed: dict[str, int] | None = None) -> Segment:
        """The input point of sender `name` publishing `watermark` after records (and declaring
        itself idle, with `idle`; and its keyed watermarks, with `keyed`, where it carries them): the
        coalesced watermark before and after, per input stream and per watermark key too."""
        before = self._coalesced
        groups_before = dict(self._group_marks)
        if watermark > self._watermarks[name]:
            self._watermarks[name] = watermark
        after = self.mark_idle(name) if idle else self.observe(name, watermark)
        inputs = tuple((group, groups_before[group], self._group_marks[group]) for group in self._groups)
        keyed_points = []
        for key, sub in self._keyed.items():
            if sub.has_input(name):
                mark = max(sub.input_watermark(name), (keyed or {}).get(key, BEGINNING_OF_TIME))
                point = sub.advance(name, mark, idle)
            else:
                point = sub.hold()
            keyed_points.append((key, point.low_watermark, point.advanced_to))
        return Segment(before, after, inputs, self.all_idle, tuple(keyed_points))

    def hold(self) -> Segment:
        """A point where nothing moved (a heartbeat)."""
        now = self._coalesced
        return Segment(now, now, tuple((g, m, m) for g, m in self._group_marks.items()), self.all_idle,
                       tuple((key, sub.coalesced, sub.coalesced) for key, sub in self._keyed.items()))

    def mark_idle(self, name: str) -> int:
        """Exclude sender `name` until it publishes again; returns the coalesced watermark."""
        if name not in self._watermarks:
            raise KeyError(name)
        self._idle.add(name)
        for sub in self._keyed.values():
            if sub.has_input(name):
                sub.mark_idle(name)
        return self._recompute()

    def _recompute(self) -> int:
        active = [wm for name, wm in self._watermarks.items() if name not in self._idle]
        if active:
            self._coalesced = max(self._coalesced, min(active))
        for group, members in self._groups.items():
            marks = [self._watermarks[m] for m in members if m not in self._idle]
            if marks:
                self._group_marks[group] = max(self._group_marks[group], min(marks))
        return self._coalesced


def skew_watermark(low_watermark: int, keyed_watermarks: Mapping[str, int], published: bool = False) -> int | None:
    """What the skew limit (too_far_ahead) compares with for a computation downstream of an
    injector: its *unheld* watermark, the keyed watermark UNHELD_WATERMARK_KEY that every injector
    carries as its own low watermark while a skew limit is set, and that computations forward as
    every keyed watermark, never held. It is the low watermark the computation would publish if no
    timer held: how far it has processed its input. Compared with the published (held) watermark,
    a hold further behind than the limit would stop the very input its timer waits for, and the
    pipeline would stall.

    Never below the low watermark: a computation whose inputs do not all carry the key yet (a root
    that ran before it, part way through its first batches) publishes it at the beginning of time.
    None (not counted) for a computation that has `published` but not the key: a root that ran
    before it, or without a skew limit, whose stages behind would otherwise be judged by watermarks
    a hold may keep, and never run again to publish the key. Nothing published yet: its low watermark
    (the beginning of time, which the limit reads as where the injector started).

    >>> skew_watermark(1_000, {"~unheld": 9_000}), skew_watermark(1_000, {"~unheld": -(2**47)})
    (9000, 1000)
    >>> skew_watermark(1_000, {}, published=True) is None, skew_watermark(-(2**47), {})
    (True, -140737488355328)
    """
    unheld = keyed_watermarks.get(UNHELD_WATERMARK_KEY)
    if unheld is None:
        return None if published else low_watermark
    return max(low_watermark, unheld)


def declared_keyed(keyed_watermarks: Mapping[str, int]) -> dict[str, int]:
    """The keyed watermarks users declared, for display: the unheld one (skew_watermark) left out.

    >>> declared_keyed({"ship": 5, "~unheld": 9})
    {'ship': 5}
    """
    return {key: mark for key, mark in keyed_watermarks.items() if key != UNHELD_WATERMARK_KEY}


def too_far_ahead(injector_watermark: int, downstream_watermarks: Iterable[int | None], max_skew_ms: int | None,
                  started_at: int = BEGINNING_OF_TIME) -> bool:
    """The skew limit: an injector stops reading while a computation downstream of it is more than
    `max_skew_ms` behind the injector's watermark, by its skew_watermark (None: not counted). A
    computation that has published nothing yet (or only the beginning of time) counts as being where
    the injector started, `started_at` (on Spark its watermark when the root first started, kept
    across restarts; the harness's injectors start at the beginning of time): so while the stages
    behind are starting, the injector reads at most up to the limit and one read past it, not as far
    as it likes.

    >>> too_far_ahead(10_000, [9_500, 2_000], max_skew_ms=5_000)
    True
    >>> too_far_ahead(10_000, [9_500], max_skew_ms=5_000), too_far_ahead(10_000, [], max_skew_ms=5_000)
    (False, False)

    Nothing published downstream yet, the injector started at 0: it may read until it passes 5 s.

    >>> too_far_ahead(3_000, [BEGINNING_OF_TIME], 5_000, started_at=0)
    False
    >>> too_far_ahead(6_000, [BEGINNING_OF_TIME], 5_000, started_at=0)
    True
    """
    if max_skew_ms is None:
        return False
    behind = [w if w > BEGINNING_OF_TIME else started_at for w in downstream_watermarks if w is not None]
    return bool(behind) and injector_watermark - min(behind) > max_skew_ms


def published_keyed(keys: Iterable[str], published: Mapping[str, int], known: Mapping[str, int],
                    low_watermark: int = BEGINNING_OF_TIME) -> dict[str, int]:
    """An injector partition's keyed watermarks after a read: for each key it carries, what it
    publishes now, never below what it published before (a key it leaves out stays where it was).
    The unheld watermark (skew_watermark), where it carries it, is its own `low_watermark`.

    >>> published_keyed(["ship", "pay"], {"ship": 5, "pay": 1}, {"ship": 9})
    {'ship': 9, 'pay': 1}
    >>> published_keyed(["ship", "~unheld"], {"ship": 5}, {}, low_watermark=7)
    {'ship': 5, '~unheld': 7}
    """
    if UNHELD_WATERMARK_KEY in keys:
        published = {**published, UNHELD_WATERMARK_KEY: low_watermark}
    return {key: max(known.get(key, BEGINNING_OF_TIME), published.get(key, BEGINNING_OF_TIME)) for key in keys}


def output_keyed_watermarks(previous_output: dict[str, int], segments: Sequence[Segment]) -> list[dict[str, int]]:
    """The same rule per watermark key: each key's input watermark after each point, never below
    what was published before. (A timer on a keyed watermark that a point made due fires before the
    point is published, so the key's oldest pending work is not older.)

    >>> output_keyed_watermarks({"ship": 9}, [Segment(0, 0, keyed=(("ship", 5, 7),)),
    ...                                        Segment(0, 0, keyed=(("ship", 7, 12),))])
    [{'ship': 9}, {'ship': 12}]
    """
    published = []
    current = dict(previous_output)
    for segment in segments:
        for key, _, after in segment.keyed:
            current[key] = max(current.get(key, BEGINNING_OF_TIME), after)
        published.append(dict(current))
    return published


def output_watermarks(previous_output: int, segments: Sequence[Segment],
                      holds: Sequence[int | None] | None = None) -> list[int]:
    """The computation's output watermark after each input point of a step (see the module doc):
    the input watermark there, or the hold after it if earlier, never below what it published before.

    >>> output_watermarks(5, [Segment(5, 7), Segment(7, 7), Segment(7, 20)])
    [7, 7, 20]

    A timer holds at 12 from the second point until the third releases it; a hold at 3, behind what
    was published, keeps the watermark where it is:

    >>> output_watermarks(5, [Segment(5, 10), Segment(10, 15), Segment(15, 20)], [None, 12, None])
    [10, 12, 20]
    >>> output_watermarks(5, [Segment(5, 10)], [3])
    [5]
    """
    published = []
    current = previous_output
    for j, segment in enumerate(segments):
        allowed = segment.advanced_to
        if holds is not None:
            hold = holds[j]
            if hold is not None and hold < allowed:
                allowed = hold
        current = max(current, allowed)
        published.append(current)
    return published


def published_idle(segments: Sequence[Segment], holds: Sequence[int | None] | None = None) -> list[bool]:
    """Whether the computation says it is idle after each input point (rule 4): every sender idle,
    and nothing held there.

    >>> published_idle([Segment(5, 5, idle=True), Segment(5, 5, idle=True)], [9, None])
    [False, True]
    """
    return [segment.idle and (holds is None or holds[j] is None) for j, segment in enumerate(segments)]


def weak_hold_refused(computation: str) -> str:
    """Why a computation with weak productions cannot hold its watermark (both runners refuse it so):
    on Spark it is fused into its consumer's query, whose input points carry the weak computation's
    input watermarks unchanged, so a hold would not reach the consumer."""
    return (f"computation {computation!r} holds its output watermark (a timer set with hold=), but its "
            "productions are weak: fused into its consumer's query on Spark, which holds nothing back; give it "
            "strong productions (the default) to use holds")


def earliest_holds(holds: list[int | None] | None, more: Sequence[int | None] | None) -> list[int | None] | None:
    """Per input point, the earlier of two holds (None: no hold there; None for the whole: no hold
    at any point): how the executor folds its keys' holds and a runner its key groups'.

    >>> earliest_holds([None, 12, None], [15, 15, None])
    [15, 12, None]
    >>> earliest_holds(None, [7]), earliest_holds([7], None)
    ([7], [7])
    """
    if more is None:
        return holds
    if holds is None:
        return list(more)
    return [b if a is None else a if b is None or a <= b else b for a, b in zip(holds, more, strict=True)]
