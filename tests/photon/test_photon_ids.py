"""Photon-style event ids."""

from __future__ import annotations

import random
import threading

import pytest

from millstream.photon import EventId, EventIdGenerator, event_time_of


def test_ids_are_unique_and_their_timestamps_never_go_back_even_when_the_clock_does():
    rng = random.Random(1)
    ticks = [1_000 + rng.randrange(-5, 30) for _ in range(2_000)]  # a jittery clock, sometimes back
    clock = iter(ticks)
    generator = EventIdGenerator("web-1", "42", clock=lambda: next(clock))
    ids = [generator.next_id() for _ in ticks]
    assert len(set(ids)) == len(ids)
    stamps = [event_time_of(i) for i in ids]
    assert stamps == sorted(stamps)
    high_water = 0
    for stamp, tick in zip(stamps, ticks):
        high_water = max(high_water, tick)
        assert stamp == high_water  # the clock's reading, unless it went back


def test_ids_stay_unique_across_threads():
    generator = EventIdGenerator("web-1", "42", clock=lambda: 7)
    made: list[list[str]] = [[] for _ in range(8)]
    threads = [threading.Thread(target=lambda out=out: out.extend(generator.next_id() for _ in range(500)))
               for out in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for out in made for i in out]
    assert len(set(every)) == 4_000
    assert sorted(EventId.parse(i).sequence for i in every) == list(range(4_000))


@pytest.mark.parametrize("server", ["10.1.2.3", "web-7", "fe80::1", "::1"])
def test_parse_round_trips_including_ipv6_servers(server):
    event_id = EventId(server, "1234", 1_700_000_000_123, 17)
    assert EventId.parse(str(event_id)) == event_id
    assert event_id.source == f"{server}:1234"
    assert event_time_of(str(event_id)) == 1_700_000_000_123


@pytest.mark.parametrize("text", ["", "a:b:c", "web:1:notatime:0", "web:1:5:-1", ":1:5:0", "web::5:0"])
def test_malformed_ids_are_rejected(text):
    with pytest.raises(ValueError):
        EventId.parse(text)


def test_explicit_timestamps_are_honoured_but_never_go_back():
    generator = EventIdGenerator("web-1", "42", clock=lambda: 0)
    assert [generator.next_id(t) for t in (50, 40, 60)] == ["web-1:42:50:0", "web-1:42:50:1", "web-1:42:60:0"]
