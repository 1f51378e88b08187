"""report.html: the evaluation, traffic-vs-model plots of flagged queries, watermark lag over time.

Plots are PNGs made with matplotlib's Agg backend and embedded as base64, so the report is one file.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import time
from collections import defaultdict
from typing import Any, Iterable, Sequence

import numpy as np

from millstream.apps.zeitgeist.evaluate import (
    DIP_REQUIRED_MAGNITUDE,
    SPIKE_REQUIRED_MAGNITUDE,
    Detection,
    Evaluation,
    format_table,
    required,
)
from millstream.apps.zeitgeist.generator import Anomaly, DelayedBurst, ZeitgeistConfig
from millstream.model.records import END_OF_TIME

SPIKE_COLOR, DIP_COLOR = "#d62728", "#1f77b4"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    _pyplot().close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def series_by_query(model_values: Iterable[tuple[str, dict[str, Any]]], keys: Iterable[str],
                    config: ZeitgeistConfig) -> dict[str, dict[str, np.ndarray]]:
    """Per wanted query: count, expected and ready per second of the run (from the `model` stream)."""
    wanted = set(keys)
    seconds = config.seconds
    out: dict[str, dict[str, np.ndarray]] = {}
    for query, value in model_values:
        if query not in wanted:
            continue
        series = out.get(query)
        if series is None:
            series = out[query] = {"count": np.full(seconds, np.nan), "expected": np.full(seconds, np.nan),
                                   "ready": np.zeros(seconds, dtype=bool)}
        i = (int(value["start"]) - config.start_ms) // 1000
        if 0 <= i < seconds:
            series["count"][i] = value["count"]
            series["expected"][i] = value["expected"]
            series["ready"][i] = bool(value["ready"])
    return out


def _smooth(values: np.ndarray, width: int) -> np.ndarray:
    filled = np.nan_to_num(values, nan=0.0)
    valid = (~np.isnan(values)).astype(float)
    kernel = np.ones(width)
    total = np.convolve(filled, kernel, mode="same")
    n = np.convolve(valid, kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / n, np.nan)


_AXES_WIDTH_PT = 11 * 72 * 0.78  # the traffic plot's axes, about 78% of its 11-inch figure
_CHAR_WIDTH_PT = 4.4  # a 7-point character, on average


def _label_position(x0: float, x1: float, right_edge: float, label: str) -> tuple[float, str]:
    """Where a label of the interval [x0, x1] goes so it stays inside the plot: from the interval's
    left edge, or, when it would run past the plot's right edge, ending at the interval's right edge.

    >>> _label_position(1.0, 2.0, 12.0, "spike 4x")
    (1.0, 'left')
    >>> _label_position(11.0, 11.5, 12.0, "MISSED (required): spike 10x")
    (11.5, 'right')
    """
    width = len(label) * _CHAR_WIDTH_PT / _AXES_WIDTH_PT * right_edge
    return (x1, "right") if x0 + width > right_edge else (x0, "left")


def traffic_plot(query: str, series: dict[str, np.ndarray], truth: Sequence[Anomaly], detections: Sequence[Detection],
                 bursts: Sequence[DelayedBurst], config: ZeitgeistConfig, missed: Sequence[Anomaly] = ()) -> str:
    return _png(traffic_figure(query, series, truth, detections, bursts, config, missed))


def traffic_figure(query: str, series: dict[str, np.ndarray], truth: Sequence[Anomaly],
                   detections: Sequence[Detection], bursts: Sequence[DelayedBurst], config: ZeitgeistConfig,
                   missed: Sequence[Anomaly] = ()) -> Any:
    """Traffic against the model for one query. Above the traffic, in bands of their own so they
    never cover it: the detected episodes (bars), then the injected anomalies' labels; a missed
    anomaly is outlined and labelled MISSED. The legend sits below the plot."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(11, 2.9))
    minutes = np.arange(config.seconds) / 60.0
    right_edge = config.seconds / 60
    width = 5
    smoothed = _smooth(series["count"], width)
    ax.plot(minutes, smoothed, color="#444444", lw=0.8)
    expected = np.where(series["ready"], series["expected"], np.nan)
    ax.plot(minutes, expected, color="#2ca02c", lw=1.2)
    top = float(np.nanmax(smoothed)) if np.isfinite(smoothed).any() else 1.0
    top = max(top, 1.0)
    bar_y, label_y = top * 1.12, top * 1.2
    missed_ids = {id(a) for a in missed}
    for a in truth:
        color = SPIKE_COLOR if a.kind == "spike" else DIP_COLOR
        x0, x1 = (a.start - config.start_ms) / 60000, (a.end - config.start_ms) / 60000
        ax.axvspan(x0, x1, ymax=1 / 1.35, color=color, alpha=0.18, lw=0)
        label = f"{a.cause} {a.magnitude:g}{'x' if a.kind == 'spike' else ''}"
        if id(a) in missed_ids:
            ax.axvspan(x0, x1, ymax=1 / 1.35, facecolor="none", edgecolor="#c00000", hatch="x", lw=1.5)
            label = f"MISSED{' (required)' if required(a) else ''}: {label}"
        x, align = _label_position(x0, x1, right_edge, label)
        ax.text(x, label_y, label, fontsize=7, color="#c00000" if id(a) in missed_ids else color, va="bottom",
                ha=align, clip_on=True, fontweight="bold" if id(a) in missed_ids else "normal")
    for b in bursts:
        if query in b.queries:
            x0, x1 = (b.start - config.start_ms) / 60000, (b.end - config.start_ms) / 60000
            ax.axvspan(x0, x1, ymax=1 / 1.35, color="#ff7f0e", alpha=0.12, lw=0, hatch="//")
            x, align = _label_position(x0, x1, right_edge, f"delayed {b.delay_ms // 1000}s")
            ax.text(x, top * 0.92, f"delayed {b.delay_ms // 1000}s", fontsize=7, color="#ff7f0e", ha=align,
                    clip_on=True)
    for d in detections:
        color = SPIKE_COLOR if d.kind == "spike" else DIP_COLOR
        x0, x1 = (d.start - config.start_ms) / 60000, (d.end - config.start_ms) / 60000
        ax.plot([x0, x1], [bar_y, bar_y], color=color, lw=4, solid_capstyle="butt")
    ax.set_ylim(0, top * 1.35)
    ax.set_xlim(0, right_edge)
    ax.set_title(query, fontsize=10, loc="left")
    ax.set_xlabel("event time (minutes from start)", fontsize=8)
    ax.set_ylabel("searches / s", fontsize=8)
    ax.tick_params(labelsize=8)
    handles = [Line2D([], [], color="#444444", lw=0.8, label=f"searches/s ({width}-s mean)"),
               Line2D([], [], color="#2ca02c", lw=1.2, label="model expectation"),
               Patch(color=SPIKE_COLOR, alpha=0.3, label="injected spike"),
               Patch(color=DIP_COLOR, alpha=0.3, label="injected dip"),
               Line2D([], [], color="#555555", lw=4, label="detected episode (bar)")]
    if missed_ids & {id(a) for a in truth}:
        handles.append(Patch(facecolor="none", edgecolor="#c00000", hatch="x", label="missed"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=len(handles),
              frameon=False)
    return fig


def watermark_plot(history: Sequence[dict[str, Any]], computations: Sequence[str]) -> str | None:
    fig = watermark_figure(history, computations)
    return None if fig is None else _png(fig)


def watermark_figure(history: Sequence[dict[str, Any]], computations: Sequence[str]) -> Any:
    """Each computation's low watermark lag behind the newest event time injected, over wall time.
    Stages often share a watermark (their lines coincide): each is drawn thinner than the one before,
    so every line stays visible as a coloured edge, and the injector's on top, dashed black. The
    legend sits beside the plot, never over a peak."""
    if not history:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 3.2))
    t0 = history[0]["wall_ms"]
    x = np.array([(h["wall_ms"] - t0) / 1000 for h in history])

    def lags(name: str) -> list[float]:
        values = []
        for h in history:
            wm = h["injector_wm"] if name == "injector" else h["watermarks"].get(name)
            max_event = h.get("max_event") or 0
            if wm is None or wm >= END_OF_TIME or wm <= 0 or max_event <= 0:
                values.append(np.nan)
            else:
                values.append((max_event - wm) / 1000)
        return values

    widths = np.linspace(14.0, 3.0, len(computations)) if len(computations) > 1 else [2.0]
    for name, lw in zip(computations, widths):
        ax.plot(x, lags(name), lw=lw, label=name, solid_capstyle="round")
    ax.plot(x, lags("injector"), lw=1.3, ls="--", color="black", label="injector", zorder=5)
    ax.set_xlabel("wall time since start of the run (s)", fontsize=8)
    ax.set_ylabel("lag (s of event time)", fontsize=8)
    ax.set_title("low watermark lag behind the newest event injected", fontsize=10, loc="left")
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(alpha=0.3)
    return fig


