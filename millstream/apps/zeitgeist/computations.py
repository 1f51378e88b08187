"""Zeitgeist's computations (MillWheel, figure 1): Windower -> ModelCalculator -> Spike/DipDetector.

Streams (all keyed by the query text):

    queries   raw searches from the injector; value: the query's region
    windows   Windower -> ModelCalculator: {"start", "count", "late"} per query and 1-second bucket,
              produced once the low watermark has passed the bucket (timestamp = bucket end)
    model     ModelCalculator -> detectors: the window's count with the prediction the model made for
              it *before* learning from it ({"start", "count", "expected", "var", "ready"}), plus the
              model bins that changed ("update"), so the SpikeDetector can keep a mirror of the model
    anomalies detectors -> sinks: {"query", "kind", "status", "episode", "start", "end", "magnitude",
              "score", "observed", "expected", "detected_wm", "early"}

The statistics (see docs/zeitgeist.md): per query, a seasonal baseline of the per-second count over
the day (knots of a piecewise-linear profile, each an exponentially weighted mean and variance of the
count); detectors run a one-sided CUSUM of the Poisson log-likelihood ratio "traffic is r times the
model" versus "traffic is as the model says", scaled down by the overdispersion var/mean. An episode
opens when the CUSUM exceeds `threshold` nats and closes once it has fallen `close_drop` below its
peak; the episode spans from where the CUSUM last left zero to its peak.

Late data (records behind the input low watermark, `ctx.is_late`) is dropped and counted, as Zeitgeist
does (MillWheel section 5.5): by the Windower (per query, reported in the window records' "late"
field) and by the SpikeDetector. The framework counts them in each computation's metrics too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from millstream.model.computation import Computation, Context
from millstream.model.records import END_OF_TIME, Record, Timer
from millstream.model.state import ValueState

BUCKET_MS = 1000


# -- the seasonal model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSettings:
    """The per-query seasonal baseline.

    The day is split into `bins` knots; the expected count of a second is the linear interpolation of
    its two neighbouring knots, and a window updates both knots with the interpolation weights (a
    triangular kernel). Each knot keeps an exponentially weighted mean of the count, of the squared
    prediction error (the variance), its accumulated weight and the events it has seen. A knot learns
    as a plain average until its weight reaches 1/alpha_min, then forgets with rate alpha_min.
    A prediction is *ready* once both knots have about one day of data (`ready_days`) and have seen
    `ready_events` events (so the mean of a quiet query is known to ~20%)."""

    day_ms: int = 240_000
    bins: int = 12
    alpha_min: float = 0.01
    ready_days: float = 0.8
    ready_events: float = 20.0
    # Windows that deviate from the model by more than `gate_z` standard deviations *and* by more than
    # `gate_ratio` of the expected count over `gate_window` seconds are not learned (anomalies must not
    # become the baseline); after `max_gated` gated seconds in a row the model learns anyway (a lasting
    # change of level is the new normal).
    gate_window: int = 20
    gate_z: float = 3.5
    gate_ratio: float = 0.35
    max_gated: int = 240

    @property
    def bin_ms(self) -> float:
        return self.day_ms / self.bins

    @property
    def ready_weight(self) -> float:
        return self.ready_days * self.bin_ms / BUCKET_MS

    def knots(self, start: int) -> tuple[int, int, float]:
        """The two knots around the center of bucket `start` and the weight of the second."""
        x = ((start + BUCKET_MS // 2) % self.day_ms) / self.bin_ms
        i = int(x) % self.bins
        return i, (i + 1) % self.bins, x - int(x)


def empty_model(bins: int) -> dict[str, list[float]]:
    return {"m": [0.0] * bins, "v": [0.0] * bins, "w": [0.0] * bins, "e": [0.0] * bins}


@dataclass(frozen=True)
class Prediction:
    """Expected count of a second, the variance of the count around it, whether the model has enough
    history to be trusted, and the standard error of `expected` itself (the model's own uncertainty)."""

    expected: float
    var: float
    ready: bool
    se: float = 0.0

    def to_list(self) -> list[Any]:
        return [round(self.expected, 4), round(self.var, 4), self.ready, round(self.se, 4)]


NOT_READY = Prediction(0.0, 0.0, False, 0.0)


def predict(settings: ModelSettings, model: dict[str, list[float]] | None, start: int) -> Prediction:
    if not model:
        return NOT_READY
    i, j, f = settings.knots(start)
    m, v, w, e = model["m"], model["v"], model["w"], model["e"]
    expected = (1 - f) * m[i] + f * m[j]
    var = max((1 - f) * v[i] + f * v[j], expected)  # never below Poisson
    ready = (min(w[i], w[j]) >= settings.ready_weight
             and (1 - f) * e[i] + f * e[j] >= settings.ready_events)
    cap = 1.0 / settings.alpha_min  # exponential forgetting bounds the effective sample size
    n_i, n_j = max(1.0, min(w[i], cap)), max(1.0, min(w[j], cap))
    se = math.sqrt(var * ((1 - f) ** 2 / n_i + f ** 2 / n_j))
    return Prediction(expected, var, ready, se)


def learn(settings: ModelSettings, model: dict[str, list[float]], start: int, count: float,
          prediction: Prediction) -> list[list[float]]:
    """Fold one window into the model; returns the changed knots as [index, mean, var, weight, events]."""
    i, j, f = settings.knots(start)
    m, v, w, e = model["m"], model["v"], model["w"], model["e"]
    informed = min(w[i], w[j]) >= 0.5 * settings.ready_weight
    if prediction.ready:  # a single wild second moves the mean by a bounded amount
        sd = math.sqrt(prediction.var)
        count = min(max(count, prediction.expected - 5 * sd), prediction.expected + 5 * sd)
    changed = []
    for k, weight in ((i, 1.0 - f), (j, f)):
        if weight <= 1e-9:
            continue
        total = w[k] + weight
        alpha = max(weight / total, settings.alpha_min * weight)
        error = count - (prediction.expected if informed else m[k])
        # Rounded as published: the SpikeDetector's mirror then holds exactly the same model.
        m[k] = round(m[k] + alpha * (count - m[k]), 5)
        v[k] = round((1 - alpha) * v[k] + alpha * error * error, 5) if w[k] > 0 else 0.0
        w[k] = round(min(total, 1e9), 3)
        e[k] = round(e[k] + weight * count, 3)
        changed.append([k, m[k], v[k], w[k], e[k]])
    return changed


def apply_update(model: dict[str, list[float]], update: list[list[float]]) -> None:
    for k, mean, var, weight, events in update:
        k = int(k)
        model["m"][k], model["v"][k], model["w"][k], model["e"][k] = mean, var, weight, events


# -- CUSUM episodes --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DetectorSettings:
    """One-sided CUSUM of the Poisson log-likelihood ratio of "traffic = ratio x model".

    Per second: llr = (count * ln(ratio) - mu * (ratio - 1)) / phi, with phi = max(1, var/expected)
    (overdispersion) and mu the model's expectation moved `model_margin` standard errors *against*
    the anomaly (up for spikes, down for dips), so a model that is still uncertain does not raise
    alarms. Break-even (llr = 0) is at count/mu = (ratio - 1) / ln(ratio): 1.82 for ratio 3 (spikes),
    0.58 for ratio 0.3 (dips). `threshold` in nats: an alarm needs e**threshold times more likelihood
    for the anomaly than for normal traffic. One second adds at most threshold / min_seconds: a
    single wild second is not a trend ("consistently different over a non-trivial number of
    buckets", as the paper puts it)."""

    kind: str = "spike"
    ratio: float = 3.0
    threshold: float = 14.0
    close_drop: float = 8.0
    min_expected: float = 0.25  # per-second floor of mu (spikes on near-silent queries)
    model_margin: float = 1.5
    min_seconds: float = 2.0

    def llr(self, count: float, pred: Prediction) -> float:
        if not pred.ready:
            return 0.0
        if self.ratio > 1.0:
            mu = max(pred.expected + self.model_margin * pred.se, self.min_expected)
        else:
            mu = max(pred.expected - self.model_margin * pred.se, self.min_expected)
        phi = max(1.0, pred.var / pred.expected) if pred.expected > 0 else 1.0
        llr = (count * math.log(self.ratio) - mu * (self.ratio - 1.0)) / phi
        return llr if llr < self.max_step else self.max_step

    @property
    def max_step(self) -> float:
        """Most evidence one second can add: an alarm needs `min_seconds` anomalous seconds."""
        return self.threshold / self.min_seconds


SPIKES = DetectorSettings("spike", ratio=3.0, threshold=14.0, close_drop=8.0, min_expected=0.25, model_margin=1.0)
DIPS = DetectorSettings("dip", ratio=0.3, threshold=14.0, close_drop=8.0, min_expected=0.0, model_margin=1.5)


def new_cusum() -> dict[str, Any]:
    """A query's detector state: `f` last complete bucket, `c` CUSUM after it, `z` where the current
    excursion started (the bucket after the CUSUM was last zero), `sc`/`sm` observed/expected counts
    since `z`, `ep` the open episode, `n` episodes so far, `late` records dropped as late."""
    return {"f": None, "c": 0.0, "z": None, "sc": 0.0, "sm": 0.0, "ep": None, "n": 0, "late": 0}


def anomaly_value(query: str, settings: DetectorSettings, status: str, ep: dict[str, Any],
                  detected_wm: int) -> dict[str, Any]:
    observed, expected = ep["sc"], ep["sm"]
    ratio = observed / expected if expected > 0 else 0.0
    magnitude = ratio if settings.kind == "spike" else 1.0 - ratio
    return {
        "query": query, "kind": settings.kind, "status": status, "episode": ep["n"],
        "start": ep["start"], "end": ep["end"], "magnitude": round(magnitude, 4),
        "score": round(ep["cmax"], 3), "observed": round(observed, 3), "expected": round(expected, 3),
        "detected_wm": detected_wm, "early": bool(ep.get("early", False)),
    }


def cusum_step(settings: DetectorSettings, det: dict[str, Any], start: int, count: float,
               pred: Prediction) -> list[tuple[str, dict[str, Any]]]:
    """Advance a query's CUSUM by one *complete* bucket. Returns ("open"|"closed", episode) events.

    An episode opens when the CUSUM exceeds the threshold; it spans from where the CUSUM last left
    zero to where it peaked, and closes once the CUSUM has dropped `close_drop` below the peak (the
    data since the peak favours normal traffic by e**close_drop) or reached zero."""
    events: list[tuple[str, dict[str, Any]]] = []
    end = start + BUCKET_MS
    if det["z"] is None:
        det["z"] = start
    c = det["c"] + settings.llr(count, pred)
    if c <= 0.0:
        det["c"], det["z"], det["sc"], det["sm"] = 0.0, end, 0.0, 0.0
    else:
        det["c"] = c
        det["sc"] += count
        det["sm"] += pred.expected
    det["f"] = start
    c = det["c"]
    ep = det["ep"]
    if ep is None:
        if c > settings.threshold:
            det["n"] += 1
            ep = det["ep"] = {"n": det["n"], "start": det["z"], "end": end, "cmax": c, "sc": det["sc"],
                              "sm": det["sm"], "final": True}
            events.append(("open", ep))
        return events
    if not ep.get("final"):  # opened early on partial counts; the complete data is catching up
        if c > settings.threshold:
            ep.update(final=True, start=det["z"], end=end, cmax=c, sc=det["sc"], sm=det["sm"])
        elif c <= 0.0 and start >= ep["end"]:  # cannot happen unless data was dropped as late
            events.append(("closed", ep))
            det["ep"] = None
        return events
    if c > ep["cmax"]:
        ep.update(end=end, cmax=c, sc=det["sc"], sm=det["sm"])
    elif ep["cmax"] - c >= settings.close_drop or c <= 0.0:
        events.append(("closed", ep))
        det["ep"] = None
        det["c"], det["z"], det["sc"], det["sm"] = 0.0, end, 0.0, 0.0
    return events


# -- computations -----------------------------------------------------------------------------------
# State is kept as one JSON value per concern and key (lists indexed by bucket, not one map entry per
# bucket): a step decodes and encodes each touched key's state once.


class Windower(Computation):
    """Counts each query's searches per 1-second bucket; a low-watermark timer at the bucket's end
    produces the window once no more on-time data can arrive for it (the paper's Windower).

    Quiet seconds matter (a dip on a near-silent query is a run of zeros): once a query has been
    seen, its timer chain produces a window for *every* second, zero or not, until the query has been
    silent for `quiet_ms` (then it is dormant until its next search). When the input ends (low
    watermark at END_OF_TIME) the chain runs on to `stream_end` if given, else to the last data.

    Not built on millstream.windows.WindowAggregate, whose windows exist only where records fell:
    this chain produces the empty seconds too (and goes dormant after `quiet_ms`), reports each
    query's late count in every window, and keeps one JSON list per query instead of an entry per
    open second, so a step decodes a query's state once."""

    # {"b0": start of the next bucket to produce (None: dormant), "c": counts of buckets b0, b0+1s, ...,
    #  "last": start of the last bucket with data, "late": searches dropped as late}
    window: ValueState[dict[str, Any] | None] = ValueState("window")

    def __init__(self, quiet_ms: int = 240_000, stream_start: int | None = None,
                 stream_end: int | None = None) -> None:
        self.quiet_ms = quiet_ms
        self.stream_start = stream_start
        self.stream_end = stream_end

    def process_record(self, ctx: Context, record: Record) -> None:
        handle = ctx.state(self.window)
        st = handle.get()
        if st is None:
            st = {"b0": None, "c": [], "last": None, "late": 0}
        if ctx.is_late:  # its window may be out already: drop it, count it
            st["late"] += 1
            handle.set(st)
            return
        bucket = record.timestamp - record.timestamp % BUCKET_MS
        if st["b0"] is None:  # start (or wake up) the chain of windows
            first = bucket
            if st["last"] is None and self.stream_start is not None and bucket - self.stream_start <= self.quiet_ms:
                first = self.stream_start
            # Never produce a window behind the low watermark: it would be late downstream.
            floor = ctx.low_watermark - BUCKET_MS
            if first < floor:
                first = floor + (-floor) % BUCKET_MS
            st["b0"], st["c"] = first, []
            ctx.set_timer("w", first + BUCKET_MS)
        counts = st["c"]
        index = (bucket - st["b0"]) // BUCKET_MS
        if index >= len(counts):
            counts.extend([0] * (index + 1 - len(counts)))
        counts[index] += 1
        st["last"] = bucket if st["last"] is None else max(st["last"], bucket)
        handle.set(st)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        handle = ctx.state(self.window)
        st = handle.get()
        assert st is not None, "the window timer is set with the window's state"
        end = timer.time
        start = end - BUCKET_MS
        counts = st["c"]
        count = counts.pop(0) if counts else 0
        ctx.produce(Record(ctx.key, {"start": start, "count": count, "late": st["late"]}, end), "windows")
        if counts:
            more = True
        elif ctx.low_watermark >= END_OF_TIME:
            more = self.stream_end is not None and end < self.stream_end
        else:
            more = end - (st["last"] + BUCKET_MS) < self.quiet_ms
        if more:
            st["b0"] = end
            ctx.set_timer("w", end + BUCKET_MS)
        else:
            st["b0"] = None
        handle.set(st)


class ModelCalculator(Computation):
    """Per query, the long-lived seasonal model (persistent state). For each window it produces the
    prediction made *before* learning from the window, then learns from windows that are at least
    `gate_window` seconds old and were not part of an anomalous stretch (see ModelSettings)."""

    model: ValueState[dict[str, Any] | None] = ValueState("model")  # see empty_model()
    # {"recent": [[start, count, expected, var, ready, gated], ...] not learned yet,
    #  "sums": [n, observed, expected, var] over the ready ones, "gated": seconds not learned in a row}
    gate: ValueState[dict[str, Any] | None] = ValueState("gate")

    def __init__(self, settings: ModelSettings = ModelSettings()) -> None:
        self.settings = settings

    def process_record(self, ctx: Context, record: Record) -> None:
        # Windows are produced at timers with the timer's time as timestamp, so none is ever late;
        # if one were, it would be learned like any other (the model is a long-run average).
        s = self.settings
        window = record.value
        start, count = int(window["start"]), int(window["count"])
        model_handle, gate_handle = ctx.state(self.model), ctx.state(self.gate)
        model = model_handle.get() or empty_model(s.bins)
        gate = gate_handle.get() or {"recent": [], "sums": [0, 0.0, 0.0, 0.0], "gated": 0}
        pred = predict(s, model, start)

        recent, sums = gate["recent"], gate["sums"]  # sums over the ready entries of recent
        recent.append([start, count, pred.expected, pred.var, pred.ready, False])
        if pred.ready:
            sums[0] += 1
            sums[1] += count
            sums[2] += pred.expected
            sums[3] += pred.var
        ready, observed, expected, var = sums
        if ready * 2 >= s.gate_window:
            deviation = abs(observed - expected)
            if deviation > s.gate_ratio * expected and deviation > s.gate_z * math.sqrt(var + (0.1 * expected) ** 2):
                for r in recent:
                    r[5] = True
        update: list[list[float]] = []
        while len(recent) > s.gate_window:
            old_start, old_count, old_expected, old_var, old_ready, was_gated = recent.pop(0)
            if old_ready:
                sums[0] -= 1
                sums[1] -= old_count
                sums[2] -= old_expected
                sums[3] -= old_var
            if was_gated and gate["gated"] < s.max_gated:
                gate["gated"] += 1
                continue
            gate["gated"] = 0
            # Learn against the model as it is now (the prediction stored may be stale).
            update.extend(learn(s, model, old_start, old_count, predict(s, model, old_start)))
        if not recent or sums[0] <= 0:
            gate["sums"] = [0, 0.0, 0.0, 0.0]  # no float drift
        gate_handle.set(gate)
        if update or model_handle.get() is None:
            model_handle.set(model)
        expected_, var_, ready_, se_ = pred.to_list()
        ctx.produce(Record(ctx.key, {
            "start": start, "count": count, "expected": expected_, "var": var_, "ready": ready_, "se": se_,
            "late": window.get("late", 0), "update": update,
        }, record.timestamp), "model")


def _prediction_of(value: dict[str, Any]) -> Prediction:
    return Prediction(value["expected"], value["var"], value["ready"], value.get("se", 0.0))


class DipDetector(Computation):
    """Dips need the low watermark: a bucket's count is only known to be low once no more data for it
    can arrive. Buckets wait in state until a low-watermark timer says the watermark has passed their
    end; then they enter the dip CUSUM in bucket order."""

    pending: ValueState[list[list[Any]]] = ValueState("pending", default=[])  # [[start, count, expected, var, ready, se], ...]
    det: ValueState[dict[str, Any] | None] = ValueState("det")  # new_cusum() + "armed": time of the pending timer

    def __init__(self, settings: DetectorSettings = DIPS) -> None:
        self.settings = settings

    def process_record(self, ctx: Context, record: Record) -> None:
        det_handle = ctx.state(self.det)
        det = det_handle.get() or new_cusum()
        if ctx.is_late:  # cannot happen with millstream's watermarks (windows are timer productions)
            det["late"] += 1
            det_handle.set(det)
            return
        value = record.value
        start = int(value["start"])
        pending = ctx.state(self.pending)
        pending.set(pending.get() + [[start, value["count"], *_prediction_of(value).to_list()]])
        if det.get("armed") is None or start + BUCKET_MS < det["armed"]:
            det["armed"] = start + BUCKET_MS
            ctx.set_timer("eval", start + BUCKET_MS)
            det_handle.set(det)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        det_handle = ctx.state(self.det)
        det = det_handle.get() or new_cusum()
        det["armed"] = None
        pending_handle = ctx.state(self.pending)
        pending = sorted(pending_handle.get())
        done = 0
        for start, count, expected, var, ready, se in pending:
            if start + BUCKET_MS > ctx.low_watermark:
                break
            done += 1
            if det["f"] is not None and start <= det["f"]:
                continue
            for status, ep in cusum_step(self.settings, det, start, count, Prediction(expected, var, ready, se)):
                ctx.produce(Record(ctx.key, anomaly_value(ctx.key, self.settings, status, ep, ctx.low_watermark),
                                   start + BUCKET_MS), "anomalies")
        pending_handle.set(pending[done:])
        if done < len(pending):
            det["armed"] = pending[done][0] + BUCKET_MS
            ctx.set_timer("eval", det["armed"])
        det_handle.set(det)


# The SpikeDetector's open buckets: {"b0": start of the first, "e": [entry, ...]}, one entry per
# second from b0 on: [count so far, expected, var, ready, se, CUSUM continued over the partial counts].
_COUNT, _CUSUM = 0, 5


class SpikeDetector(Computation):
    """Spikes need no timers: counts only grow as data arrives, and the CUSUM only grows with the
    counts, so once the *partial* counts of the open buckets push it over the threshold, the data
    still to come can only confirm the spike.

    Inputs: the raw `queries` (partial counts of the open buckets, which the low watermark has not
    passed) and the `model` stream (complete buckets in order, plus model updates mirrored here to
    predict the open buckets). The CUSUM over complete buckets is kept as the DipDetector keeps its
    own; each open bucket stores the CUSUM continued over the partial counts, and a search updates
    it from its bucket onwards until the values stop changing (usually at once)."""

    mirror: ValueState[dict[str, Any] | None] = ValueState("mirror")  # the query's model, as of the latest update received
    open: ValueState[dict[str, Any] | None] = ValueState("open")
    det: ValueState[dict[str, Any] | None] = ValueState("det")

    def __init__(self, settings: DetectorSettings = SPIKES, model: ModelSettings = ModelSettings()) -> None:
        self.settings = settings
        self.model_settings = model

    def process_record(self, ctx: Context, record: Record) -> None:
        if ctx.input_stream == "model":
            self._complete(ctx, record)
        else:
            self._search(ctx, record)

    # -- the open buckets -------------------------------------------------------------------------
    def _llr(self, entry: list[Any]) -> float:
        return self.settings.llr(entry[_COUNT], Prediction(entry[1], entry[2], entry[3], entry[4]))

    def _propagate(self, det: dict[str, Any], entries: list[list[Any]], index: int, force: bool) -> int | None:
        """Recompute the stored CUSUM from entry `index` on; stops where nothing changes. Returns the
        index of the first entry over the threshold, if any."""
        alarm = None
        threshold = self.settings.threshold
        previous = entries[index - 1][_CUSUM] if index > 0 else det["c"]
        for i in range(index, len(entries)):
            entry = entries[i]
            value = previous + self._llr(entry)
            value = value if value > 0.0 else 0.0
            if not force and abs(value - entry[_CUSUM]) < 1e-9:
                break
            force = False
            entry[_CUSUM] = value
            if value > threshold and alarm is None:
                alarm = i
            previous = value
        return alarm

    def _new_entries(self, ctx: Context, first: int, last: int) -> list[list[Any]]:
        mirror = ctx.state(self.mirror).get()
        return [[0, *predict(self.model_settings, mirror, start).to_list(), 0.0]
                for start in range(first, last + BUCKET_MS, BUCKET_MS)]

    def _search(self, ctx: Context, record: Record) -> None:
        det_handle = ctx.state(self.det)
        det = det_handle.get() or new_cusum()
        bucket = record.timestamp - record.timestamp % BUCKET_MS
        if ctx.is_late or (det["f"] is not None and bucket <= det["f"]):
            det["late"] += 1  # behind the watermark: its bucket may be complete already; drop it
            det_handle.set(det)
            return
        open_handle = ctx.state(self.open)
        opened = open_handle.get() or {"b0": None, "e": []}
        entries = opened["e"]
        if opened["b0"] is None or not entries:
            first = det["f"] + BUCKET_MS if det["f"] is not None else bucket
            opened["b0"], entries[:] = first, self._new_entries(ctx, first, bucket)
            touched = 0
        elif bucket < opened["b0"]:  # before the first open bucket (complete ones not caught up yet)
            entries[:0] = self._new_entries(ctx, bucket, opened["b0"] - BUCKET_MS)
            opened["b0"] = bucket
            touched = 0
        else:
            touched = (bucket - opened["b0"]) // BUCKET_MS
            if touched >= len(entries):  # open the seconds up to this one (zero counts so far)
                first_new = len(entries)
                entries.extend(self._new_entries(ctx, opened["b0"] + first_new * BUCKET_MS, bucket))
                touched = first_new
        index = (bucket - opened["b0"]) // BUCKET_MS
        entries[index][_COUNT] += 1
        alarm = self._propagate(det, entries, touched, force=True)
        if index != touched:
            later = self._propagate(det, entries, index, force=True)
            alarm = later if alarm is None else alarm
        if alarm is not None and det["ep"] is None:
            self._open_early(ctx, det, opened, alarm, record.timestamp)
        open_handle.set(opened)
        det_handle.set(det)

    def _open_early(self, ctx: Context, det: dict[str, Any], opened: dict[str, Any], alarm: int,
                    timestamp: int) -> None:
        entries = opened["e"]
        i, observed, expected = alarm, 0.0, 0.0
        while True:  # walk back to where this excursion of the CUSUM started
            observed += entries[i][_COUNT]
            expected += entries[i][1]
            if i == 0:  # reached the complete buckets: continue their excursion
                start = opened["b0"]
                if det["c"] > 0.0 and det["z"] is not None:
                    start, observed, expected = det["z"], observed + det["sc"], expected + det["sm"]
                break
            if entries[i - 1][_CUSUM] <= 0.0:
                start = opened["b0"] + i * BUCKET_MS
                break
            i -= 1
        det["n"] += 1
        det["ep"] = ep = {"n": det["n"], "start": start, "end": opened["b0"] + (alarm + 1) * BUCKET_MS,
                          "cmax": entries[alarm][_CUSUM], "sc": observed, "sm": expected,
                          "final": False, "early": True}
        ctx.produce(Record(ctx.key, anomaly_value(ctx.key, self.settings, "open", ep, ctx.low_watermark),
                           timestamp), "anomalies")

    # -- complete buckets ---------------------------------------------------------------------------
    def _complete(self, ctx: Context, record: Record) -> None:
        value = record.value
        open_handle = ctx.state(self.open)
        opened = open_handle.get()
        refresh = False
        if value.get("update"):
            mirror_handle = ctx.state(self.mirror)
            mirror = mirror_handle.get() or empty_model(self.model_settings.bins)
            apply_update(mirror, value["update"])
            mirror_handle.set(mirror)
            entries = opened["e"] if opened else None
            if (opened and entries and not entries[-1][3] and predict(
                    self.model_settings, mirror, opened["b0"] + (len(entries) - 1) * BUCKET_MS).ready):
                # Open buckets predicted before the model was ready, which it now is: predict again.
                for i, entry in enumerate(entries):
                    entry[1:5] = predict(self.model_settings, mirror, opened["b0"] + i * BUCKET_MS).to_list()
                refresh = True
        det_handle = ctx.state(self.det)
        det = det_handle.get() or new_cusum()
        start = int(value["start"])
        if det["f"] is not None and start <= det["f"]:
            return  # complete already (cannot happen: windows of a query come in order)
        if opened is not None and opened["b0"] is not None and opened["b0"] <= start:
            del opened["e"][:(start - opened["b0"]) // BUCKET_MS + 1]
            opened["b0"] = start + BUCKET_MS if opened["e"] else None
        pred = _prediction_of(value)
        for status, ep in cusum_step(self.settings, det, start, value["count"], pred):
            if status == "open" and ep.get("early"):
                continue
            ctx.produce(Record(ctx.key, anomaly_value(ctx.key, self.settings, status, ep, ctx.low_watermark),
                               record.timestamp), "anomalies")
        if opened is not None and opened["e"] and opened["b0"] == start + BUCKET_MS:
            alarm = self._propagate(det, opened["e"], 0, force=refresh)
            if alarm is not None and det["ep"] is None:
                self._open_early(ctx, det, opened, alarm, record.timestamp)
        if opened is not None:
            open_handle.set(opened)
        det_handle.set(det)
