"""The Photon flagship command without Spark: its refusals of bad input (one line, exit 2, nothing
created, no password shown) and its generator (deterministic, and as hard as promised: long-tailed
click delays, queries logged after their clicks, queries never logged, clicks logged twice), checked
from the records in plain Python. The end-to-end runs are in tests/spark/test_photon_spark.py."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from clitools import assert_refused, run  # noqa: E402
from millstream.apps.photon.generator import PhotonDataConfig, generate, window_files  # noqa: E402

COMMAND = "millstream.apps.photon"


@pytest.mark.parametrize("args, phrase", [
    (["--pipelines", "1"], "--pipelines"),
    (["--registry", "mysql://db/x"], "unsupported URL scheme"),
    (["--kill-at", "99", "--seconds", "10"], "--kill-at"),
    (["--kill-at", "3", "--no-kill"], "contradict"),
    (["--unjoinable-after", "2"], "--unjoinable-after"),
    (["--owner-timeout", "1"], "--owner-timeout"),
    (["--clicks-per-query", "3"], "--clicks-per-query"),
    (["--qps", "-1"], "--qps"),
    (["--master", "loacl[2]"], "--master"),
])
def test_bad_options_are_refused_in_one_line_before_anything_is_created(tmp_path, args, phrase):
    data_dir = tmp_path / "photon"
    ran = run(COMMAND, "--small", "--data-dir", str(data_dir), *args)
    assert_refused(ran, phrase)
    assert not data_dir.exists()


def test_an_unreachable_postgresql_registry_is_refused_without_showing_its_password(tmp_path):
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data_dir = tmp_path / "photon"
    ran = run(COMMAND, "--data-dir", str(data_dir), "--registry", f"postgresql://photon:hunter2@127.0.0.1:{port}/ids")
    line = assert_refused(ran, "--registry", "cannot connect", f"127.0.0.1:{port}")
    assert "hunter2" not in ran.output and "photon@" in line
    assert not data_dir.exists()


def test_a_data_dir_holding_other_files_is_refused_and_left_alone(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    ran = run(COMMAND, "--small", "--data-dir", str(tmp_path))
    assert_refused(ran, "other files")
    ran = run(COMMAND, "--small", "--data-dir", str(tmp_path), "--fresh")
    assert ran.code == 2 and (tmp_path / "mine.txt").read_text() == "keep me"


CONFIG = PhotonDataConfig(seed=11, seconds=120, queries_per_second=30, start_ms=1_700_000_000_000)


def test_the_generator_is_deterministic_and_another_seed_gives_other_logs():
    assert generate(CONFIG) == generate(CONFIG)
    other = generate(PhotonDataConfig(**{**CONFIG.to_json(), "seed": 12}))
    assert [c.key for c in other.clicks] != [c.key for c in generate(CONFIG).clicks]


def test_the_generated_logs_are_as_hard_as_the_config_says():
    data = generate(CONFIG)
    queries = {q.key: q for q in data.queries}
    assert len(data.queries) == 120 * 30 and len(set(queries)) == len(data.queries)  # unique query ids
    first_click: dict[str, int] = {}
    delays, copies = [], {}
    for c in data.clicks:
        query = queries[c.value["query_id"]]
        copies.setdefault(c.key, []).append(c)
        first_click[query.key] = min(first_click.get(query.key, c.timestamp), c.timestamp)
        assert c.timestamp > query.timestamp and c.logged_at_ms >= c.timestamp
    for key, records in copies.items():
        assert len({r.id for r in records}) == len(records)  # a duplicate is another record of the same click
        delays.append(records[0].timestamp - queries[records[0].value["query_id"]].timestamp)
    clicked = {c.value["query_id"] for c in data.clicks}
    n = len(clicked)
    late = [q for q in clicked if queries[q].logged_at_ms is not None and queries[q].logged_at_ms > first_click[q]]
    lost = [q for q in clicked if queries[q].logged_at_ms is None]
    duplicated = [k for k, records in copies.items() if len(records) == 2]
    assert 0.02 * n < len(late) < 0.09 * n and 0.01 * n < len(lost) < 0.06 * n
    assert 0.01 * len(copies) < len(duplicated) < 0.06 * len(copies)
    assert all(len(records) <= 2 for records in copies.values())
    assert not [q for q in data.queries if q.key not in clicked and q.logged_at_ms is None]  # only clicked ones get lost
    delays.sort()
    median, p99 = delays[len(delays) // 2], delays[int(0.99 * len(delays))]
    assert 1_000 < median < 2_200 and p99 > 8 * median  # a long tail
    assert max(delays) <= CONFIG.max_click_delay_ms


def test_every_logged_record_lands_in_exactly_one_window_file_of_its_logging_time():
    config = PhotonDataConfig(seed=3, seconds=20, queries_per_second=10, start_ms=1_700_000_000_000)
    data = generate(config)
    windows = window_files(data.clicks, config, "clicks")
    placed = [(start, r) for start, records in windows.items() for r in records]
    assert sorted(r.id for _, r in placed) == sorted(c.id for c in data.clicks)
    assert all(start <= r.logged_at_ms < start + config.file_every_ms for start, r in placed)


def write_sink_file(directory: str, name: str, records: list[dict]) -> None:
    """A delivered JSON-lines sink file, as a pipeline's sink delivery leaves it (written, then renamed in)."""
    import json

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "." + name), "w", encoding="utf-8") as out:
        out.writelines(json.dumps(record) + "\n" for record in records)
    os.replace(os.path.join(directory, "." + name), os.path.join(directory, name))


