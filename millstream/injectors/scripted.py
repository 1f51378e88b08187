"""An injector that replays a fixed script of steps: for tests and conformance runs.

Each step is a list of records and the low watermark the injector publishes once the step is read
(and, optionally, its keyed watermarks then).
One step is released per read (the Spark runner's micro-batch, the harness's step), so both runners
see the same sequence of injections and watermark advances.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from millstream.model.injector import Injector, Malformed, Offset
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, derive_record_id


@dataclass(frozen=True)
class Step:
    records: tuple[Record[Any] | Malformed, ...]
    watermark: int
    keyed: Mapping[str, int] = field(default_factory=dict)


class ScriptedInjector(Injector):
    """Replays `steps`, one per read.

    >>> inj = ScriptedInjector("s", [([Record("k", 1, 5)], 10), ([], 20)])
    >>> first = inj.latest_offset("0", inj.initial_offset("0"), None)
    >>> [r.value for r in inj.read("0", inj.initial_offset("0"), first)], inj.low_watermark("0", first)
    ([1], 10)

    A step may add its keyed watermarks, for the keys named in `watermark_keys`:

    >>> inj = ScriptedInjector("s", [([], 10, {"ship": 4})], watermark_keys=("ship",))
    >>> inj.keyed_watermarks("0", inj.latest_offset("0", inj.initial_offset("0"), None))
    {'ship': 140737488355327}
    """

    def __init__(self, name: str, steps: Sequence[tuple[Any, ...]], finish: bool = True,
                 watermark_keys: Sequence[str] = ()) -> None:
        """`steps`: (records, watermark after the step) or (records, watermark, keyed watermarks
        after the step). With `finish`, every watermark becomes END_OF_TIME after the last step, so
        every pending timer fires."""
        self.name = name
        self.derives_ids = False  # any record of the steps without an id of its own
        self.watermark_keys = tuple(watermark_keys)
        previous = BEGINNING_OF_TIME
        keyed_previous = {key: BEGINNING_OF_TIME for key in self.watermark_keys}
        self.steps: list[Step] = []
        for number, (records, watermark, *rest) in enumerate(steps):
            if watermark < previous:
                raise ValueError(f"step {number}: watermark {watermark} goes back from {previous}")
            previous = watermark
            keyed = dict(rest[0]) if rest else {}
            for key, mark in keyed.items():
                if key not in keyed_previous:
                    raise ValueError(f"step {number}: watermark key {key!r} is not in watermark_keys")
                if mark < keyed_previous[key]:
                    raise ValueError(f"step {number}: keyed watermark {key!r} {mark} goes back from "
                                     f"{keyed_previous[key]}")
            keyed_previous.update(keyed)
            self.derives_ids = self.derives_ids or any(not isinstance(r, Malformed) and not r.id for r in records)
            self.steps.append(Step(tuple(
                r if isinstance(r, Malformed) or r.id else r.with_id(derive_record_id(name, f"step{number}", i))
                for i, r in enumerate(records)
            ), watermark, dict(keyed_previous)))
        self.finish = finish

    def id_namespace(self) -> tuple[str, str] | None:
        # Ids derive_record_id(name, "step<n>", i) for the steps' records given without one.
        return ("steps", self.name) if self.derives_ids else None

    def initial_offset(self, partition: str) -> Offset:
        return {"step": 0}

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        return {"step": min(start["step"] + 1, len(self.steps))}

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any] | Malformed]:
        for step in self.steps[start["step"]:end["step"]]:
            yield from step.records

    def low_watermark(self, partition: str, offset: Offset) -> int:
        done = offset["step"]
        if done >= len(self.steps) and self.finish:
            return END_OF_TIME
        return self.steps[done - 1].watermark if done else BEGINNING_OF_TIME

    def keyed_watermarks(self, partition: str, offset: Offset) -> Mapping[str, int]:
        done = offset["step"]
        if done >= len(self.steps) and self.finish:
            return {key: END_OF_TIME for key in self.watermark_keys}
        return dict(self.steps[done - 1].keyed) if done else {key: BEGINNING_OF_TIME for key in self.watermark_keys}
