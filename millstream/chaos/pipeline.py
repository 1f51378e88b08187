"""The pipeline the chaos command kills again and again, and its independent ground truth.

    deposits (2 partitions) --\\
                               +--> ledger --entries--> lottery --draws--> sinks (JSON lines; a slow writer)
    withdrawals (2 partitions)-/        |                   \\
                                        +--totals           +--> auditor (wall-time timers) --flushes--> sink

- `ledger` has two senders and is order-sensitive: per account a running balance, each entry naming
  the balance before and after it (a chain that breaks if an entry is lost, repeated or altered), and
  a low-watermark timer per 10-second window that emits the window's total.
- `lottery` is not deterministic: it draws a random number for every entry (a different one each time
  a batch runs) and keeps the running maximum in its state; at the end of input it publishes its state.
  Exactly-once means the draws published are those whose state Spark kept: the running maxima chain.
- `auditor` uses wall-time timers: after each draw it arms a timer a fraction of a second ahead and
  flushes the count of draws it has seen since the last flush.

The ground truth is computed in plain Python from the generator's records, apart from the pipeline.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from millstream import (
    Computation,
    GeneratorInjector,
    MapState,
    Pipeline,
    Record,
    TimeDomain,
    ValueState,
)

WINDOW_MS = 10_000
DISORDER_MS = 2_000
STEP_MS = 5  # event time between consecutive records of one injector


@dataclass(frozen=True)
class ChaosSpec:
    events: int = 20_000  # per injector
    accounts: int = 40
    seed: int = 7
    records_per_second: float = 400.0  # per injector, so a run lasts long enough to be killed often

    def record(self, side: str, index: int) -> Record[Any]:
        rng = random.Random(f"{self.seed}-{side}-{index}")
        account = f"acct-{rng.randrange(self.accounts)}"
        amount = rng.randrange(1, 100) * (1 if side == "deposits" else -1)
        timestamp = index * STEP_MS + rng.randrange(DISORDER_MS)
        return Record(account, {"amount": amount, "side": side, "n": index}, timestamp, f"{side}-{index}")

    def low_watermark(self, next_index: int) -> int:
        return next_index * STEP_MS  # every later record is stamped at or after its base time

    def injector(self, side: str) -> GeneratorInjector:
        return GeneratorInjector(lambda i: self.record(side, i), self.events, self.low_watermark,
                                 records_per_second=self.records_per_second, name=side, partitions=2,
                                 max_records_per_read=2_000)


class Ledger(Computation):
    balance = ValueState[int]("balance", default=0)
    seq = ValueState[int]("seq", default=0)
    windows = MapState[int, int]("windows")

    def process_record(self, ctx: Any, record: Record[Any]) -> None:
        balance, seq = ctx.state(self.balance), ctx.state(self.seq)
        amount = record.value["amount"]
        before = balance.get()
        balance.set(before + amount)
        seq.set(seq.get() + 1)
        ctx.produce(Record(ctx.key, {"seq": seq.get(), "before": before, "amount": amount, "after": before + amount,
                                     "source": record.id}, record.timestamp), "entries")
        window = record.timestamp - record.timestamp % WINDOW_MS
        windows = ctx.state(self.windows)
        windows.put(window, windows.get(window, 0) + amount)
        ctx.set_timer(f"w{window}", window + WINDOW_MS)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        window = timer.time - WINDOW_MS
        windows = ctx.state(self.windows)
        ctx.produce(Record(ctx.key, {"window": window, "total": windows.get(window, 0)}, timer.time), "totals")
        windows.remove(window)


class Lottery(Computation):
    """Not deterministic on purpose: a random draw per entry; its state keeps the running maximum and
    the running sum of the draws, and every output carries both (a chain a single draw published
    from one attempt and kept from another would break)."""

    best = ValueState[float]("best", default=-1.0)
    total = ValueState[float]("total", default=0.0)
    count = ValueState[int]("count", default=0)

    def process_record(self, ctx: Any, record: Record[Any]) -> None:
        draw = random.random()
        best, total, count = ctx.state(self.best), ctx.state(self.total), ctx.state(self.count)
        best.set(max(best.get(), draw))
        total.set(total.get() + draw)
        count.set(count.get() + 1)
        ctx.produce(Record(ctx.key, {"entry": record.id, "seq": record.value["seq"], "draw": draw,
                                     "best": best.get(), "total": total.get(), "count": count.get()},
                           record.timestamp), "draws")
        ctx.set_timer("final", 2**47 - 1)  # fires once the input is over: publishes the state

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce(Record(ctx.key, {"final": True, "best": ctx.state(self.best).get(),
                                     "total": ctx.state(self.total).get(), "count": ctx.state(self.count).get()},
                           timer.time), "draws")


class Auditor(Computation):
    """Wall-time timers holding the watermark: flushes, per account, how many draws it saw since the
    last flush, stamped with the earliest of them, which the flush timer holds the output watermark
    at meanwhile (so no flush is late for a consumer: verify.py checks it from the log)."""

    unflushed = ValueState[int]("unflushed", default=0)
    flushes = ValueState[int]("flushes", default=0)
    oldest: ValueState[int | None] = ValueState("oldest")  # the earliest unflushed draw's time

    def process_record(self, ctx: Any, record: Record[Any]) -> None:
        if record.value.get("final"):
            return
        unflushed = ctx.state(self.unflushed)
        unflushed.set(unflushed.get() + 1)
        oldest = ctx.state(self.oldest)
        if oldest.get() is None or record.timestamp < oldest.get():
            oldest.set(record.timestamp)
        ctx.set_timer("flush", ctx.wall_time + 300, TimeDomain.WALL_TIME, hold=oldest.get())

    def process_timer(self, ctx: Any, timer: Any) -> None:
        flushes = ctx.state(self.flushes)
        flushes.set(flushes.get() + 1)
        count = ctx.state(self.unflushed).get()
        ctx.state(self.unflushed).clear()
        stamp = ctx.state(self.oldest).get()
        ctx.state(self.oldest).clear()
        ctx.produce(Record(ctx.key, {"flush": flushes.get(), "count": count}, stamp), "flushes")


class SlowBatchFiles:
    """A user's writer sink that falls behind: one JSON-lines file of ids per (producer, batch),
    replaced whole on a redelivery, after a pause every `every` batches, so that published batches
    queue up behind it and a kill often finds it batches behind (a restart must then deliver every
    one of them, in order, before anything newer)."""

    def __init__(self, directory: str, pause_s: float = 2.0, every: int = 4) -> None:
        self.directory, self.pause_s, self.every = directory, pause_s, every

    def __call__(self, frame: Any, batch_id: int) -> None:
        if batch_id % self.every == 0:
            time.sleep(self.pause_s)
        rows = frame.select("producer", "id").collect()
        os.makedirs(self.directory, exist_ok=True)
        for producer in {row["producer"] for row in rows}:
            path = os.path.join(self.directory, f"{producer}-{batch_id:06d}.jsonl")
            with open(f"{path}.partial", "w") as out:
                out.writelines(json.dumps({"id": row["id"]}) + "\n" for row in rows if row["producer"] == producer)
            os.replace(f"{path}.partial", path)


def build_pipeline(spec: ChaosSpec, sink_dir: str, lottery_exactly_once: bool = True) -> Pipeline:
    """`lottery_exactly_once=False` shows what the protocol prevents: the lottery then publishes the
    first attempt of a batch while Spark keeps the state of the last one."""
    return (
        Pipeline("chaos")
        .add_injector("deposits", spec.injector("deposits"), "deposits")
        .add_injector("withdrawals", spec.injector("withdrawals"), "withdrawals")
        .add_computation("ledger", Ledger(), ["deposits", "withdrawals"], ["entries", "totals"])
        .add_computation("lottery", Lottery(), ["entries"], ["draws"], exactly_once=lottery_exactly_once)
        .add_computation("auditor", Auditor(), ["draws"], ["flushes"])
        .add_sink("draws_out", "draws", f"{sink_dir}/draws", format="jsonl")
        .add_sink("flushes_out", "flushes", f"{sink_dir}/flushes", format="jsonl")
        .add_sink("draws_slow", "draws", writer=SlowBatchFiles(f"{sink_dir}/draws_slow"))
    )


@dataclass
class Truth:
    """What the pipeline must produce, from the generator's records alone."""

    amounts: dict[str, tuple[str, int]]  # input id -> (account, amount)
    window_totals: dict[tuple[str, int], int]  # (account, window start) -> total

    @classmethod
    def of(cls, spec: ChaosSpec) -> "Truth":
        amounts: dict[str, tuple[str, int]] = {}
        totals: dict[tuple[str, int], int] = {}
        for side in ("deposits", "withdrawals"):
            for index in range(spec.events):
                record = spec.record(side, index)
                amounts[record.id] = (record.key, record.value["amount"])
                window = record.timestamp - record.timestamp % WINDOW_MS
                totals[(record.key, window)] = totals.get((record.key, window), 0) + record.value["amount"]
        return cls(amounts, totals)
