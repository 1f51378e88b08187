"""IdRegistry throughput: ids committed per second with and without server-side batching.

    python -m bench.registry [--seconds 3] [--clients 1,8,64] [--backends sqlite,postgres] [--postgres DSN]

Each client is a thread that commits one new click id per call, like a joiner committing each click as
it joins it, for `--seconds`. "unbatched": every call is its own transaction on the backend.
"batched": the calls go through one BatchingRegistry, whose background thread commits whatever is
queued as one transaction. A last row per backend ("bulk") is one client committing 1000 ids per call:
what a single transaction per 1000 ids costs without any queueing. SQLite runs in a temporary file with
synchronous=FULL; PostgreSQL is a server of our own with its default durability settings (fsync and
synchronous_commit on), unless --postgres gives one. Prints a table and writes bench/results/registry.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import RESULTS_DIR, machine  # noqa: E402
from millstream.photon import BatchingRegistry, Claim, IdRegistry, PostgresRegistry, SqliteRegistry, Token  # noqa: E402
from millstream.photon.clock import wall_clock_ms  # noqa: E402
from millstream.photon.localpg import LocalPostgres  # noqa: E402


def measure(registry: IdRegistry, clients: int, seconds: float, ids_per_call: int = 1) -> dict[str, Any]:
    """Run `clients` threads committing fresh ids for `seconds`; ids/s over the common interval."""
    run = uuid.uuid4().hex[:8]
    counts = [0] * clients
    refused = [0] * clients
    ready = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client(k: int) -> None:
        token = Token(f"bench-{run}-{k}", "1")
        registry.commit_each([Claim(f"{run}-{k}-warmup", token, wall_clock_ms())])  # opens the connection
        ready.wait()
        n = 0
        while not stop.is_set():
            now_ms = wall_clock_ms()
            claims = [Claim(f"{run}-{k}-{n + j}", token, now_ms) for j in range(ids_per_call)]
            n += ids_per_call
            outcomes = registry.commit_each(claims)
            counts[k] += len(claims)
            refused[k] += sum(not outcome.committed for outcome in outcomes)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started  # includes the calls in flight when stop was set
    if sum(refused):
        raise AssertionError(f"{sum(refused)} fresh ids were not committed")
    return {"ids": sum(counts), "seconds": round(elapsed, 3), "ids_per_s": round(sum(counts) / elapsed)}


def bench_backend(name: str, open_backend: Callable[[], IdRegistry], clients: list[int],
                  seconds: float) -> list[dict[str, Any]]:
    rows = []
    for count in clients:
        backend = open_backend()
        unbatched = measure(backend, count, seconds)
        batcher = BatchingRegistry(backend)
        batched = measure(batcher, count, seconds)
        batcher.close()
        stats = batcher.stats()
        backend.close()
        rows.append({"backend": name, "clients": count, "unbatched": unbatched, "batched": batched,
                     "mean_batch": round(stats.mean_batch, 1), "largest_batch": stats.largest_batch})
        print(f"[{name}] {count} clients: {unbatched['ids_per_s']} ids/s unbatched, {batched['ids_per_s']} "
              f"ids/s batched (mean batch {stats.mean_batch:.1f})", flush=True)
    backend = open_backend()
    bulk = measure(backend, 1, seconds, ids_per_call=1000)
    backend.close()
    rows.append({"backend": name, "clients": "bulk", "unbatched": bulk, "batched": None,
                 "mean_batch": 1000, "largest_batch": 1000})
    print(f"[{name}] one client, 1000 ids per call: {bulk['ids_per_s']} ids/s", flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'backend':<10} {'clients':>7} {'unbatched ids/s':>16} {'batched ids/s':>14} {'speed-up':>9} "
             f"{'mean batch':>11}"]
    for row in rows:
        unbatched = row["unbatched"]["ids_per_s"]
        if row["batched"] is None:
            lines.append(f"{row['backend']:<10} {'bulk':>7} {unbatched:>16} {'(1000 ids per call, 1 client)':>37}")
            continue
        batched = row["batched"]["ids_per_s"]
        lines.append(f"{row['backend']:<10} {row['clients']:>7} {unbatched:>16} {batched:>14} "
                     f"{batched / max(unbatched, 1):>8.1f}x {row['mean_batch']:>11}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser("bench.registry", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    parser.add_argument("--clients", default="1,8,64")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--postgres", help="DSN of an existing server (default: start our own)")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "registry.json"))
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    rows: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}
    scratch = tempfile.mkdtemp(prefix="millstream-bench-registry-")

    if "sqlite" in args.backends:
        def open_sqlite() -> IdRegistry:
            return SqliteRegistry(os.path.join(scratch, f"{uuid.uuid4().hex}.db"), synchronous="FULL")

        rows += bench_backend("sqlite", open_sqlite, clients, args.seconds)
        settings["sqlite"] = "WAL, synchronous=FULL, file in " + tempfile.gettempdir()

    if "postgres" in args.backends:
        server = None
        dsn = args.postgres
        if dsn is None:
            server = LocalPostgres(settings={"max_connections": str(max(clients) + 20)}).start()
            dsn = server.dsn()
        namespaces: list[str] = []

        def open_postgres() -> IdRegistry:
            namespaces.append(f"bench_{uuid.uuid4().hex[:10]}")
            return PostgresRegistry(dsn, namespace=namespaces[-1])

        try:
            import psycopg

            with psycopg.connect(dsn) as connection:
                version = connection.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            rows += bench_backend("postgres", open_postgres, clients, args.seconds)
            settings["postgres"] = f"PostgreSQL {version} on 127.0.0.1, " + (
                "own server, default fsync/synchronous_commit" if server else "given server")
        finally:
            for namespace in namespaces:
                registry = PostgresRegistry(dsn, namespace=namespace)
                registry.drop()
                registry.close()
            if server is not None:
                server.stop()

    print()
    print(table(rows))
    result = {"benchmark": "registry", "machine": machine(), "seconds_per_cell": args.seconds,
              "settings": settings, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
