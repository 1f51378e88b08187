"""The in-memory key store (core/store.py), which also holds every Spark worker's cache of a key
group: its wake-up heaps stay in proportion to the keys however often keys are saved with new
wake-up times (a TTL refreshed, a timer moved on), and it finds the same due keys as a plain scan."""

import random

from millstream.core.store import MemoryKeyStore, StoredKey


def plain_due(wakes: dict[str, tuple[int | None, int | None, dict[str, int]]], low_watermark: int, wall: int,
              keyed: dict[str, int]) -> list[str]:
    return sorted(key for key, (lw, wall_at, by_key) in wakes.items()
                  if (lw is not None and lw <= low_watermark) or (wall_at is not None and wall_at <= wall)
                  or any(time <= keyed.get(name, -1) for name, time in by_key.items()))


def test_wake_up_heaps_stay_in_proportion_to_the_keys_and_find_what_a_scan_finds():
    rng = random.Random(7)
    store = MemoryKeyStore()
    wakes: dict[str, tuple[int | None, int | None, dict[str, int]]] = {}
    watermark = 0
    for step in range(400):
        changes: dict[str, StoredKey | None] = {}
        for key in rng.sample([f"k{i}" for i in range(1_000)], 300):
            if rng.random() < 0.05:
                changes[key] = None
                wakes.pop(key, None)
                continue
            # Wake-ups far ahead of the watermark, moved on at every save: a TTL refreshed.
            lw = watermark + rng.randrange(50_000, 100_000)
            wall = rng.choice([None, watermark + rng.randrange(1, 100_000)])
            by_key = {"ship": watermark + rng.randrange(1, 100_000)} if rng.random() < 0.3 else {}
            changes[key] = StoredKey(b"x", lw, wall, tuple(by_key.items()))
            wakes[key] = (lw, wall, by_key)
        store.save(changes, {}, watermark, 0)
        watermark += 100
        keyed = {"ship": watermark}
        assert store.due(watermark, watermark, keyed) == plain_due(wakes, watermark, watermark, keyed)
        entries = len(store._lw) + len(store._wall) + sum(map(len, store._keyed.values()))
        assert entries <= 3 * (2 * len(store.blobs) + 1_024), (step, entries, len(store.blobs))
    walls = [wall for _, wall, _ in wakes.values() if wall is not None]
    assert store.next_wall_time() == (min(walls) if walls else None)
