"""The skew limit: an injector pauses while a computation downstream of it lags behind it by more than
max_skew_ms, so what waits for the watermark stays bounded; nothing is lost or reordered: the output
is the same as without the limit."""

from __future__ import annotations

from bucket_counter import BucketCounter

from millstream import GeneratorInjector, Pipeline, Record
from millstream.testing import PipelineHarness

FAST, SLOW = 6_000, 60  # records: the fast input runs 100x further per read than the slow one


def run(max_skew_ms):
    fast = GeneratorInjector(lambda i: Record(f"k{i % 5}", i, i * 10), FAST, lambda n: n * 10,
                             max_records_per_read=300, name="fast")
    slow = GeneratorInjector(lambda i: Record("s", i, i * 1_000), SLOW, lambda n: n * 1_000,
                             max_records_per_read=1, name="slow")
    pipeline = (Pipeline("skew")
                .add_injector("fast", fast, "in", max_skew_ms=max_skew_ms)
                .add_injector("slow", slow, "in")
                .add_computation("windows", BucketCounter(100), ["in"], ["windows"]))
    h = PipelineHarness(pipeline)
    peak = 0
    for _ in range(10_000):
        moved = h.pull_injectors()
        busy = h.step()
        peak = max(peak, h.state_bytes("windows"))
        if not moved and not busy:
            break
    return sorted((r.key, tuple(r.value)) for r in h.output("windows")), peak


def test_the_skew_limit_bounds_what_waits_and_changes_no_output():
    unlimited_output, unlimited_peak = run(None)
    limited_output, limited_peak = run(max_skew_ms=2_000)
    assert limited_output == unlimited_output and len(limited_output) > 500
    # Without the limit the fast input runs ahead of the slow one's watermark and its windows pile
    # up waiting; with it, at most ~2 s of fast input waits at a time.
    assert limited_peak * 5 < unlimited_peak, (limited_peak, unlimited_peak)


def test_while_the_stages_behind_have_published_nothing_the_injector_reads_only_up_to_the_limit():
    fast = GeneratorInjector(lambda i: Record(f"k{i % 5}", i, i * 10), FAST, lambda n: n * 10,
                             max_records_per_read=300, name="fast")
    pipeline = (Pipeline("skew").add_injector("fast", fast, "in", max_skew_ms=2_000)
                .add_computation("windows", BucketCounter(100), ["in"], ["windows"]))
    h = PipelineHarness(pipeline)
    assert h.pull_injectors()  # the first read
    assert not h.pull_injectors()  # windows has not run: the injector waits for it
    h.step()
    assert h.pull_injectors()
