"""millstream.core.flatpickle: the memo-less pickler that bundles and state chunks are written with."""

from __future__ import annotations

import pickle

import pytest

from millstream.core import flatpickle


def test_what_it_writes_reads_back_equal_including_shared_and_nested_objects():
    shared = ("key", b"\x00value", 2**70)
    value = [shared, shared, {"k": [shared, None, 1.5, True]}, (), "", b"", {"a": {"b": ("c",)}}]
    assert pickle.loads(flatpickle.dumps(value)) == value


def test_a_repeated_object_is_written_again_in_full_and_reads_back_equal():
    # Without a memo a repeated object is written again in full: larger, still equal.
    repeated = ["the same string"] * 1_000
    flat, memo = flatpickle.dumps(repeated), pickle.dumps(repeated, protocol=5)
    assert pickle.loads(flat) == repeated
    assert len(flat) > len(memo)


def test_a_cycle_is_refused_rather_than_recursing_forever():
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises((ValueError, RecursionError)):
        flatpickle.dumps(cyclic)
