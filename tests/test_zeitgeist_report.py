"""The Zeitgeist report's plots, checked on the figures themselves: legends beside or below the data
(never over it), the injector's lag line on top and visible, labels inside the plot, y-axis labels,
a missed anomaly marked in words. The data are synthetic: each check targets one drawing rule."""

from __future__ import annotations

import numpy as np
import pytest

from millstream.apps.zeitgeist.evaluate import Detection
from millstream.apps.zeitgeist.generator import Anomaly, ZeitgeistConfig
from millstream.apps.zeitgeist.report import traffic_figure, watermark_figure

CONFIG = ZeitgeistConfig(queries=5, minutes=12, rate=20)
COMPUTATIONS = ("windower", "model_calculator", "spike_detector", "dip_detector")


def at(seconds: int) -> int:
    return CONFIG.start_ms + seconds * 1000


def series() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    count = rng.poisson(5.0, CONFIG.seconds).astype(float)
    count[600:620] = 40  # a spike
    return {"count": count, "expected": np.full(CONFIG.seconds, 5.0), "ready": np.arange(CONFIG.seconds) > 240}


def anomaly(kind: str, start_s: int, end_s: int, magnitude: float) -> Anomaly:
    return Anomaly("q", kind, at(start_s), at(end_s), magnitude, kind, "us", 100.0, 5.0)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _inside(fig, ax, artist) -> bool:
    fig.canvas.draw()
    box, frame = artist.get_window_extent(), ax.get_window_extent()
    return frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1


def test_traffic_plot_marks_a_miss_keeps_labels_inside_and_the_legend_off_the_data() -> None:
    found = anomaly("spike", 600, 620, 8.0)
    missed_late = anomaly("spike", 700, 712, 10.0)  # at the right edge: its label must not spill out
    detected = Detection("q", "spike", at(602), at(618), 6.0, 30.0, episode=1, status="closed", early=True,
                         detected_wm=at(610))
    fig = traffic_figure("q", series(), [found, missed_late], [detected], [], CONFIG, missed=[missed_late])
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text()]
    assert [t.get_text() for t in labels] == ["spike 8x", "MISSED (required): spike 10x"]
    assert all(_inside(fig, ax, t) for t in labels)
    assert ax.get_ylabel() == "searches / s"
    legend = ax.get_legend()
    assert legend.get_window_extent().y1 < ax.get_window_extent().y0  # below the plot, not over it
    assert "missed" in [t.get_text() for t in legend.get_texts()]


def test_lag_plot_shows_the_injector_above_stages_that_share_its_watermark() -> None:
    history = [{"wall_ms": 1000 * i, "max_event": at(100 + 10 * i), "injector_wm": at(95 + 10 * i),
                "watermarks": {name: at(95 + 10 * i) for name in COMPUTATIONS}} for i in range(20)]
    history[10]["max_event"] = at(400)  # a peak
    fig = watermark_figure(history, COMPUTATIONS)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    injector = lines["injector"]
    assert injector.get_zorder() > max(lines[n].get_zorder() for n in COMPUTATIONS)
    widths = [lines[n].get_linewidth() for n in COMPUTATIONS]
    assert widths == sorted(widths, reverse=True) and widths[-1] > injector.get_linewidth()  # every line shows
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 > ax.get_window_extent().x1  # beside the plot
