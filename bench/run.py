"""Run the benchmark suite: `python -m bench [--quick] [--only NAME ...]` (or `python bench/run.py`).

Each benchmark runs in a fresh Python process (its own Spark session) and writes
bench/results/<name>.json; this script then prints one table and writes bench/results/summary.json.
--quick takes ~5-8 minutes, the full run ~25 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import RESULTS_DIR, machine  # noqa: E402

BENCHMARKS = ["profile_step", "throughput", "latency", "wmlag", "growth", "recovery", "tune", "flavour"]
FULL_ONLY = {"tune", "flavour"}


def run(name: str, quick: bool) -> dict:
    out = os.path.join(RESULTS_DIR, f"{name}.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", f"bench.{name}", "--out", out] + (["--quick"] if quick else [])
    started = time.time()
    print(f"== {name} ...", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("["):
            print("   " + line, flush=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return {"benchmark": name, "error": proc.stderr[-3000:], "elapsed_s": round(time.time() - started, 1)}
    with open(out) as f:
        return json.load(f)


def table(results: dict[str, dict]) -> str:
    lines = ["| benchmark | measurement | value | target | verdict |", "|---|---|---|---|---|"]

    def add(bench: str, what: str, value: str, target: str = "", ok: bool | None = None) -> None:
        verdict = "" if ok is None else ("met" if ok else "MISSED")
        lines.append(f"| {bench} | {what} | {value} | {target} | {verdict} |")

    tp = results.get("throughput", {})
    for row in tp.get("results", []):
        k = row["keys"]
        target = ">= 4x" if k == 10_000 else ">= 0.9x"
        need = 4.0 if k == 10_000 else 0.9
        add("throughput", f"{k:,} keys: millstream / hand-written rec/s",
            f"{row['millstream']['records_per_s']:.0f} / {row['baseline']['records_per_s']:.0f} = {row['ratio']}x",
            target, row["ratio"] >= need)
        add("throughput", f"{k:,} keys: identical output", str(row["identical_output"]), "True",
            row["identical_output"])
    floor = results.get("latency", {}).get("floor")
    if floor:
        add("latency", "hand-written floor (same source, transformWithState, no millstream) p50/p95/p99 ms",
            f"{floor['p50_ms']} / {floor['p95_ms']} / {floor['p99_ms']}")
    for run_ in results.get("latency", {}).get("strong", []):
        tag = f"trigger {run_['trigger_ms']} ms, {run_['shards']} shards"
        add("latency", f"strong p50/p95/p99 ms ({tag})", f"{run_['p50_ms']} / {run_['p95_ms']} / {run_['p99_ms']}",
            "p50 < 500, p95 < 1000", run_["p50_ms"] < 500 and run_["p95_ms"] < 1000)
    for run_ in results.get("latency", {}).get("two_stage", []):
        add("latency", f"2 stages, first {run_['first_stage']}: p50/p95/p99 ms",
            f"{run_['p50_ms']} / {run_['p95_ms']} / {run_['p99_ms']}")
    for wm in results.get("wmlag", {}).get("variants", []):
        lag, trigger = wm["lag"], wm["trigger_ms"]
        add("wmlag", f"trigger {trigger} ms: lag p50 ms injector/s1/s2/s3",
            " / ".join(str(lag[s]["p50_ms"]) for s in ("injector", "s1", "s2", "s3")))
        for s in ("s2", "s3"):
            interval = wm["batch_interval_p50_ms"].get(s) or 0
            inc = wm["increment_p50_ms"][s]
            add("wmlag", f"trigger {trigger} ms: {s} adds (p50) vs its batch interval", f"{inc} ms vs {interval} ms",
                "<= 1 interval", inc <= interval)
    gr = results.get("growth", {})
    for item in gr.get("by_keys", []) + gr.get("by_input", []):
        if "error" in item:
            add("growth", f"{item['keys']} keys, {item['records']} records", "error")
            continue
        peak = item["peak_rss_mb"]
        add("growth", f"{item['keys']:,} keys, {item['records']:,} records",
            f"{item['records_per_s']:.0f} rec/s, peak RSS {peak['total']:.0f} MB "
            f"(JVM {peak['jvm']:.0f}, Python workers {peak['python_workers']:.0f})")
    rec = results.get("recovery", {})
    for n, r in enumerate(rec.get("rounds", [])):
        add("recovery", f"SIGKILL -> first new output (round {n + 1})",
            f"{r['kill_to_first_output_s']} s (session {r['restart_to_session_ready_s']} s)")
    if rec:
        add("recovery", "exactly-once over restarts", str(rec.get("exactly_once_prefix")), "True",
            rec.get("exactly_once_prefix"))
    for item in results.get("tune", {}).get("results", []):
        add("tune", f"shards={item['shards']} pages={item['pages_per_shard']} max/batch={item['max_records_per_batch']}",
            f"{item['records_per_s']:.0f} rec/s")
    for item in results.get("flavour", {}).get("results", []):
        add("flavour", f"{item['keys']:,} keys: Pandas / row-based rec/s",
            f"{item['pandas_records_per_s']:.0f} / {item['row_based_records_per_s']:.0f} = {item['pandas_over_row']}x"
            f" (identical output: {item['identical_output']})")
    prof = results.get("profile_step", {})
    if "unprofiled" in prof:
        add("profile", "ShardExecutor.step offline, 1e4 keys (rec/s)", str(prof["unprofiled"]["step_records_per_s"]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser("bench")
    parser.add_argument("--quick", action="store_true", help="~5-8 minute version")
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
    print(summary["table"])
    print(f"\nelapsed {summary['elapsed_s']} s, load average before {load_before}, after {summary['loadavg_after']}")


if __name__ == "__main__":
    main()
