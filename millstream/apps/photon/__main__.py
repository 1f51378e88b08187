"""python -m millstream.apps.photon: Photon's exactly-once join of clicks with queries, on Spark.

    python -m millstream.apps.photon                       # 2 pipelines, SQLite registry, one killed
    python -m millstream.apps.photon --registry postgresql://photon@db:5432/ids   # password: PGPASSWORD
    python -m millstream.apps.photon --never-restart       # the verifier repairs what the dead one left
    python -m millstream.apps.photon --fresh               # replace the previous run's data dir
    python -m millstream.apps.photon --small               # 16 s of traffic (a test runs this)

A query log and a click log are written live (clicks with a long-tailed delay, some queries logged
after their clicks, some never, some clicks logged twice); redundant pipelines, each its own Spark
driver, join them sharing one IdRegistry; one is SIGKILLed right after a registry commit and
restarted later (or never); the registry is resharded mid-run and garbage-collected at the end. The
report compares the union of the pipelines' outputs with the ground truth and gives the join latency.

Everything lives in --data-dir (default ./photon-data): logs/, one directory per pipeline (its
millstream root, EventStore, outputs, driver.log), registry.db (SQLite), report.json, report.html.
"""

from __future__ import annotations

import argparse
import os
import sys

from millstream.apps.photon.demo import DemoOptions, PhotonDemo
from millstream.apps.photon.generator import PhotonDataConfig
from millstream.apps.photon.report import format_report, write_html
from millstream.console.datadir import check_fresh_start, delete_for_fresh_start
from millstream.console.options import (OneLineArgumentParser, UsageError, check_master, check_writable_directory,
                                        non_negative_int, positive_float, positive_int, quiet_library_warnings)
from millstream.console.progress import ProgressDisplay
from millstream.console.running import run_command

PROG = "python -m millstream.apps.photon"
MARKER = "data.json"  # what makes a directory a Photon demo's data dir (--fresh deletes only those)
MIN_UNJOINABLE_AFTER_S = 12.0  # a query logged up to 6 s after its click, plus the longest retry wait


# Defaults of the options --small changes (a run of about a minute of traffic, for tests and a quick look).
FULL = {"seconds": 60.0, "qps": 30.0, "clicks_per_query": 0.4, "max_click_delay": 30.0, "restart_after": 15.0, "unjoinable_after": 20.0,
        "owner_timeout": 10.0}
