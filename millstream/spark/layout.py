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
>>> replace(layout, identity="7f3a").keeping(layout.record()).identity is None  # kept as the root has it
True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from millstream.model.state import ListState, MapState, StateSpec
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
    # Per computation, each state's declaration as it is stored (kind and codecs, `stored_form`), and
    # each injector's kind: what the stored state and offsets can be read by. A run may add states
    # and injectors and drop them, not read them another way.
    states: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    injectors: Mapping[str, str] = field(default_factory=dict)
    # Computations that ran on the root before and this run leaves out: the consumer each is fused
    # into (None: strong), i.e. whose checkpoint holds its state, checked when a run brings it back.
    earlier_fusions: Mapping[str, str | None] = field(default_factory=dict)
    # The root's own name, random, made with it: what a file sink's delivered files are named by,
    # so a root made again in the same place (deleted, or `millstream run --fresh`) never takes
    # another's names in a sink directory both write to (None: a root made before it was kept,
    # which keeps the names it delivered under).
    identity: str | None = None

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
                "location": self.location, "states": {name: dict(states) for name, states in self.states.items()},
                "injectors": dict(self.injectors), "earlier_fusions": dict(self.earlier_fusions),
                "identity": self.identity}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "RootLayout":
        """A stored layout of this format. A root written before labels existed keeps Spark's state
        under each key group's index."""
        labels = record.get("group_labels", list(range(record["key_groups"])))
        return cls(record["pipeline"], record["key_groups"], dict(record["fused_into"]),
                   GroupLabels(tuple(labels)) if labels is not None else None, record.get("location"),
                   record.get("states", {}), record.get("injectors", {}), record.get("earlier_fusions", {}),
                   record.get("identity"))

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
        known = {**stored.get("earlier_fusions", {}), **stored["fused_into"]}
        problems = [_fusion_changed(name, known[name], fused_into)
                    for name, fused_into in sorted(self.fused_into.items())
                    if name in known and known[name] != fused_into]
        for computation, states in sorted(self.states.items()):
            was = stored.get("states", {}).get(computation, {})
            problems += [f"computation {computation!r} stores state {name!r} as {was[name]}, this run declares it "
                         f"{form}: its stored values would not read back (keep the declaration, or give the state "
                         "a new name and move the values over in code)"
                         for name, form in sorted(states.items()) if was.get(name, form) != form]
        was_injectors = stored.get("injectors", {})
        problems += [f"injector {name!r} is a {was_injectors[name]} on this root, this run makes it a {kind}: its "
                     "offsets are the other kind's (give the new injector a new name)"
                     for name, kind in sorted(self.injectors.items()) if was_injectors.get(name, kind) != kind]
        return problems

    def keeping(self, stored: Mapping[str, Any]) -> "RootLayout":
        """This layout, with the declarations `stored` holds of computations and injectors this run
        leaves out: they are checked again when a later run brings them back."""
        states = {**stored.get("states", {}), **self.states}
        injectors = {**stored.get("injectors", {}), **self.injectors}
        known = {**stored.get("earlier_fusions", {}), **stored.get("fused_into", {})}
        earlier = {name: fused for name, fused in known.items() if name not in self.fused_into}
        return replace(self, states=states, injectors=injectors, earlier_fusions=earlier,
                       identity=stored.get("identity", self.identity))


def _fusion_changed(name: str, was: str | None, now: str | None) -> str:
    """Why a computation cannot run fused into `now` (None: strong) where its state is `was`'s."""
    if was is None:
        return (f"computation {name!r} ran with strong productions on this root (its state is in its own "
                f"checkpoint); this run makes it weak, fused into {now!r}: keep it strong, or give it a new name")
    if now is None:
        return (f"computation {name!r} ran with weak productions fused into {was!r} on this root (its state is in "
                "that query's checkpoint); this run makes it strong: keep it weak, or give it a new name")
    return (f"computation {name!r} is fused into {was!r} on this root (weak productions: its state is in that "
            f"query's checkpoint); this run fuses it into {now!r}: keep its consumer, or give it a new name")


def _codec_name(codec: Any) -> str:
    kind = codec if isinstance(codec, type) else type(codec)  # a class of static methods is a codec too
    return f"{kind.__module__}.{kind.__qualname__}"


def stored_form(spec: StateSpec) -> str:
    """How a state's values are stored: its kind and codecs (not its TTL, which may change).

    >>> stored_form(MapState("m"))
    'MapState(key=millstream.model.codecs.JsonCodec, value=millstream.model.codecs.JsonCodec)'
    """
    if isinstance(spec, MapState):
        return f"MapState(key={_codec_name(spec.key_codec)}, value={_codec_name(spec.value_codec)})"
    kind = "ListState" if isinstance(spec, ListState) else "ValueState"
    return f"{kind}({_codec_name(spec.codec)})"


def read_layout(storage: Storage) -> RootLayout | None:
    """The layout stored in a root of this format (None: no layout, or one of another format)."""
    stored = storage.read_json(LAYOUT_FILE)
    if not isinstance(stored, dict) or stored.get("format") != LAYOUT_FORMAT:
        return None
    return RootLayout.from_record(stored)
