"""The core benchmark's runs give the Windower's exact windows, each in the batch it is due in, so
the figures set side by side measure the same work. The expectation is counted directly from the
workload's generator (bench.common.KeyedRecords) and its watermark."""

from collections import Counter

from bench.common import KeyedRecords, KeyedWatermark
from bench.core import run_core, run_plain, run_user_code_alone
from millstream.model.records import END_OF_TIME


def expected(keys: int, total: int, batch: int) -> Counter:
    """Each window (key, bucket, count) with the first batch whose watermark reaches its end."""
    make, watermark = KeyedRecords(keys), KeyedWatermark()
    counts = Counter((make.key(i), make.timestamp(i) // 1000 * 1000) for i in range(total))
    limits = [watermark(end) if end < total else END_OF_TIME
              for end in (min(total, start + batch) for start in range(0, total, batch))]
    return Counter((key, bucket, count, next(n for n, limit in enumerate(limits) if limit >= bucket + 1000))
                   for (key, bucket), count in counts.items())


def test_every_run_gives_the_exact_windows_in_the_batches_they_are_due_in() -> None:
    # 50 keys over 60,000 records (6 s of event time, 1 s a batch): about 200 records per key and
    # bucket, so each bucket's timer is set again and again before it fires, and must fire once,
    # when the watermark passes its end.
    keys, total, batch = 50, 60_000, 10_000
    windows = expected(keys, total, batch)
    assert len(windows) < total // 100
    assert len({number for *_, number in windows}) == 6  # windows come out in every batch
    assert run_user_code_alone(keys, total, batch)[2] == windows
    assert run_plain(keys, total, batch)[2] == windows
    assert run_core(keys, total, batch)[2] == windows