def test_the_demo_forgets_old_ids_only_once_no_live_pipeline_holds_a_click_for_a_retry(tmp_path, monkeypatch):
    """A pipeline restarted late can still hold a click for a retry that the other pipeline already
    decided; had the registry forgotten that click's id first, the retry would answer it "expired"
    as well (a full-suite run once saw exactly that). The demo's GC waits for the clicks in flight."""
    import glob
    import json
    import threading
    import time

    from millstream.apps.photon.demo import DemoOptions, Driver, PhotonDemo
    from millstream.photon.registry import GcResult

    data = PhotonDataConfig(seconds=8, start_ms=1_700_000_000_000)
    demo = PhotonDemo(DemoOptions(data_dir=str(tmp_path), registry_url="sqlite:///unused", registry_options={},
                                  data=data), display=None)
    monkeypatch.setattr(Driver, "alive", property(lambda self: True))
    monkeypatch.setattr(demo, "_update", lambda: [view.poll() for view in demo.views])
    demo.data = generate(data)
    boundary = data.start_ms + 2_000
    old = [c for c in demo.data.clicks if c.timestamp < boundary]
    assert old, "the generator made no click in the first quarter"
    a, b = (str(tmp_path / owner / "out") for owner in ("photon-a", "photon-b"))
    write_sink_file(os.path.join(a, "joined"), "dispatcher-000000000003-0.jsonl",
                    [{"id": f"j{i}", "key": c.key, "timestamp": c.timestamp, "value": {}} for i, c in enumerate(old)])
    stats = os.path.join(b, "stats")
    write_sink_file(stats, "dispatcher-000000000005-0.jsonl",
                    [{"id": "s1", "key": "shard-4", "timestamp": 1, "value": {"pending": 1}},
                     {"id": "s2", "key": "shard-2", "timestamp": 1, "value": {"pending": 0}}])

    def b_holds_a_click() -> bool:  # read from the files, apart from the demo's view
        latest = {}
        for path in sorted(glob.glob(os.path.join(stats, "*.jsonl"))):
            with open(path, encoding="utf-8") as lines:
                latest.update((r["key"], r["value"]["pending"]) for r in map(json.loads, lines))
        return any(latest.values())

    class Registry:
        held_at_gc: list[bool] = []

        def gc(self, older_than_ms: int) -> GcResult:
            self.held_at_gc.append(b_holds_a_click())
            return GcResult(older_than_ms, 0)

    def pipelines() -> None:  # b's retry decides its click; then both pipelines answer the replays
        time.sleep(1.5)
        write_sink_file(stats, "dispatcher-000000000007-0.jsonl",
                        [{"id": "s3", "key": "shard-4", "timestamp": 1, "value": {"pending": 0}}])
        reinjected = os.path.join(str(tmp_path), "logs", "reinjected")
        while not glob.glob(os.path.join(reinjected, "replayed-*.jsonl")):
            time.sleep(0.1)
        for path in glob.glob(os.path.join(reinjected, "replayed-*.jsonl")):
            with open(path, encoding="utf-8") as lines:
                keys = [json.loads(line)["key"] for line in lines]
        for out in (a, b):
            write_sink_file(os.path.join(out, "unjoinable"), "dispatcher-000000000008-0.jsonl",
                            [{"id": f"u{i}", "key": k, "timestamp": 1, "value": {"reason": "expired"}}
                             for i, k in enumerate(keys)])

    os.makedirs(os.path.join(str(tmp_path), "logs", "reinjected"))
    thread = threading.Thread(target=pipelines, daemon=True)
    thread.start()
    gc = demo._gc_demo(Registry())
    thread.join(timeout=30)
    assert Registry.held_at_gc == [False]
    assert set(gc["replayed"]) == {c.key for c in old}


