"""Scoring detected anomalies against the generator's ground truth.

Matching: a detection matches a true anomaly of the same query and kind when their intervals overlap,
each widened by `tolerance_ms` (default 5 s) on both sides. A detector reports an episode as "open"
when it first becomes sure and "closed" with its final extent; an episode counts once (its closed
record if there is one).

- precision = detections matching some true anomaly / detections
- recall = true anomalies matched by some detection / true anomalies

Guarantee (docs/zeitgeist.md): recall is 100% for every *required* anomaly: spikes with a multiplier
of at least SPIKE_REQUIRED_MAGNITUDE and dips losing at least DIP_REQUIRED_MAGNITUDE of the traffic,
whose expected normal traffic is high enough to be seen in the noise (baseline and rate floors, the
same the generator keeps when it places spikes and dips). Weaker anomalies are detected on a best
effort basis: a detection of one is a true positive, missing it is not a failure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from millstream.apps.zeitgeist.generator import OUTAGE_REGION, Anomaly, DelayedBurst

SPIKE_REQUIRED_MAGNITUDE = 4.0  # traffic multiplier
DIP_REQUIRED_MAGNITUDE = 0.9  # fraction of traffic lost
SPIKE_REQUIRED_BASELINE, SPIKE_REQUIRED_RATE = 40.0, 1.0  # expected events over the spike, events/s
DIP_REQUIRED_BASELINE, DIP_REQUIRED_RATE = 60.0, 2.0
TOLERANCE_MS = 5000


@dataclass(frozen=True)
class Detection:
    query: str
    kind: str
    start: int
    end: int
    magnitude: float
    score: float
    episode: int
    status: str
    early: bool
    detected_wm: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def detections_from_values(values: Iterable[dict[str, Any]]) -> list[Detection]:
    """Anomaly record values -> one Detection per (query, kind, episode), its closed record if any."""
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for value in values:
        key = (value["query"], value["kind"], int(value["episode"]))
        if key not in best or value["status"] == "closed":
            if key in best and best[key]["status"] == "closed":
                continue
            merged = dict(value)
            if key in best:  # keep when it was first known, and whether that was early
                merged["detected_wm"] = best[key]["detected_wm"]
                merged["early"] = best[key]["early"]
            best[key] = merged
    return sorted(
        (Detection(v["query"], v["kind"], int(v["start"]), int(v["end"]), float(v["magnitude"]), float(v["score"]),
                   int(v["episode"]), v["status"], bool(v.get("early", False)), int(v.get("detected_wm", 0)))
         for v in best.values()),
        key=lambda d: (d.start, d.query, d.kind),
    )


def required(anomaly: Anomaly) -> bool:
    """Must this anomaly be detected (recall 100%)?"""
    if anomaly.kind == "spike":
        return (anomaly.magnitude >= SPIKE_REQUIRED_MAGNITUDE and anomaly.baseline >= SPIKE_REQUIRED_BASELINE
                and anomaly.rate >= SPIKE_REQUIRED_RATE)
    return (anomaly.magnitude >= DIP_REQUIRED_MAGNITUDE and anomaly.baseline >= DIP_REQUIRED_BASELINE
            and anomaly.rate >= DIP_REQUIRED_RATE)


def overlaps(a_start: int, a_end: int, b_start: int, b_end: int, tolerance: int) -> bool:
    return a_start < b_end + tolerance and b_start < a_end + tolerance


@dataclass
class KindScore:
    detections: int = 0
    true_positives: int = 0
    truth: int = 0
    found: int = 0
    required: int = 0
    required_found: int = 0

    @property
    def precision(self) -> float:
        return self.true_positives / self.detections if self.detections else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.truth if self.truth else 1.0

    @property
    def required_recall(self) -> float:
        return self.required_found / self.required if self.required else 1.0

    def add(self, other: "KindScore") -> None:
        for name in ("detections", "true_positives", "truth", "found", "required", "required_found"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Evaluation:
    scores: dict[str, KindScore]  # "spike", "dip", "all"
    matched: list[tuple[Anomaly, list[Detection]]]
    missed_required: list[Anomaly]
    false_positives: list[Detection]
    outage_queries: list[str] = field(default_factory=list)  # queries the outage hit
    outage_detected: list[str] = field(default_factory=list)  # of those, with a dip during the outage
    outage_required: list[str] = field(default_factory=list)  # of those, required to be detected
    outage_unaffected_dips: list[Detection] = field(default_factory=list)  # unexplained dips elsewhere then
    burst_dips: list[Detection] = field(default_factory=list)  # unexplained dips on delayed-only data

    def to_json(self) -> dict[str, Any]:
        return {
            "scores": {k: {**asdict(v), "precision": v.precision, "recall": v.recall,
                           "required_recall": v.required_recall} for k, v in self.scores.items()},
            "missed_required": [a.to_json() for a in self.missed_required],
            "false_positives": [d.to_json() for d in self.false_positives],
            "outage_queries": self.outage_queries,
            "outage_detected": self.outage_detected,
            "outage_required": self.outage_required,
            "outage_unaffected_dips": [d.to_json() for d in self.outage_unaffected_dips],
            "burst_dips": [d.to_json() for d in self.burst_dips],
            "matched": [{"truth": a.to_json(), "detections": [d.to_json() for d in ds]} for a, ds in self.matched],
        }


def evaluate(truth: Sequence[Anomaly], detections: Sequence[Detection], bursts: Sequence[DelayedBurst] = (),
             tolerance_ms: int = TOLERANCE_MS) -> Evaluation:
    by_query: dict[tuple[str, str], list[Anomaly]] = {}
    for anomaly in truth:
        by_query.setdefault((anomaly.query, anomaly.kind), []).append(anomaly)
    scores = {kind: KindScore() for kind in ("spike", "dip")}
    matched_truth: dict[int, list[Detection]] = {id(a): [] for a in truth}
    false_positives = []
    for detection in detections:
        score = scores.setdefault(detection.kind, KindScore())
        score.detections += 1
        hits = [a for a in by_query.get((detection.query, detection.kind), [])
                if overlaps(a.start, a.end, detection.start, detection.end, tolerance_ms)]
        if hits:
            score.true_positives += 1
            for anomaly in hits:
                matched_truth[id(anomaly)].append(detection)
        else:
            false_positives.append(detection)
    missed_required = []
    for anomaly in truth:
        score = scores.setdefault(anomaly.kind, KindScore())
        score.truth += 1
        found = bool(matched_truth[id(anomaly)])
        score.found += found
        if required(anomaly):
            score.required += 1
            score.required_found += found
            if not found:
                missed_required.append(anomaly)
    total = KindScore()
    for score in list(scores.values()):
        total.add(score)
    scores["all"] = total

    outage = [a for a in truth if a.cause == "outage"]
    outage_queries = sorted({a.query for a in outage})
    outage_detected = sorted({a.query for a in outage if matched_truth[id(a)]})
    outage_required = sorted({a.query for a in outage if required(a)})
    unaffected = []
    if outage:
        start, end = min(a.start for a in outage), max(a.end for a in outage)
        unaffected = [d for d in false_positives if d.kind == "dip" and d.query not in outage_queries
                      and overlaps(start, end, d.start, d.end, 0)]
    burst_dips = [d for d in false_positives if d.kind == "dip" and any(
        d.query in b.queries and overlaps(b.start, b.end, d.start, d.end, tolerance_ms) for b in bursts)]
    return Evaluation(scores, [(a, matched_truth[id(a)]) for a in truth], missed_required, false_positives,
                      outage_queries, outage_detected, outage_required, unaffected, burst_dips)


def format_table(evaluation: Evaluation) -> str:
    lines = [
        f"{'kind':<6} {'detected':>8} {'correct':>7} {'precision':>9} {'truth':>6} {'found':>6} "
        f"{'recall':>7} {'required':>8} {'req.found':>9} {'req.recall':>10}",
    ]
    for kind in ("spike", "dip", "all"):
        s = evaluation.scores.get(kind, KindScore())
        lines.append(
            f"{kind:<6} {s.detections:>8} {s.true_positives:>7} {s.precision:>9.1%} {s.truth:>6} {s.found:>6} "
            f"{s.recall:>7.1%} {s.required:>8} {s.required_found:>9} {s.required_recall:>10.1%}"
        )
    lines.append(
        f"required = spikes >= {SPIKE_REQUIRED_MAGNITUDE:g}x normal traffic (baseline >= "
        f"{SPIKE_REQUIRED_BASELINE:g} events, >= {SPIKE_REQUIRED_RATE:g}/s), dips losing >= "
        f"{DIP_REQUIRED_MAGNITUDE:.0%} (baseline >= {DIP_REQUIRED_BASELINE:g} events, >= {DIP_REQUIRED_RATE:g}/s); "
        f"match tolerance {TOLERANCE_MS // 1000} s"
    )
    if evaluation.outage_queries:
        lines.append(
            f"outage ({OUTAGE_REGION}): dips on {len(evaluation.outage_detected)} of {len(evaluation.outage_queries)} "
            f"affected queries ({len(evaluation.outage_required)} required); dips on unaffected queries "
            f"meanwhile: {len(evaluation.outage_unaffected_dips)}"
        )
    lines.append(f"dips on delayed-only data: {len(evaluation.burst_dips)}")
    for anomaly in evaluation.missed_required:
        lines.append(f"MISSED {anomaly.kind} on {anomaly.query!r} magnitude {anomaly.magnitude:g} "
                     f"[{anomaly.start}, {anomaly.end}) baseline {anomaly.baseline:g}")
    for detection in evaluation.false_positives:
        lines.append(f"FALSE {detection.kind} on {detection.query!r} [{detection.start}, {detection.end}) "
                     f"magnitude {detection.magnitude:g} score {detection.score:g}")
    return "\n".join(lines)
