"""`python -m millstream.chaos`: kill a running pipeline again and again, then check its output.

Runs the chaos pipeline (pipeline.py: two senders into an order-sensitive ledger, a computation that is
not deterministic, wall-time and low-watermark timers, JSON-lines sinks, one of them a user's writer
that falls batches behind) on local Spark and SIGKILLs
the driver's whole process group (driver, JVM, Python workers) `--kills` times: some at random
moments, the others exactly between two commits (after a batch is staged and before Spark commits it,
after Spark's commit and before the publication, after the publication and before the sinks, after a
sink and before its progress is recorded). Each time it starts the same command again, which resumes
from the checkpoint. At the end it compares everything published, and what reached the sinks, with a
ground truth computed in plain Python, and prints what was lost, duplicated or altered (all must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from millstream.chaos.pipeline import ChaosSpec
from millstream.chaos.verify import verify
from millstream.spark.faults import POINTS

STARTUP_S = 25.0  # a driver's usual time to its first batch on a small machine


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m millstream.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="how many times to kill the driver (default %(default)s)")
    parser.add_argument("--events", type=int, default=6_000, help="records per injector (default %(default)s)")
    parser.add_argument("--accounts", type=int, default=30, help="keys of the ledger (default %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the data and of the kill schedule")
    parser.add_argument("--root", default=None, help="where to run (default: a temporary directory)")
    parser.add_argument("--report", default=None, help="write the result as JSON here")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--kill-at", action="append", default=None, metavar="POINT:N",
                        help="kill at these commit points instead of the random schedule (repeatable)")
    parser.add_argument("--lottery-exactly-once-off", action="store_true",
                        help="run the lottery with exactly_once=False, to see what the protocol prevents")
    args = parser.parse_args(argv)
    if args.kills < 0 or args.events < 1 or args.accounts < 1:
        parser.error("--kills must be >= 0, --events and --accounts >= 1")
    return args


def schedule(kills: int, rng: random.Random) -> list[str | float]:
    """The kills: a commit point ("point:n") or a random moment (seconds after start-up). Every
    point between two commits is hit at least once when there are enough kills."""
    plan: list[str | float] = []
    for index in range(kills):
        if index < len(POINTS) * 3 and index % 3 != 2:
            plan.append(f"{POINTS[index // 3 % len(POINTS)]}:{rng.randint(1, 3)}")
        else:
            plan.append(rng.uniform(2.0, 20.0))
    rng.shuffle(plan)
    return plan


def _kill(text: str) -> str | float:
    """A --kill-at value: seconds after start-up (a number) or a commit point."""
    try:
        return float(text)
    except ValueError:
        return text


def drive(args: argparse.Namespace, root: str, rate: float, kill: str | float | None, log: Any) -> int:
    """Run the driver once; kill it as told. Returns its exit code (negative: killed)."""
    command = [sys.executable, "-m", "millstream.chaos.driver", "--root", root, "--events", str(args.events),
               "--accounts", str(args.accounts), "--seed", str(args.seed), "--rate", str(rate),
               "--master", args.master] + (["--lottery-exactly-once-off"] if args.lottery_exactly_once_off else [])
    env = dict(os.environ)
    env.pop("MILLSTREAM_KILL_AT", None)
    if isinstance(kill, str):
        env["MILLSTREAM_KILL_AT"] = kill
    process = subprocess.Popen(command, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    if isinstance(kill, float):
        deadline = time.time() + STARTUP_S + kill
        while process.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    code = process.wait()
    if code != 0:
        try:  # what the driver left behind (the JVM is in its process group)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = args.root or tempfile.mkdtemp(prefix="millstream-chaos-")
    if os.path.exists(os.path.join(root, "run")):
        shutil.rmtree(os.path.join(root, "run"))
        shutil.rmtree(os.path.join(root, "sinks"), ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    rng = random.Random(args.seed)
    kills: list[str | float] = [_kill(k) for k in args.kill_at] if args.kill_at else schedule(args.kills, rng)
    # Paced so the input lasts longer than the kills and restarts take: every kill lands mid-run.
    rate = max(2.0, args.events / (max(1, len(kills)) * STARTUP_S * 1.5))
    print(f"chaos: {args.events} records per injector over ~{args.events / rate:.0f} s, {len(kills)} kills, "
          f"root {root}")
    outcomes = []
    started = time.time()
    with open(os.path.join(root, "drivers.log"), "a") as log:
        for number, kill in enumerate(kills, 1):
            t0 = time.time()
            code = drive(args, root, rate, kill, log)
            what = kill if isinstance(kill, str) else f"after {kill:.1f} s"
            outcome = "killed" if code == -signal.SIGKILL else ("finished" if code == 0 else f"exit {code}")
            outcomes.append({"kill": what, "outcome": outcome, "seconds": round(time.time() - t0, 1)})
            print(f"  run {number:2d}: kill {what:<14} -> {outcome} ({time.time() - t0:.0f} s)", flush=True)
            if code not in (0, -signal.SIGKILL):
                print(f"chaos: a driver failed; see {os.path.join(root, 'drivers.log')}")
                return 1
            if code == 0:
                break  # the input is over: nothing left to kill
        code = drive(args, root, rate, None, log)
        print(f"  final run: {'finished' if code == 0 else f'exit {code}'}", flush=True)
        if code != 0:
            print(f"chaos: the final run failed; see {os.path.join(root, 'drivers.log')}")
            return 1
    spec = ChaosSpec(events=args.events, accounts=args.accounts, seed=args.seed, records_per_second=rate)
    checks = verify(spec, root)
    print(f"\n{'check':<52} {'lost':>6} {'dup':>6} {'altered':>8}  consistency")
    for check in checks:
        print(f"{check.name:<52} {check.lost:>6} {check.duplicated:>6} {check.altered:>8}  "
              f"{'ok' if not check.broken else '; '.join(check.broken[:3])}")
    ok = all(c.ok for c in checks)
    killed = sum(1 for o in outcomes if o["outcome"] == "killed")
    print(f"\nchaos: {killed} kills in {time.time() - started:.0f} s; "
          f"{'0 lost, 0 duplicated, 0 altered' if ok else 'FAILED'}")
    if args.report:
        with open(args.report, "w") as out:
            json.dump({"kills": outcomes, "checks": [c.__dict__ | {"ok": c.ok} for c in checks], "ok": ok}, out,
                      indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
