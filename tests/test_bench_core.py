"""The core benchmark's reference runs give the Windower's exact windows (bench.common's direct
count), so the figures they set beside the core's measure the same work."""

from bench.common import expected_windows
from bench.core import run_core, run_plain, run_user_code_alone


def test_the_user_code_alone_and_plain_python_give_the_exact_windows() -> None:
    # 50 keys over 30,000 records: about 200 records per key and bucket, so each bucket's timer is
    # set again and again before it fires, and must fire once.
    keys, total, batch = 50, 30_000, 7_000
    expected = expected_windows(keys, total)
    assert len(expected) < total // 100
    assert run_user_code_alone(keys, total, batch)[2] == expected
    assert run_plain(keys, total, batch)[2] == expected
    assert run_core(keys, total, batch)[2] == expected
