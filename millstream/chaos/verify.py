"""Checks a chaos run's published output against the ground truth (pipeline.py), from its files.

Reads the publication logs and the sink directories directly (no Spark), so a check never depends on
the code under test to tell it what was published. Everything counted is reported; `ok` only if
nothing was lost, duplicated or altered and every chain is unbroken.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow.parquet as pq

from millstream.chaos.pipeline import ChaosSpec, Truth


@dataclass
class Check:
    name: str
    lost: int = 0
    duplicated: int = 0
    altered: int = 0
    broken: list[str] = field(default_factory=list)  # consistency failures, described

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.altered or self.broken)


def log_entries(run_root: str, producer: str) -> Iterator[dict[str, Any]]:
    """A computation's publication log's batch entries, in order: the files named by a position
    alone (`000000000042.json`), not a killed driver's temporary file beside them
    (`000000000042.json.tmp-...`), which was never published."""
    log_dir = os.path.join(run_root, "log", producer)
    for name in sorted(n for n in os.listdir(log_dir) if _ENTRY.fullmatch(n)):
        with open(os.path.join(log_dir, name)) as data:
            entry = json.load(data)
        if entry["type"] == "batch":
            yield entry


_ENTRY = re.compile(r"\d{12}\.json")


def published(run_root: str, producer: str, stream: str) -> list[dict[str, Any]]:
    """Every record a computation published on a stream, from its publication log."""
    records = []
    for entry in log_entries(run_root, producer):
        for path, rows in entry["streams"].get(stream, []):
            if rows:
                table = pq.read_table(path).to_pydict()
                for key, value, ts, rid in zip(table["key"], table["value"], table["timestamp"], table["id"]):
                    records.append({"key": key, "value": json.loads(value), "timestamp": ts, "id": rid})
    return records


def stamped_behind(run_root: str, producer: str, stream: str) -> list[str]:
    """The records a computation published on a stream stamped behind the watermark it had
    published before their input point (what any consumer would judge late), from its log."""
    behind: list[str] = []
    watermark: int | None = None  # published before the entry's first point
    for entry in log_entries(run_root, producer):
        before = [watermark, *entry["output"][:-1]]  # per point: the watermark published before it
        for path, rows in entry["streams"].get(stream, []):
            if rows:
                table = pq.read_table(path).to_pydict()
                for ts, segment, rid in zip(table["timestamp"], table["segment"], table["id"]):
                    if before[segment] is not None and ts < before[segment]:
                        behind.append(rid)
        watermark = entry["output"][-1]
    return behind


def sink_lines(directory: str) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as data:
                lines.extend(json.loads(line) for line in data if line.strip())
    return lines


def verify(spec: ChaosSpec, root: str) -> list[Check]:
    run_root = os.path.join(root, "run")
    truth = Truth.of(spec)
    checks = []

    entries = published(run_root, "ledger", "entries")
    check = Check("ledger entries (two senders, order-sensitive)")
    sources = Counter(e["value"]["source"] for e in entries)
    check.lost = sum(1 for i in truth.amounts if sources[i] == 0)
    check.duplicated = sum(n - 1 for n in sources.values() if n > 1)
    check.altered = sum(1 for e in entries if truth.amounts.get(e["value"]["source"]) != (e["key"], e["value"]["amount"]))
    by_account: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in entries:
        by_account[entry["key"]].append(entry["value"])
    for account, chain in by_account.items():
        chain.sort(key=lambda v: v["seq"])
        if [v["seq"] for v in chain] != list(range(1, len(chain) + 1)):
            check.broken.append(f"{account}: sequence numbers not 1..{len(chain)}")
        previous = 0
        for value in chain:
            if value["before"] != previous or value["after"] != value["before"] + value["amount"]:
                check.broken.append(f"{account}: balance chain broken at seq {value['seq']}")
                break
            previous = value["after"]
    checks.append(check)

    totals = published(run_root, "ledger", "totals")
    check = Check("window totals (low-watermark timers)")
    seen = Counter((t["key"], t["value"]["window"]) for t in totals)
    check.duplicated = sum(n - 1 for n in seen.values() if n > 1)
    check.lost = sum(1 for k in truth.window_totals if k not in seen)
    check.altered = sum(1 for t in totals if truth.window_totals.get((t["key"], t["value"]["window"])) != t["value"]["total"])
    checks.append(check)

    draws = published(run_root, "lottery", "draws")
    check = Check("lottery draws (not deterministic)")
    plain = [d for d in draws if not d["value"].get("final")]
    finals = {d["key"]: d["value"] for d in draws if d["value"].get("final")}
    drawn = Counter(d["value"]["entry"] for d in plain)
    entry_ids = {e["id"] for e in entries}
    check.lost = sum(1 for i in entry_ids if drawn[i] == 0)
    check.duplicated = sum(n - 1 for n in drawn.values() if n > 1) + (
        len([d for d in draws if d["value"].get("final")]) - len(finals))
    check.altered = sum(1 for i in drawn if i not in entry_ids)
    per_account: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for draw in plain:
        per_account[draw["key"]].append(draw["value"])
    for account, chain in per_account.items():
        chain.sort(key=lambda v: v["count"])
        best, total = -1.0, 0.0
        for position, value in enumerate(chain, 1):
            best, total = max(best, value["draw"]), total + value["draw"]  # the lottery's own arithmetic
            if value["count"] != position or value["best"] != best or value["total"] != total:
                check.broken.append(f"{account}: running maximum or sum chain broken at draw {position}")
                break
        final = finals.get(account)
        if final is None:
            check.broken.append(f"{account}: no final state published")
        elif (final["count"], final["best"], final["total"]) != (len(chain), best, total):
            check.broken.append(f"{account}: published state {final} disagrees with its {len(chain)} draws")
    checks.append(check)

    flushes = published(run_root, "auditor", "flushes")
    check = Check("auditor flushes (wall-time timers, holds)")
    counted: Counter[str] = Counter()
    numbers: dict[str, list[int]] = defaultdict(list)
    for flush in flushes:
        counted[flush["key"]] += flush["value"]["count"]
        numbers[flush["key"]].append(flush["value"]["flush"])
    expected = Counter(d["key"] for d in plain)
    check.lost = sum(max(0, n - counted[k]) for k, n in expected.items())
    check.duplicated = sum(max(0, counted[k] - n) for k, n in expected.items())
    for account, flush_numbers in numbers.items():
        if sorted(flush_numbers) != list(range(1, len(flush_numbers) + 1)):
            check.broken.append(f"{account}: flush numbers not 1..{len(flush_numbers)}")
    late = stamped_behind(run_root, "auditor", "flushes")
    if late:  # each flush is stamped with its earliest draw, which its timer held the watermark at
        check.broken.append(f"{len(late)} flushes stamped behind the auditor's published watermark "
                            f"(a hold not kept), e.g. {late[0]}")
    checks.append(check)

    for stream, sink, records in (("draws", "draws", draws), ("flushes", "flushes", flushes),
                                  ("draws", "draws_slow", draws)):
        check = Check(f"sink {sink}/ (JSON lines) against the published {stream}")
        lines = Counter(line["id"] for line in sink_lines(os.path.join(root, "sinks", sink)))
        ids = Counter(r["id"] for r in records)
        check.lost = sum(1 for i in ids if lines[i] == 0)
        check.duplicated = sum(n - 1 for n in lines.values() if n > 1)
        check.altered = sum(1 for i in lines if i not in ids)
        checks.append(check)
    return checks
