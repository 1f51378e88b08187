"""Event-time windows on low-watermark timers, so pipelines need not write the Windower by hand.

    from millstream.windows import Count, TumblingWindows, WindowAggregate

    counts = WindowAggregate(TumblingWindows(60_000), Count(), "counts_per_minute")
    pipeline.add_computation("count", counts, ["clicks"], counts.outputs)

- `assigners`: `TumblingWindows(size_ms)`, `SlidingWindows(size_ms, slide_ms)` and `Window`;
- `aggregators`: `Count`, `Sum`, `Min`, `Max`, `Collect` and `Fold` (your own init/add/finish);
- `aggregate`: `WindowAggregate`, the computation (semantics in its module doc).
"""

from millstream.windows.aggregate import LatePolicy, WindowAggregate, window_value
from millstream.windows.aggregators import Aggregator, Collect, Count, Fold, Max, Min, Sum
from millstream.windows.assigners import SlidingWindows, TumblingWindows, Window, WindowAssigner

__all__ = [
    "Aggregator", "Collect", "Count", "Fold", "LatePolicy", "Max", "Min", "SlidingWindows", "Sum", "TumblingWindows",
    "Window", "WindowAggregate", "WindowAssigner", "window_value",
]
