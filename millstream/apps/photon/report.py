"""The Photon demo's report: join latency, the outputs against the ground truth, the registry's load.

The ground truth comes from the generator's records alone: a click is joinable if its query reached
the query log, unjoinable (reason "not_found") if it never did. The outputs are read from the
pipelines' sink files (outputs.py), never from the pipelines' own counters.

Join latency of a click is measured as Photon's paper does, from the click being in its log to the
joined event being in the output: from the moment the click's log file appeared (its first record,
if the click was logged twice) to the moment the sink file holding its joined event was delivered.
"""

from __future__ import annotations

import html
import io
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from millstream.apps.photon.generator import PhotonData
from millstream.photon.dispatcher import EXPIRED_REASON, DispatchStats
from millstream.photon.outputs import SinkRecord

PAPER_P90_S = 7.0


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile (None for no values).

    >>> percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9), percentile([], 0.5)
    (9, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass(frozen=True)
class Truth:
    """What the pipelines must output: every joinable click joined once, every other one unjoinable."""

    joinable: frozenset[str]
    unjoinable: frozenset[str]
    click_records: int
    first_record: Mapping[str, str]  # click id -> the record id logged first

    @classmethod
    def of(cls, data: PhotonData) -> "Truth":
        logged_queries = {q.key for q in data.queries if q.logged_at_ms is not None}
        joinable: set[str] = set()
        unjoinable: set[str] = set()
        first: dict[str, str] = {}
        for record in sorted(data.clicks, key=lambda r: (r.logged_at_ms or 0, r.id)):
            first.setdefault(record.key, record.id)
            (joinable if record.value["query_id"] in logged_queries else unjoinable).add(record.key)
        return cls(frozenset(joinable), frozenset(unjoinable), len(data.clicks), first)


@dataclass
class OutputCheck:
    """The union of the pipelines' outputs against the truth (counts; `ok` only if all as expected)."""

    joinable: int = 0
    joined_once: int = 0
    joined_twice: int = 0
    missing: int = 0
    unjoinable_expected: int = 0
    unjoinable_reported: int = 0
    wrong_reason: int = 0
    unexpected: int = 0  # an output for a click that should have none there
    expired_reported: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (self.joined_once == self.joinable and not self.joined_twice and not self.missing
                and self.unjoinable_reported == self.unjoinable_expected and not self.wrong_reason
                and not self.unexpected)


def check_outputs(truth: Truth, joined: Iterable[SinkRecord], unjoinable: Iterable[SinkRecord]) -> OutputCheck:
    joined_ids = Counter(r.key for r in joined)
    reported: dict[str, set[str]] = {}
    expired = set()
    for record in unjoinable:
        if record.value.get("reason") == EXPIRED_REASON:
            expired.add(record.key)
        else:
            reported.setdefault(record.key, set()).add(record.value.get("reason"))
    check = OutputCheck(joinable=len(truth.joinable), unjoinable_expected=len(truth.unjoinable),
                        expired_reported=len(expired))
    check.joined_once = sum(1 for c in truth.joinable if joined_ids[c] == 1)
    twice = [c for c, n in joined_ids.items() if n > 1]
    missing = [c for c in truth.joinable if joined_ids[c] == 0]
    wrong = [c for c, reasons in reported.items() if c in truth.unjoinable and reasons != {"not_found"}]
    unexpected = [c for c in joined_ids if c not in truth.joinable] + [c for c in reported if c not in truth.unjoinable]
    check.joined_twice, check.missing, check.wrong_reason, check.unexpected = (
        len(twice), len(missing), len(wrong), len(unexpected))
    check.unjoinable_reported = sum(1 for c in truth.unjoinable if c in reported)
    check.examples = {name: sorted(ids)[:5] for name, ids in
                      (("joined_twice", twice), ("missing", missing), ("wrong_reason", wrong),
                       ("unexpected", unexpected)) if ids}
    return check


def join_latencies_ms(truth: Truth, visible_ms: Mapping[str, int], joined: Iterable[SinkRecord]) -> list[int]:
    """Per joined click (its first delivery): delivered - its first record's log file appeared."""
    first_delivery: dict[str, int] = {}
    for record in joined:
        first_delivery[record.key] = min(first_delivery.get(record.key, record.delivered_ms), record.delivered_ms)
    latencies = []
    for click_id, delivered in first_delivery.items():
        appeared = visible_ms.get(truth.first_record.get(click_id, ""))
        if appeared is not None:
            latencies.append(delivered - appeared)
    return latencies


def latency_parts_ms(truth: Truth, visible_ms: Mapping[str, int], joined: Iterable[SinkRecord]) -> dict[str, list[int]]:
    """Where each joined click's latency went (its first delivery): `read` from its log file appearing
    to the dispatcher first seeing it (the micro-batch that read it), `join` from then to the joined
    event being produced (retries while the query was not in the EventStore), `deliver` from then to
    the sink file appearing (the rest of the micro-batch, Spark's commit, the publication)."""
    first: dict[str, SinkRecord] = {}
    for record in joined:
        if record.key not in first or record.delivered_ms < first[record.key].delivered_ms:
            first[record.key] = record
    parts: dict[str, list[int]] = {"read": [], "join": [], "deliver": []}
    for click_id, record in first.items():
        appeared = visible_ms.get(truth.first_record.get(click_id, ""))
        seen, produced = record.value.get("first_seen_ms"), record.value.get("joined_ms")
        if appeared is None or seen is None or produced is None:
            continue
        parts["read"].append(seen - appeared)
        parts["join"].append(produced - seen)
        parts["deliver"].append(record.delivered_ms - produced)
    return parts


@dataclass
class RegistryLoad:
    """What the dispatchers asked of the registry during the run."""

    commit_calls: int
    commit_claims: int
    lookup_calls: int
    lookup_ids: int
    seconds: float
    batch_sizes: dict[str, float | None]

    @classmethod
    def of(cls, stats_values: Sequence[Mapping[str, Any]], seconds: float) -> "RegistryLoad":
        total = DispatchStats()
        sizes = []
        for value in stats_values:
            stats = DispatchStats.from_json(value)
            total += stats
            if stats.commit_calls:
                sizes.append(stats.commit_claims / stats.commit_calls)
        return cls(total.commit_calls, total.commit_claims, total.lookup_calls, total.lookup_ids, seconds,
                   {"mean": total.mean_commit_batch or None, "p50": percentile(sizes, 0.5),
                    "p90": percentile(sizes, 0.9), "max": max(sizes, default=None)})

    @property
    def ids_per_second(self) -> float:
        return self.commit_claims / self.seconds if self.seconds > 0 else 0.0


def latency_summary(latencies_ms: Sequence[int]) -> dict[str, float | None]:
    seconds = [ms / 1000 for ms in latencies_ms]
    within = sum(1 for s in seconds if s <= PAPER_P90_S) / len(seconds) if seconds else None
    return {"count": len(seconds), "p50_s": percentile(seconds, 0.5), "p90_s": percentile(seconds, 0.9),
            "p99_s": percentile(seconds, 0.99), "max_s": max(seconds, default=None),
            "within_7s": within}


def batch_cadence(times_ms: Sequence[int], start_ms: int, end_ms: int) -> dict[str, float | int | None]:
    """How often a pipeline's dispatcher ran a micro-batch while clicks came in (between `start_ms` and
    `end_ms`): the number of batches and the mean seconds between them. A click waits for the next
    batch to be read, and for the batch to be committed to be delivered, so this bounds its latency.

    >>> batch_cadence([0, 5_000, 10_000, 11_000, 13_000, 40_000], 4_000, 14_000)
    {'batches': 4, 'mean_interval_s': 2.7}
    """
    during = [t for t in times_ms if start_ms <= t <= end_ms]
    gaps = [(b - a) / 1000 for a, b in zip(during, during[1:])]
    return {"batches": len(during), "mean_interval_s": round(sum(gaps) / len(gaps), 1) if gaps else None}


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def format_report(report: Mapping[str, Any]) -> list[str]:
    """The report as the lines the command prints."""
    latency, check, load = report["latency"], report["check"], report["registry"]
    stats = report["stats"]
    lines = [
        f"join latency (click in its log -> joined event delivered), {latency['count']} clicks: "
        f"p50 {_s(latency['p50_s'])}  p90 {_s(latency['p90_s'])}  p99 {_s(latency['p99_s'])}  "
        f"max {_s(latency['max_s'])}; "
        + (f"{latency['within_7s']:.0%} within 7 s (the paper: 90%)" if latency["within_7s"] is not None else ""),
        f"against the ground truth: {check['joined_once']}/{check['joinable']} joinable clicks joined exactly once, "
        f"{check['joined_twice']} twice, {check['missing']} missing; {check['unjoinable_reported']}/"
        f"{check['unjoinable_expected']} unjoinable reported (query never logged), {check['wrong_reason']} with a "
        f"wrong reason, {check['unexpected']} unexpected outputs -> {'OK' if report['ok'] else 'FAILED'}",
        f"dispatchers: {stats['clicks']:,} click records, {stats['duplicates']} duplicates merged, "
        f"{stats['skipped']} skipped at lookup, {stats['wasted']} wasted joins, {stats['reclaimed']} reclaimed, "
        f"{stats['retries']} retries, {stats['overloaded']} overloaded, {stats['commit_retries']} commits retried "
        f"with the same token",
        f"registry: {load['commit_claims']:,} ids committed in {load['commit_calls']:,} transactions "
        f"({load['ids_per_second']:.1f} ids/s over the traffic), batch mean {_fmt(load['batch_sizes']['mean'])} "
        f"p90 {_fmt(load['batch_sizes']['p90'])} max {_fmt(load['batch_sizes']['max'])}; "
        f"{load['lookup_ids']:,} ids looked up in {load['lookup_calls']:,} calls",
    ]
    parts = report.get("latency_parts") or {}
    if parts:
        lines.append("where the latency goes (p50/p90): " + ", ".join(
            f"{name} {_s(p['p50_s'])}/{_s(p['p90_s'])}" for name, p in parts.items())
            + " (read: log file -> the micro-batch reading it; join: retries until the query is found; "
              "deliver: the batch's end, Spark's commit, publication)")
    cadence = report.get("batches") or {}
    if cadence:
        lines.append("dispatcher micro-batches while clicks came in: " + ", ".join(
            f"{owner} {c['batches']} (every {_fmt(c['mean_interval_s'])} s)" for owner, c in cadence.items()))
    lines += [f"  {line}" for line in report.get("events", [])]
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def write_html(path: str, report: Mapping[str, Any], latencies_ms: Sequence[int]) -> None:
    """report.html: the printed report and a plot of the latency distribution (CDF)."""
    import matplotlib

    matplotlib.use("Agg")
    import base64

    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.6))
    seconds = sorted(ms / 1000 for ms in latencies_ms)
    if seconds:
        axis.step(seconds, [(i + 1) / len(seconds) for i in range(len(seconds))], where="post", label="this run")
    axis.axvline(PAPER_P90_S, color="grey", linestyle="--", linewidth=1)
    axis.axhline(0.9, color="grey", linestyle="--", linewidth=1)
    axis.annotate("paper: 90% within 7 s", (PAPER_P90_S, 0.9), textcoords="offset points", xytext=(4, -14),
                  fontsize=8, color="grey")
    axis.set_xlabel("join latency (s): click in its log -> joined event delivered")
    axis.set_ylabel("fraction of clicks")
    axis.set_ylim(0, 1.02)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    image = base64.b64encode(buffer.getvalue()).decode()
    body = "\n".join(f"<p>{html.escape(line)}</p>" for line in format_report(report))
    with open(path, "w", encoding="utf-8") as out:
        out.write(f"<!doctype html><meta charset='utf-8'><title>Photon on millstream</title>"
                  f"<h1>Photon on millstream</h1>{body}<img src='data:image/png;base64,{image}'>"
                  f"<pre>{html.escape(json.dumps(report, indent=1, default=str))}</pre>")
