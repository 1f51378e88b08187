"""Review 31w: a computation reading `dead_letters` in a pipeline with a weak computation.

Pipeline.producers("dead_letters") names every computation, the weak one too, so the reader's plan
(core/plan.py, plan_computation) gets a sender for the weak computation's publication log, which
never exists (a fused computation publishes no log: its dead letters go out in its consumer's log).
That sender never publishes a watermark, so the reader's input watermark stays at the beginning of
time. The harness (reference below) finishes and echoes every dead letter."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import review31w_weak as w  # noqa: E402

EVENTS = 300


def test_harness_reference():
    from millstream.model.records import END_OF_TIME
    from millstream.testing import PipelineHarness

    harness = PipelineHarness(w.build("/tmp/unused", EVENTS, 0, "dlq"))
    harness.run_injectors()
    harness.advance_wall_time(60_000)
    harness.run()
    assert {r.value["record_id"] for r in harness.output("dl_echo")} == w.truth(EVENTS, "dlq")["failing"]
    assert harness.low_watermark("dlq") == END_OF_TIME


@pytest.mark.spark
def test_spark_dead_letter_reader_of_a_weak_computation_finishes(tmp_path):
    root = str(tmp_path)
    os.environ["R31W_TIMEOUT"] = "120"
    try:
        code, tail = w.drive(root, EVENTS, 0, None, "dlq", timeout=300)
    finally:
        os.environ.pop("R31W_TIMEOUT", None)
    echoed = {r["value"]["record_id"] for r in w.published(os.path.join(root, "run"), "dlq", "dl_echo")} \
        if os.path.isdir(os.path.join(root, "run", "log", "dlq")) else set()
    assert code == 0, f"run() did not finish:\n{tail[-2500:]}"
    assert echoed == w.truth(EVENTS, "dlq")["failing"]