def write_report(path: str, config: ZeitgeistConfig, evaluation: Evaluation, detections: Sequence[Detection],
                 truth: Sequence[Anomaly], bursts: Sequence[DelayedBurst], model_values: Iterable[tuple[str, dict]],
                 history: Sequence[dict[str, Any]], computations: Sequence[str], run_info: dict[str, Any],
                 max_queries: int = 16) -> None:
    truth_by_query: dict[str, list[Anomaly]] = defaultdict(list)
    for a in truth:
        truth_by_query[a.query].append(a)
    det_by_query: dict[str, list[Detection]] = defaultdict(list)
    for d in detections:
        det_by_query[d.query].append(d)
    false_queries = {d.query for d in evaluation.false_positives}
    missed_queries = {a.query for a in evaluation.missed_required}
    flagged = set(truth_by_query) | set(det_by_query)
    burst_queries = {q for b in bursts for q in b.queries}

    def priority(query: str) -> tuple:
        return (query not in false_queries and query not in missed_queries,
                not any(a.cause == "outage" for a in truth_by_query[query]),
                -len(truth_by_query[query]) - len(det_by_query[query]), query)

    shown = sorted(flagged, key=priority)[:max_queries]
    # The busiest delayed-only query too: the honest watermark keeps it free of dips.
    delayed_only = sorted(burst_queries - flagged)
    series = series_by_query(model_values, shown + delayed_only, config)
    if delayed_only:
        shown.append(max(delayed_only, key=lambda q: np.nansum(series[q]["count"]) if q in series else -1))

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Zeitgeist report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
        "img{max-width:100%}.ok{color:#2a7}.bad{color:#c22}</style></head><body>",
        "<h1>Zeitgeist: spikes and dips in search traffic</h1>",
        f"<p>Generated {html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))}. "
        f"Log: {html.escape(json.dumps({k: v for k, v in config.to_json().items() if k in ('queries', 'minutes', 'seed', 'rate', 'day_seconds')}))}. "
        f"Run: {html.escape(json.dumps(run_info))}.</p>",
        "<h2>Precision and recall against the ground truth</h2>",
        f"<pre>{html.escape(format_table(evaluation))}</pre>",
        f"<p>Recall is guaranteed for spikes of at least {SPIKE_REQUIRED_MAGNITUDE:g}x the normal traffic and "
        f"dips losing at least {DIP_REQUIRED_MAGNITUDE:.0%} of it (with enough normal traffic to be visible); "
        "weaker anomalies are found on a best-effort basis. See docs/zeitgeist.md.</p>",
    ]
    lag_png = watermark_plot(history, computations)
    if lag_png:
        parts += ["<h2>Low watermark lag</h2>",
                  "<p>How far each computation's low watermark trails the newest event time injected so far. "
                  "The injector's watermark waits for delayed events (the delayed burst shows as a plateau); "
                  "each stage adds its own pending work (the Windower holds one open second per query). With "
                  "weak_windower the Windower runs fused into the ModelCalculator's query and they share a line. Stages "
                  "that share a watermark draw on top of each other: each is thinner than the one before, and the "
                  "injector is the dashed black line.</p>",
                  f"<img src='data:image/png;base64,{lag_png}'>"]
    parts += ["<h2>Traffic and model of flagged queries</h2>",
              "<p>Grey: searches per second; green: the model's expectation (drawn once the model is ready); "
              "shaded: injected anomalies (red spikes, blue dips, orange hatched: delayed delivery only); bars "
              "above: detected episodes (red spikes, blue dips); outlined in red and labelled MISSED: an injected "
              "anomaly no detection matched.</p>"]
    for query in shown:
        if query not in series:
            continue
        png = traffic_plot(query, series[query], truth_by_query[query], det_by_query[query], bursts, config,
                           missed=[a for a, found in evaluation.matched if not found and a.query == query])
        parts.append(f"<img src='data:image/png;base64,{png}'>")
    parts += ["<h2>Detected episodes</h2>", "<table><tr><th>query</th><th>kind</th><th>start (s)</th>"
              "<th>end (s)</th><th>magnitude</th><th>score</th><th>early</th><th>matches</th></tr>"]
    false_ids = {id(d) for d in evaluation.false_positives}
    for d in detections:
        ok = id(d) not in false_ids
        parts.append(
            f"<tr><td>{html.escape(d.query)}</td><td>{d.kind}</td><td>{(d.start - config.start_ms) / 1000:.0f}</td>"
            f"<td>{(d.end - config.start_ms) / 1000:.0f}</td><td>{d.magnitude:.2f}</td><td>{d.score:.1f}</td>"
            f"<td>{'yes' if d.early else ''}</td><td class='{'ok' if ok else 'bad'}'>{'truth' if ok else 'FALSE'}</td></tr>")
    parts.append("</table>")
    parts += ["<h2>Injected anomalies</h2>", "<table><tr><th>query</th><th>cause</th><th>start (s)</th>"
              "<th>end (s)</th><th>magnitude</th><th>baseline events</th><th>required</th><th>found</th></tr>"]
    for a, found in evaluation.matched:
        parts.append(
            f"<tr><td>{html.escape(a.query)}</td><td>{a.cause}</td><td>{(a.start - config.start_ms) / 1000:.0f}</td>"
            f"<td>{(a.end - config.start_ms) / 1000:.0f}</td><td>{a.magnitude:g}</td><td>{a.baseline:.0f}</td>"
            f"<td>{'yes' if required(a) else ''}</td>"
            f"<td class='{'ok' if found else ('bad' if required(a) else '')}'>{'yes' if found else 'no'}</td></tr>")
    parts.append("</table></body></html>")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        out.write("\n".join(parts))
    os.replace(tmp, path)
