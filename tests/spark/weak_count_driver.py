"""A driver for test_restarts_under_faults.py: a weak computation fused into a running count, run in a
process of its own so it can be killed at a named moment (MILLSTREAM_KILL_AT, millstream/spark/faults.py)."""

import argparse
import sys

from millstream import Computation, GeneratorInjector, Pipeline, Record, ValueState

KEYS = 6


class Echo(Computation):
    """One output per input record: the input value, stamped as it came."""

    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, record.value, record.timestamp), "out")


class RunningCount(Computation):
    """Numbers each key's values in the order they reach it."""

    n = ValueState[int]("n", default=0)

    def process_record(self, ctx, record):
        ctx.state(self.n).set(ctx.state(self.n).get() + 1)
        ctx.produce(Record(ctx.key, [record.value, ctx.state(self.n).get()], record.timestamp), "counts")


def pipeline(events: int, rate: float) -> Pipeline:
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, i), events, lambda n: n,
                                 records_per_second=rate, max_records_per_read=100)
    return (Pipeline("rescaled").add_injector("src", injector, "in")
            .add_computation("echo", Echo(), ["in"], ["out"], production="weak")
            .add_computation("count", RunningCount(), ["out"], ["counts"]))


def expected_counts(events: int) -> list[tuple[str, int, int]]:
    """Ground truth in plain Python: key k{i % KEYS} gets [i, its position among the key's values]."""
    return sorted((f"k{i % KEYS}", i, i // KEYS + 1) for i in range(events))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--events", type=int, default=2_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--parallelism", type=int, default=None)
    args = parser.parse_args()
    from millstream.spark.runner import SparkRunner

    runner = SparkRunner(pipeline(args.events, args.rate), root=args.root, master="local[2]", key_groups=4,
                         parallelism=args.parallelism, retain_logs_s=None)
    runner.run(timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())