SMALL = {"seconds": 16.0, "qps": 8.0, "clicks_per_query": 0.8, "max_click_delay": 6.0, "restart_after": 5.0,
         "unjoinable_after": MIN_UNJOINABLE_AFTER_S, "owner_timeout": 8.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = PhotonDataConfig()
    parser = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--small", action="store_true",
                        help="a short run: " + ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in SMALL.items())
                             + " (options given explicitly win)")
    parser.add_argument("--seconds", type=positive_float, default=None,
                        help="seconds of query traffic (clicks follow for up to --max-click-delay more; default 60)")
    parser.add_argument("--qps", type=positive_float, default=None, help="queries per second (default 30)")
    parser.add_argument("--clicks-per-query", type=float, default=None,
                        help=f"mean clicks per query, 0 to 2 (default {defaults.clicks_per_query:g})")
    parser.add_argument("--max-click-delay", type=positive_float, default=None,
                        help="longest click delay in seconds, the tail of the distribution (default 30)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the logs (default %(default)s)")
    parser.add_argument("--pipelines", type=positive_int, default=2, help="redundant pipelines, >= 2 (default 2)")
    parser.add_argument("--registry", default=None,
                        help="IdRegistry URL: sqlite:///PATH or postgresql://user@host:port/db (password in "
                             "PGPASSWORD, or in the URL: it is moved to the drivers' environment, never written "
                             "to a file); default: SQLite in the data dir")
    parser.add_argument("--registry-namespace", default="photon",
                        help="table prefix in a PostgreSQL registry (default %(default)s)")
    parser.add_argument("--kill-at", type=positive_float, default=None,
                        help="seconds into the traffic when the pipeline ahead (most clicks joined) dies right after its next "
                             "registry commit, before writing them "
                             "(default: 40%% of --seconds)")
    parser.add_argument("--no-kill", action="store_true", help="kill nothing")
    parser.add_argument("--restart-after", type=positive_float, default=None,
                        help="seconds after its death when the killed pipeline is started again (default 15)")
    parser.add_argument("--never-restart", action="store_true",
                        help="leave the killed pipeline dead: the verifier repairs what it left")
    parser.add_argument("--reshard-to", type=non_negative_int, default=8,
                        help="reshard the registry to this many shards at 60%% of the traffic, 0: never (default 8)")
    parser.add_argument("--no-gc-demo", action="store_true",
                        help="skip the garbage collection of the registry and the replay of old clicks at the end")
    parser.add_argument("--lose-reply-every", type=non_negative_int, default=0,
                        help="fault: every N-th registry commit's reply is lost (the joiner retries with the same "
                             "token); 0: never (default)")
    parser.add_argument("--unjoinable-after", type=positive_float, default=None,
                        help=f"seconds of retries before a click is unjoinable, >= {MIN_UNJOINABLE_AFTER_S:g} "
                             "(default 20)")
    parser.add_argument("--owner-timeout", type=positive_float, default=None,
                        help="seconds without a heartbeat before the verifier takes a pipeline for gone (default 10)")
    parser.add_argument("--dispatch-shards", type=positive_int, default=8,
                        help="keys of each dispatcher: clicks of one shard share registry calls (default 8)")
    parser.add_argument("--master", default="local[1]",
                        help="Spark master of each pipeline (default %(default)s: two drivers share 2 cores)")
    parser.add_argument("--trigger-ms", type=positive_int, default=250,
                        help="micro-batch trigger interval of each pipeline (default %(default)s)")
    parser.add_argument("--data-dir", default="./photon-data", help="where everything is kept (default %(default)s)")
    parser.add_argument("--fresh", action="store_true",
                        help="delete the data dir of a previous run (and its PostgreSQL registry namespace) first")
    parser.add_argument("--timeout", type=positive_float, default=None, help="give up after this many seconds")
    args = parser.parse_args(argv)
    for name, value in (SMALL if args.small else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def registry_url(args: argparse.Namespace) -> str:
    return args.registry or "sqlite:///" + os.path.join(args.data_dir, "registry.db")


def validate(args: argparse.Namespace) -> PhotonDataConfig:
    """Every check that needs no change on disk, before anything is deleted, created or started."""
    if args.pipelines < 2:
        raise UsageError("argument --pipelines: Photon's redundancy needs at least 2 pipelines")
    if not 0 <= args.clicks_per_query <= 2:
        raise UsageError(f"argument --clicks-per-query: must be between 0 and 2, got {args.clicks_per_query:g}")
    if args.kill_at is not None and args.no_kill:
        raise UsageError("--kill-at and --no-kill contradict each other")
    if args.kill_at is not None and args.kill_at >= args.seconds:
        raise UsageError(f"argument --kill-at: must be within the traffic (< --seconds {args.seconds:g}), "
                         f"got {args.kill_at:g}")
    if args.unjoinable_after < MIN_UNJOINABLE_AFTER_S:
        raise UsageError(f"argument --unjoinable-after: must be >= {MIN_UNJOINABLE_AFTER_S:g} s (queries reach "
                         f"their log up to 6 s after their clicks), got {args.unjoinable_after:g}")
    if args.owner_timeout < 3:
        raise UsageError(f"argument --owner-timeout: must be >= 3 s (heartbeats come every second), "
                         f"got {args.owner_timeout:g}")
    args.data_dir = check_writable_directory(args.data_dir, "--data-dir")
    if args.fresh:
        check_fresh_start(args.data_dir, MARKER, "a Photon data dir")
    elif os.path.isdir(args.data_dir) and os.listdir(args.data_dir):
        what = "a previous Photon run" if os.path.exists(os.path.join(args.data_dir, MARKER)) else "other files"
        raise UsageError(f"--data-dir {args.data_dir} holds {what}; add --fresh to replace a previous run, or pick "
                         "another directory")
    check_registry(registry_url(args))
    check_earlier_registry(args)
    check_master(args.master)
    try:
        return PhotonDataConfig(seed=args.seed, seconds=args.seconds, queries_per_second=args.qps,
                                clicks_per_query=args.clicks_per_query,
                                max_click_delay_ms=int(args.max_click_delay * 1000))
    except ValueError as error:
        raise UsageError(str(error)) from None


def check_registry(url: str) -> None:
    """Refuse a registry URL of an unknown kind, and a PostgreSQL server we cannot log in to (the
    message never shows the password)."""
    if url.startswith("sqlite:///"):
        return
    if not url.startswith(("postgresql://", "postgres://")):
        scheme = url.split(":", 1)[0] if ":" in url else url
        raise UsageError(f"--registry: unsupported URL scheme {scheme!r}; use sqlite:///PATH or postgresql://...")
    import psycopg

    from millstream.photon.postgres_registry import redact_dsn

    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as error:
        reason = str(error).strip().splitlines()[-1].strip() if str(error).strip() else type(error).__name__
        from millstream.photon.credentials import without_password

        _, password = without_password(url)
        if password:
            reason = reason.replace(password, "***")
        raise UsageError(f"--registry {redact_dsn(url)}: cannot connect ({reason})") from None


def earlier_roots(url: str, namespace: str) -> list[str] | None:
    """The pipeline roots the PostgreSQL registry namespace `namespace` binds owner names to (an
    earlier run's), or None if the namespace holds no registry."""
    import psycopg

    with psycopg.connect(url, connect_timeout=5) as connection:
        found = connection.execute("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                                   (f'"{namespace}_meta"', f'"{namespace}_owner_roots"')).fetchone()
        registry, owner_roots = found or (False, False)
        if not registry:
            return None
        if not owner_roots:
            return []
        return [row[0] for row in connection.execute(f'SELECT location FROM "{namespace}_owner_roots"')]


def check_earlier_registry(args: argparse.Namespace) -> None:
    """Refuse a PostgreSQL namespace holding an earlier run's registry, before anything starts: its
    owner names belong to that run's roots (the drivers would refuse to start) and its ids to that
    run's clicks (the same seed's clicks would all be taken). --fresh replaces the earlier run of
    this data dir, registry included; a registry bound to roots elsewhere is never dropped."""
    url = registry_url(args)
    if url.startswith("sqlite:///"):
        return  # inside the data dir: --fresh deletes it, a new data dir has none
    roots = earlier_roots(url, args.registry_namespace)
    if roots is None:
        return
    from millstream.photon.postgres_registry import redact_dsn

    where = f"--registry-namespace {args.registry_namespace} on {redact_dsn(url)}"
    data_dir = os.path.realpath(args.data_dir)
    foreign = sorted({root for root in roots
                      if os.path.commonpath([data_dir, os.path.realpath(root)]) != data_dir})
    if foreign:
        raise UsageError(f"{where} holds the registry of pipelines on another data dir ({foreign[0]}); pick "
                         "another --registry-namespace, or drop its tables if that run is over")
    if not args.fresh:
        raise UsageError(f"{where} holds the registry of an earlier run; add --fresh (with that run's --data-dir) "
                         "to replace it, or pick another --registry-namespace")


def forget_earlier_registry(args: argparse.Namespace) -> None:
    """For --fresh: drop the earlier run's PostgreSQL registry (check_earlier_registry allowed it)."""
    url = registry_url(args)
    if url.startswith("sqlite:///") or earlier_roots(url, args.registry_namespace) is None:
        return
    from millstream.photon import PostgresRegistry

    registry = PostgresRegistry(url, namespace=args.registry_namespace)
    try:
        registry.drop()
    finally:
        registry.close()


def main(argv: list[str] | None = None) -> int:
    quiet_library_warnings()
    return run_command(lambda: _main(argv), PROG)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    data = validate(args)
    from millstream.photon.credentials import move_password_to_environment

    url = move_password_to_environment(registry_url(args))  # the drivers inherit PGPASSWORD
    if args.fresh:
        delete_for_fresh_start(args.data_dir, MARKER, "a Photon data dir")
        forget_earlier_registry(args)
    os.makedirs(args.data_dir, exist_ok=True)
    open(os.path.join(args.data_dir, MARKER), "w").close()  # replaced by the config once the traffic starts
    options = DemoOptions(
        data_dir=args.data_dir, registry_url=url,
        registry_options={} if url.startswith("sqlite") else {"namespace": args.registry_namespace},
        data=data, pipelines=args.pipelines,
        kill_at_s=None if args.no_kill else (args.kill_at if args.kill_at is not None else 0.4 * args.seconds),
        restart_after_s=None if args.never_restart else args.restart_after, reshard_to=args.reshard_to,
        gc_demo=not args.no_gc_demo, lose_reply_every=args.lose_reply_every,
        unjoinable_after_ms=int(args.unjoinable_after * 1000), owner_timeout_ms=int(args.owner_timeout * 1000),
        dispatch_shards=args.dispatch_shards, master=args.master, trigger_ms=args.trigger_ms, timeout_s=args.timeout)
    kill = ("no kill" if options.kill_at_s is None else
            f"the pipeline ahead at {options.kill_at_s:g} s dies right after its next registry commit, "
            + ("never restarted" if options.restart_after_s is None else f"restarted {options.restart_after_s:g} s later"))
    print(f"Photon: {args.pipelines} redundant pipelines on Spark ({args.master} each), registry "
          f"{url.split('://')[0]}; {args.seconds:g} s of traffic at {args.qps:g} queries/s; {kill}")
    print(f"data dir {args.data_dir}; drivers' logs in {os.path.join(args.data_dir, 'photon-*', 'driver.log')}",
          flush=True)
    display = ProgressDisplay(unit="clicks", waiting="starting Spark")
    report = PhotonDemo(options, display).run()
    print()
    for line in format_report(report):
        print(line)
    html = os.path.join(args.data_dir, "report.html")
    write_html(html, report, report["latencies_ms"])
    print(f"report: {html} (and report.json)")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
