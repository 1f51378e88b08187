"""A small windowing computation several tests share: counts per key and bucket of event time."""

from millstream import Computation, MapState, Record


class BucketCounter(Computation):
    """Counts a key's records per `size_ms` bucket of event time; once the low watermark passes the
    bucket's end, produces `[bucket start, count]` stamped with the end to `stream`."""

    counts = MapState[int, int]("counts")

    def __init__(self, size_ms: int = 1_000, stream: str = "windows") -> None:
        self.size_ms = size_ms
        self.stream = stream

    def process_record(self, ctx, record):
        bucket = record.timestamp - record.timestamp % self.size_ms
        ctx.state(self.counts).put(bucket, ctx.state(self.counts).get(bucket, 0) + 1)
        ctx.set_timer(f"w{bucket}", bucket + self.size_ms)

    def process_timer(self, ctx, timer):
        bucket = timer.time - self.size_ms
        ctx.produce(Record(ctx.key, [bucket, ctx.state(self.counts).get(bucket)], timer.time), self.stream)
        ctx.state(self.counts).remove(bucket)


class LateAwareCounter(Computation):
    """Like BucketCounter, but a late record goes to the `late` stream instead of a bucket, and each
    window `{"bucket", "n", "fired_at"}` records the low watermark that fired it."""

    counts = MapState[int, int]("counts")

    def __init__(self, size_ms: int) -> None:
        self.size_ms = size_ms

    def process_record(self, ctx, record):
        if ctx.is_late:
            ctx.produce(Record(ctx.key, {"late": record.timestamp}, record.timestamp), "late")
            return
        bucket = record.timestamp - record.timestamp % self.size_ms
        ctx.state(self.counts).put(bucket, ctx.state(self.counts).get(bucket, 0) + 1)
        ctx.set_timer(f"w{bucket}", bucket + self.size_ms)

    def process_timer(self, ctx, timer):
        bucket = timer.time - self.size_ms
        ctx.produce(Record(ctx.key, {"bucket": bucket, "n": ctx.state(self.counts).get(bucket),
                                     "fired_at": ctx.low_watermark}, timer.time), "windows")
        ctx.state(self.counts).remove(bucket)


def counted_windows(points, size_ms: int = 1_000):
    """What a BucketCounter should produce for (key, timestamp) points, counted in plain Python apart
    from it: sorted (key, bucket start, count)."""
    counts = {}
    for key, timestamp in points:
        bucket = timestamp - timestamp % size_ms
        counts[(key, bucket)] = counts.get((key, bucket), 0) + 1
    return sorted((key, bucket, n) for (key, bucket), n in counts.items())