def test_a_postgresql_namespace_of_an_earlier_run_is_refused_up_front_or_replaced_with_fresh(tmp_path, postgres_server):
    """A second demo run on a kept PostgreSQL namespace started Spark, and its drivers then refused
    (their owner names belonged to the first run's roots, exit 3), or joined nothing (the same seed's
    clicks registered already). Now the command refuses in one line before anything starts, and
    --fresh replaces the earlier run's registry along with its data dir; a namespace bound to roots
    outside the data dir is never dropped."""
    from millstream.apps.photon.__main__ import forget_earlier_registry, parse_args, validate
    from millstream.console.options import UsageError
    from millstream.photon import OwnerRoot, PostgresRegistry

    namespace = "t_demo_again"
    data_dir = tmp_path / "photon"
    earlier = PostgresRegistry(postgres_server.dsn(), namespace=namespace)
    earlier.bind_owner("photon-a", OwnerRoot("r1", str(data_dir / "photon-a" / "root")))
    earlier.close()
    data_dir.mkdir()
    (data_dir / "data.json").write_text("{}")  # the earlier run's data dir, as the demo marks it
    flags = ["--data-dir", str(data_dir), "--registry", postgres_server.dsn(), "--registry-namespace", namespace]

    with pytest.raises(UsageError, match="--registry-namespace t_demo_again .*another data dir"):
        validate(parse_args(["--data-dir", str(tmp_path / "another"), *flags[2:]]))
    (data_dir / "data.json").unlink()
    data_dir.rmdir()  # the earlier run's data dir deleted by hand, its registry kept
    with pytest.raises(UsageError, match="--registry-namespace t_demo_again .*earlier run.*--fresh"):
        validate(parse_args(flags))

    args = parse_args([*flags, "--fresh"])
    validate(args)  # the earlier run's own registry: --fresh may replace it
    forget_earlier_registry(args)
    with PostgresRegistry(postgres_server.dsn(), namespace=namespace) as again:
        assert again.bind_owner("photon-a", OwnerRoot("r2", "/new")).root_id == "r2"  # forgotten: bound anew
        again.bind_owner("photon-x", OwnerRoot("r3", str(tmp_path / "someone-else")))
    with pytest.raises(UsageError, match="another data dir"):
        validate(parse_args([*flags, "--fresh"]))
    with PostgresRegistry(postgres_server.dsn(), namespace=namespace) as kept:
        assert kept.bind_owner("photon-x", OwnerRoot("r4", "/x")).root_id == "r3"  # not dropped
        kept.drop()
