"""Run the benchmark suite: `python -m bench [--quick] [--only NAME ...]` (or `python bench/run.py`).

Each benchmark runs in a fresh Python process (its own Spark session; scaling and state start further
processes of their own) and writes bench/results/<name>.json; this script then prints one table with
the targets of issue 9 and whether each is met, and writes bench/results/summary.json. --quick runs
small sizes as a sanity check (numbers from it mean little); the full run is the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import RESULTS_DIR, machine  # noqa: E402

BENCHMARKS = ["core", "throughput", "scaling", "timeline", "state", "rescale", "latency", "wmlag", "recovery", "tune"]
FULL_ONLY = {"tune"}


def run(name: str, quick: bool) -> dict:
    out = os.path.join(RESULTS_DIR, f"{name}.json")
    if os.path.exists(out):
        os.remove(out)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", f"bench.{name}", "--out", out] + (["--quick"] if quick else [])
    started = time.time()
    print(f"== {name} ...", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("["):
            print("   " + line, flush=True)
    if proc.returncode != 0 or not os.path.exists(out):
        print(proc.stderr[-3000:], file=sys.stderr)
        return {"benchmark": name, "error": proc.stderr[-3000:], "elapsed_s": round(time.time() - started, 1)}
    with open(out) as f:
        return json.load(f)


def _n(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) else str(value)


def _failure(stderr: str) -> str:
    """The line of a benchmark's stderr that says what failed: its last error or exception line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line or "Exception" in line]
    return ((named or lines or ["?"])[-1])[:200].replace("|", "/")


