"""A root's layout (`pipeline.json`, rootfiles.py): what a resumed run must keep.

State is partitioned by key group, so the key group count is fixed for the life of a root; the key
groups' labels (partitioning.py) are chosen at the first start and kept, or Spark would not find
their state; a fused (weak) pair shares one checkpoint, so a computation cannot switch between weak
and strong productions. Computations may come and go: pipelines change while they run.

>>> layout = RootLayout("clicks", 8, {"count": None, "parse": "count"}, None, "/data/clicks")
>>> layout.weak, layout.strong
(('parse',), ('count',))
>>> layout.refusals({**layout.record(), "key_groups": 16})
['it has 16 key groups, this run asks for 8']
>>> layout.refusals({**layout.record(), "location": "/data/old-clicks"})[0][:52]
'it was made at /data/old-clicks and its logs hold pa'
>>> RootLayout.from_record(layout.record()) == layout
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from millstream.spark.partitioning import GroupLabels
from millstream.spark.rootfiles import LAYOUT_FILE
from millstream.spark.storage import Storage

# Version of the state and log layout under a root; a root written by another version is refused.
LAYOUT_FORMAT = 3


@dataclass(frozen=True)
class RootLayout:
    pipeline: str
    key_groups: int
    fused_into: Mapping[str, str | None]  # every computation: the consumer it is fused into (weak), or None
    group_labels: GroupLabels | None  # None until the root's first start chooses them
    # Where the root was made: its logs and claims hold paths under it (stream files, checkpoints),
    # so a copy or a move of it cannot run (None: a root made before the location was kept).
    location: str | None = None

    @property
    def computations(self) -> tuple[str, ...]:
        return tuple(sorted(self.fused_into))

    @property
    def weak(self) -> tuple[str, ...]:
        return tuple(name for name in self.computations if self.fused_into[name] is not None)

    @property
    def strong(self) -> tuple[str, ...]:
        return tuple(name for name in self.computations if self.fused_into[name] is None)

    def record(self) -> dict[str, Any]:
        return {"format": LAYOUT_FORMAT, "pipeline": self.pipeline, "key_groups": self.key_groups,
                "computations": list(self.computations), "weak": list(self.weak),
                "fused_into": {name: self.fused_into[name] for name in self.computations},
                "group_labels": list(self.group_labels.labels) if self.group_labels is not None else None,
                "location": self.location}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "RootLayout":
        """A stored layout of this format. A root written before labels existed keeps Spark's state
        under each key group's index."""
        labels = record.get("group_labels", list(range(record["key_groups"])))
        return cls(record["pipeline"], record["key_groups"], dict(record["fused_into"]),
                   GroupLabels(tuple(labels)) if labels is not None else None, record.get("location"))

    def refusals(self, stored: Mapping[str, Any]) -> list[str]:
        """Why this layout cannot run on a root whose stored layout is `stored` (none: it can)."""
        if stored.get("format") != LAYOUT_FORMAT or stored.get("pipeline") != self.pipeline:
            return [f"it holds {stored.get('pipeline')!r} in layout format {stored.get('format')}"]
        made_at = stored.get("location")
        if made_at is not None and self.location is not None and made_at != self.location:
            return [f"it was made at {made_at} and its logs hold paths there (stream files, checkpoints): a root "
                    "cannot be copied or moved, its copy would write into the original's checkpoints"]
        if stored["key_groups"] != self.key_groups:
            return [f"it has {stored['key_groups']} key groups, this run asks for {self.key_groups}"]
        return [f"computation {name!r} changed between weak and strong productions"
                for name, fused_into in self.fused_into.items()
                if stored["fused_into"].get(name, fused_into) != fused_into]


def read_layout(storage: Storage) -> RootLayout | None:
    """The layout stored in a root of this format (None: no layout, or one of another format)."""
    stored = storage.read_json(LAYOUT_FILE)
    if not isinstance(stored, dict) or stored.get("format") != LAYOUT_FORMAT:
        return None
    return RootLayout.from_record(stored)
