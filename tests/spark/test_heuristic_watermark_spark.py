"""The heuristic watermark on Spark: every record delivered once, the late ones flagged and counted
exactly as the published watermarks say, the late share near 1 - q (closed form, see
tests/test_heuristic_watermark.py), and every watermark Spark logged recomputable from the offset
logged before it (what a restart replays)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_heuristic_watermark import Flags, honest_injector, stamps_with_lateness  # noqa: E402

from millstream import HeuristicWatermark, Pipeline  # noqa: E402
from millstream.spark.runner import SparkRunner  # noqa: E402
from millstream.spark.storage import Storage  # noqa: E402

COUNT, PER_READ, QUANTILE = 4_000, 250, 0.95


def logged_offsets(root):
    """The source's end offset of every batch, as Spark logged it (oldest first)."""
    checkpoints = Storage(os.path.join(root, "checkpoints", "flags"))
    offsets = []
    for generation in sorted(checkpoints.list("")):
        names = checkpoints.list(f"{generation}/offsets")
        for batch in sorted(int(n) for n in names if n.isdigit()):
            text = checkpoints.read(f"{generation}/offsets/{batch}").decode()
            offsets.append(json.loads(text.strip().splitlines()[-1]))
    return offsets


def test_heuristic_watermark_on_spark(spark, tmp_path):
    stamps = stamps_with_lateness(COUNT, 800.0, seed=4)
    heuristic = HeuristicWatermark(honest_injector(stamps, PER_READ), QUANTILE)
    pipeline = (Pipeline("heuristic").add_injector("src", heuristic, "in")
                .add_computation("flags", Flags(), ["in"], ["flags"]))
    root = str(tmp_path / "root")
    runner = SparkRunner(pipeline, root=root, spark=spark)
    progress = runner.run(timeout=400)

    flags = runner.read_stream("flags")
    assert sorted(r.value["index"] for r in flags) == list(range(COUNT))  # every record, once, late ones too
    flagged = {r.value["index"] for r in flags if r.value["late"]}

    # Truth from the offsets Spark logged: a record is late when its timestamp is behind the watermark
    # the source had published before the batch that read it.
    senders = [o["senders"] for o in logged_offsets(root)]
    (name,) = senders[0]
    expected, replayed = set(), 0
    for before, after in zip([None, *senders], senders):
        start = before[name]["offset"]["inner"]["next"] if before else 0
        mark = before[name]["watermark"] if before else None
        expected |= {i for i in range(start, after[name]["offset"]["inner"]["next"])
                     if mark is not None and stamps[i] < mark}
        # Replay: the end offset and watermark follow from the offset logged before it.
        if before and after[name]["offset"] != before[name]["offset"]:
            again = json.loads(json.dumps(heuristic.latest_offset("0", before[name]["offset"], None)))
            assert again == after[name]["offset"]
            assert after[name]["watermark"] == max(before[name]["watermark"], heuristic.low_watermark("0", again))
            replayed += 1
    assert replayed >= COUNT // PER_READ - 1
    assert flagged == expected
    assert progress.computations["flags"].late == len(expected)
    # Reads of 250 ms of event time against lateness of ~800 ms: near 1 - q, and fewer (see the docs).
    assert 0.2 * (1 - QUANTILE) < len(expected) / COUNT < 1.2 * (1 - QUANTILE)