def table(results: dict[str, dict]) -> str:
    lines = ["| benchmark | measurement | value | target | verdict |", "|---|---|---|---|---|"]

    def add(bench: str, what: str, value: str, target: str = "", ok: bool | None = None) -> None:
        verdict = "" if ok is None else ("met" if ok else "MISSED")
        lines.append(f"| {bench} | {what} | {value} | {target} | {verdict} |")

    for name, result in results.items():
        if "error" in result:
            add(name, "failed", _failure(result["error"]), "", False)

    core = results.get("core", {})
    if "core_records_per_s" in core:
        add("core", f"offline core, one core, {core['keys']:,} keys: records/s (plain CPython timer heap: "
            f"{_n(core['plain_records_per_s'])})", _n(core["core_records_per_s"]), ">= 150,000",
            core["core_records_per_s"] >= 150_000)
        if "batch_hook_records_per_s" in core:
            add("core", "the same through the per-key batch hook (process_records): records/s",
                _n(core["batch_hook_records_per_s"]))
        if "user_code_alone_records_per_s" in core:
            add("core", "the Windower's own code alone, thin context (no framework): records/s; core / that",
                f"{_n(core['user_code_alone_records_per_s'])}; {core['core_vs_user_code_alone']}")

    row = results.get("throughput", {}).get("result")
    if row:
        ms, base = row["millstream"], row["baseline"]
        add("throughput", f"Windower {row['keys']:,} keys, {row['records']:,} records, local[2]: millstream "
            "records/s end to end", _n(ms["records_per_s"]), ">= 80,000", ms["records_per_s"] >= 80_000)
        add("throughput", "millstream / hand-written transformWithState (same run)",
            f"{_n(ms['records_per_s'])} / {_n(base['records_per_s'])} = {row['ratio']}x", ">= 3x", row["ratio"] >= 3)
        add("throughput", "identical output (both = exact answer)", str(row["identical_output"]), "True",
            row["identical_output"])

    sc = results.get("scaling", {})
    if sc.get("runs"):
        rounds = sc.get("speedup_by_round", {})
        last = {r["config"]: r for r in sc["runs"]}
        for label, key, a, b in (("local[2] / local[1]", "local", "local1", "local2"),
                                 ("standalone, 2 workers / 1 worker", "cluster", "cluster1", "cluster2")):
            speedup = sc["speedup"].get(key)
            if key in rounds:  # rounds of the four configurations: each round's ratio, and their median
                value = "rounds " + ", ".join(f"{x}x" if x else "n/a" for x in rounds[key]) + "; median " + \
                    (f"{speedup}x" if speedup else "n/a")
            else:
                rates = " / ".join(_n(last.get(c, {}).get("records_per_s", "error")) for c in (b, a))
                value = f"{rates} = " + (f"{speedup}x" if speedup else "n/a")
            add("scaling", f"speed-up {label} (records/s)", value, ">= 1.7x", None if speedup is None else speedup >= 1.7)
        for r in sc["runs"]:
            config = r["config"] + (f", round {r['round'] + 1}" if "round" in r else "")
            if "error" in r:
                add("scaling", f"{config}: failed", _failure(r["error"]), "", False)
            if "driver_share" not in r:
                continue
            low, high = r["driver_share"], r["driver_share_max"]
            if r["config"].startswith("cluster"):
                add("scaling", f"{config}: driver CPU share (driver Python + its JVM + its planners)",
                    f"{low:.1%}", "< 15%", low < 0.15)
            else:
                ok = True if high < 0.15 else (False if low >= 0.15 else None)
                add("scaling", f"{config}: driver CPU share (shared JVM split by thread; GC/JIT as driver's "
                    "in the upper bound)", f"{low:.1%} - {high:.1%}", "< 15%", ok)
            if r.get("cores_busy") is not None:
                add("scaling", f"{config}: records/s; cores busy over the timed run; CPU per record, all processes",
                    f"{_n(r['records_per_s'])}; {r['cores_busy']} of {r['parallelism']}; {r['cpu_us_per_record']} us")
            add("scaling", f"{config}: output = exact answer", str(r.get("matches_expected")), "True",
                r.get("matches_expected"))

    st = results.get("state", {})
    large, small = st.get("large", {}), st.get("small", {})
    if "state_after_horizon" in large:
        s = large["state_after_horizon"]
        add("state", f"{large['keys']:,} keys, 1% per batch, 1 h event time: state bytes written / changed "
            f"(amortized, {s['batches']} batches past the dedup horizon, {s['compaction_batches']} compacting)",
            f"{s['written_over_changed']}x (per batch p50 {s['per_batch_p50']}x, max {s['per_batch_max']}x)", "<= 3x",
            s["written_over_changed"] is not None and s["written_over_changed"] <= 3)
        add("state", "RocksDB's own bytes written / changed bytes (same batches)",
            f"{large['rocksdb_over_changed_after_horizon']}x")
        if "records_per_s" in small:
            add("state", f"throughput {large['keys']:,} keys / {small['keys']:,} keys (same input)",
                f"{_n(large['records_per_s'])} / {_n(small['records_per_s'])} = {st['throughput_ratio']}x",
                ">= 0.8x", st["throughput_ratio"] >= 0.8)
        quarters = large["rss_mb_by_quarter"]
        add("state", "RSS of the process tree over the steady phase, by quarter (MB)",
            " / ".join(_n(q.get("total")) for q in quarters) + f" (q4/q2 = {large['rss_growth_q4_over_q2']})",
            "flat (q4/q2 <= 1.1)", large["memory_flat"])
        add("state", "checkpoint directory over the steady phase (MB); rest of the root",
            f"{large['checkpoint_mb']['steady_start']} -> {large['checkpoint_mb']['steady_end']} "
            f"({large['checkpoint_growth_kb_per_batch']} KB/batch); {large['root_other_mb']['steady_start']} -> "
            f"{large['root_other_mb']['steady_end']} ({large['root_other_growth_kb_per_batch']} KB/batch)")
        add("state", "output = plain-Python replay (both key counts)",
            f"{large['output_matches_expected']}, {small.get('output_matches_expected')}", "True",
            bool(large["output_matches_expected"] and small.get("output_matches_expected")))
    many = st.get("many_small_batches", {})
    if "state_after_horizon" in many:
        s = many["state_after_horizon"]
        label = f"{many['keys']:,} keys, {many['records_per_batch']} records per batch"
        add("state", f"{label}: state bytes written / changed ({s['batches']} batches past the dedup horizon)",
            f"{s['written_over_changed']}x", "<= 3x",
            s["written_over_changed"] is not None and s["written_over_changed"] <= 3)
        add("state", f"{label}: RocksDB's own bytes written / changed bytes (same batches)",
            f"{many['rocksdb_over_changed_after_horizon']}x")
        add("state", f"{label}: checkpoint directory over the steady phase (MB): start -> end; mean by quarter",
            f"{many['checkpoint_mb']['steady_start']} -> {many['checkpoint_mb']['steady_end']}; "
            + " / ".join(str(q) for q in many.get("checkpoint_mb_by_quarter", [])))
        add("state", f"{label}: output = plain-Python replay", str(many["output_matches_expected"]), "True",
            many["output_matches_expected"])
    elif "error" in many:
        add("state", "many small batches: failed", _failure(many["error"]), "", False)

    rs = results.get("rescale", {})
    if "identical_output_ids_included" in rs:
        add("rescale", f"{rs['keys']:,} keys, {rs['partitions_before']} -> {rs['partitions_after']} partitions "
            f"mid-run (after {rs['stopped_after_records']:,} of {rs['records']:,} records; rescale took "
            f"{rs['rescale_s']} s): output = unrescaled run's, ids included", str(rs["identical_output_ids_included"]),
            "True", rs["identical_output_ids_included"] and rs["matches_expected"] and rs["stopped_mid_run"])

    lat = results.get("latency", {})
    if lat.get("runs"):
        floor = lat["floor"]
        on, off = lat["exactly_once_on"], lat["exactly_once_off"]
        add("latency", "exactly-once on / off, p50 ms (paper: 33.7 / 3.6)", f"{on['p50_ms']} / {off['p50_ms']}")
        add("latency", "exactly-once on / off, p95 ms", f"{on['p95_ms']} / {off['p95_ms']}")
        add("latency", "Spark's floor (same query by hand) p50 / p95 ms", f"{floor['p50_ms']} / {floor['p95_ms']}")
        add("latency", "every record published exactly once (all runs)", str(all(r["records_once"] for r in lat["runs"])),
            "True", all(r["records_once"] for r in lat["runs"]))
        for r in lat.get("two_stage", []):
            add("latency", f"two stages, first {r['first_stage']}: p50 / p95 ms", f"{r['p50_ms']} / {r['p95_ms']}")

    for wm in results.get("wmlag", {}).get("variants", []):
        lag, trigger = wm["lag"], wm["trigger_ms"]
        add("wmlag", f"trigger {trigger} ms: lag p50 ms injector / s1 / s2 / s3",
            " / ".join(str(lag[s]["p50_ms"]) for s in ("injector", "s1", "s2", "s3")))
        for s in ("s2", "s3"):
            interval = wm["batch_interval_p50_ms"].get(s) or 0
            add("wmlag", f"trigger {trigger} ms: {s} adds (p50) vs its batch interval",
                f"{wm['increment_p50_ms'][s]} ms vs {interval} ms")

    rec = results.get("recovery", {})
    for n, r in enumerate(rec.get("rounds", [])):
        add("recovery", f"SIGKILL of the driver -> first new output (round {n + 1})",
            f"{r['kill_to_first_output_s']} s (session {r['restart_to_session_ready_s']} s)")
    if "exactly_once_prefix" in rec:
        add("recovery", "exactly-once over the kills", str(rec["exactly_once_prefix"]), "True", rec["exactly_once_prefix"])

    for item in results.get("tune", {}).get("results", []):
        cap = item["max_records_per_batch"]
        add("tune", f"key_groups={item['key_groups']} parallelism={item['parallelism']} "
            f"max_records_per_batch={f'{cap:,}' if cap else 'paced'}", f"{_n(item['records_per_s'])} rec/s")

    lines.append("")
    lines.append("elapsed: " + ", ".join(f"{name} {r.get('elapsed_s', '?')} s" for name, r in results.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser("bench")
    parser.add_argument("--quick", action="store_true", help="small sizes: a sanity run, not a measurement")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS)
    parser.add_argument("--report", action="store_true", help="only print the table of the last results")
    args = parser.parse_args()
    if args.report:
        found = {}
        for name in BENCHMARKS:
            path = os.path.join(RESULTS_DIR, f"{name}.json")
            if os.path.exists(path):
                with open(path) as f:
                    found[name] = json.load(f)
        print(table(found))
        return
    os.makedirs(RESULTS_DIR, exist_ok=True)
    started = time.time()
    load_before = os.getloadavg()
    names = args.only or [b for b in BENCHMARKS if not (args.quick and b in FULL_ONLY)]
    results = {name: run(name, args.quick) for name in names}
    summary = {"machine": machine(), "quick": args.quick, "elapsed_s": round(time.time() - started, 1),
               "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "table": table(results)}
    with open(os.path.join(RESULTS_DIR, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print()
    if args.quick:
        print("QUICK RUN: small sizes, a sanity check of the suite; the numbers are not measurements.\n")
    print(summary["table"])
    print(f"\nelapsed {summary['elapsed_s']} s, load average before {load_before}, after {summary['loadavg_after']}")


if __name__ == "__main__":
    main()
