"""Photon end to end on Spark: the flagship command, `python -m millstream.apps.photon --small`, run as a
user runs it. Two redundant pipelines (each its own Spark driver process) share one IdRegistry; one is
SIGKILLed right after a registry commit, before it writes what it registered.

- on SQLite (the embedded default) the killed pipeline is restarted on its root: it re-runs the
  micro-batch it died in with the same tokens;
- on a PostgreSQL server of our own it stays dead, the verifier deletes what it registered and never
  wrote and re-injects those clicks; every commit's reply is sometimes lost on the way back
  (`--lose-reply-every`), and the joiners retry with the same token.

The ground truth is computed here from the log files on disk, in plain Python: a click is joinable if
its query id is in the query log, and then must be joined exactly once in the union of the pipelines'
outputs (read from their sink directories as plain files); otherwise it must be reported unjoinable
("not_found") exactly once. Nothing else may appear, except the old clicks the command replays after
the registry's garbage collection, which must be answered "expired" and never joined again.
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter, defaultdict

import pytest

from clitools import run

COMMAND = "millstream.apps.photon"
TIMEOUT_S = 1_500  # two Spark drivers starting at once, and a restart, on a shared 2-core machine


def read_jsonl(pattern: str) -> list[dict]:
    records = []
    for path in sorted(glob.glob(pattern)):
        with open(path, encoding="utf-8") as lines:
            records += [json.loads(line) for line in lines if line.strip()]
    return records


def ground_truth(data_dir: str) -> tuple[dict[str, dict], dict[str, dict], dict[str, dict]]:
    """(queries by id, first click record by click id that is joinable, ... that is not), from the logs."""
    queries = {r["key"]: r["value"] for r in read_jsonl(os.path.join(data_dir, "logs", "queries", "*.jsonl"))}
    joinable, unjoinable = {}, {}
    for record in read_jsonl(os.path.join(data_dir, "logs", "clicks", "*.jsonl")):
        (joinable if record["value"]["query_id"] in queries else unjoinable).setdefault(record["key"], record["value"])
    return queries, joinable, unjoinable


def outputs(data_dir: str, stream: str) -> list[dict]:
    return read_jsonl(os.path.join(data_dir, "photon-*", "out", stream, "*.jsonl"))


def check_exactly_once(data_dir: str) -> dict[str, int]:
    queries, joinable, unjoinable = ground_truth(data_dir)
    assert len(joinable) > 50 and unjoinable, "the generator made too few clicks to test anything"
    joined = outputs(data_dir, "joined")
    counts = Counter(r["key"] for r in joined)
    assert not [c for c, n in counts.items() if n > 1], "clicks joined more than once"
    assert set(counts) == set(joinable), (sorted(set(joinable) - set(counts))[:5], sorted(set(counts) - set(joinable))[:5])
    for record in joined:  # the adapter's projection of the right query and click
        click = joinable[record["key"]]
        query = queries[click["query_id"]]
        event = record["value"]["event"]
        assert record["value"]["query_id"] == click["query_id"]
        assert event["query"] == query["text"] and event["server"] == query["server"] and event["ad"] == click["ad"]
        assert event["cost_usd"] == click["cost_micros"] / 1_000_000

    reports = defaultdict(list)
    for record in outputs(data_dir, "unjoinable"):
        reports[record["value"]["reason"]].append(record["key"])
    not_found = Counter(reports.pop("not_found", []))
    assert set(not_found) == set(unjoinable) and set(not_found.values()) == {1}, not_found
    replayed = {r["key"] for r in read_jsonl(os.path.join(data_dir, "logs", "reinjected", "replayed-*.jsonl"))}
    expired = set(reports.pop("expired", []))
    assert replayed and expired == replayed and replayed <= set(joinable)  # answered expired, not joined again
    assert not reports, f"unexpected reasons: {dict(reports)}"
    return {"joined": len(counts), "unjoinable": len(not_found), "expired": len(expired)}


def fault_records(data_dir: str, owner: str) -> list[dict]:
    return read_jsonl(os.path.join(data_dir, owner, "faults.jsonl"))


def the_death(data_dir: str) -> tuple[str, set[str], str]:
    """(the pipeline that died right after a registry commit, the click ids it committed, the other)."""
    deaths = {owner: [f for f in fault_records(data_dir, owner) if f["fault"] == "die_after_commit"]
              for owner in ("photon-a", "photon-b")}
    died = [owner for owner, found in deaths.items() if found]
    assert len(died) == 1 and len(deaths[died[0]]) == 1, deaths
    committed = set(deaths[died[0]][0]["committed"])
    assert committed, "the pipeline was not killed right after committing click ids"
    return died[0], committed, ({"photon-a", "photon-b"} - {died[0]}).pop()


def joined_by(data_dir: str, owner: str) -> set[str]:
    return {r["key"] for r in read_jsonl(os.path.join(data_dir, owner, "out", "joined", "*.jsonl"))}


def check_report(data_dir: str, ran) -> dict:
    assert ran.code == 0, ran.output[-4000:]
    with open(os.path.join(data_dir, "report.json"), encoding="utf-8") as data:
        report = json.load(data)
    assert report["ok"] and ran.code == 0, ran.output[-3000:]
    latency = report["latency"]
    assert latency["count"] > 50 and 0 < latency["p50_s"] <= latency["p90_s"] <= latency["p99_s"]
    assert "join latency" in ran.stdout and "p90" in ran.stdout and "exactly once" in ran.stdout
    assert "registry resharded while running" in ran.stdout
    return report


def test_photon_command_on_sqlite_with_a_pipeline_killed_and_restarted(tmp_path):
    data_dir = str(tmp_path / "photon")
    ran = run(COMMAND, "--small", "--data-dir", data_dir, "--timeout", str(TIMEOUT_S - 60), timeout=TIMEOUT_S)
    report = check_report(data_dir, ran)
    victim, orphans, _ = the_death(data_dir)
    assert f"{victim} restarted on its root" in ran.stdout
    counts = check_exactly_once(data_dir)
    # The clicks the victim registered and died before writing: its restart re-ran that micro-batch
    # with the same tokens and wrote them (nobody else could: the registry says they are the victim's).
    assert orphans <= joined_by(data_dir, victim)
    assert not any(v["repaired"] for v in report["verifier"])
    assert counts["joined"] == report["check"]["joined_once"]


def test_photon_command_on_postgresql_with_a_pipeline_killed_for_good_and_lost_replies(tmp_path, monkeypatch):
    from millstream.photon.localpg import LocalPostgres, PostgresUnavailable

    try:
        server = LocalPostgres(settings={"fsync": "off"})
    except PostgresUnavailable as missing:
        pytest.skip(str(missing))
    data_dir = str(tmp_path / "photon")
    with server:
        dsn = server.dsn()
        from millstream.photon.credentials import without_password

        url, password = without_password(dsn)
        assert password
        monkeypatch.setenv("PGPASSWORD", password)
        ran = run(COMMAND, "--small", "--data-dir", data_dir, "--registry", url, "--never-restart",
                  "--lose-reply-every", "4", "--timeout", str(TIMEOUT_S - 60), timeout=TIMEOUT_S)
        report = check_report(data_dir, ran)
    victim, orphans, survivor = the_death(data_dir)
    counts = check_exactly_once(data_dir)
    # The victim never came back: the verifier gave its orphans back, and the survivor joined them.
    repaired = {c for v in report["verifier"] for c in v["repaired"]}
    assert orphans <= repaired
    reinjected = {r["key"] for r in read_jsonl(os.path.join(data_dir, "logs", "reinjected", "reinjected-*.jsonl"))}
    assert orphans <= reinjected
    assert orphans <= joined_by(data_dir, survivor) and not orphans & joined_by(data_dir, victim)
    # Lost replies happened on Spark and were retried with the same token, wasting nothing.
    lost = [f for p in ("photon-a", "photon-b") for f in fault_records(data_dir, p) if f["fault"] == "lose_reply"]
    assert lost and report["stats"]["commit_retries"] >= 1
    assert counts["joined"] == report["check"]["joined_once"]
    # The password went to the drivers through the environment, never into a file.
    for path in glob.glob(os.path.join(data_dir, "**", "*"), recursive=True):
        if os.path.isfile(path) and os.path.getsize(path) < 50_000_000:
            with open(path, "rb") as content:
                assert password.encode() not in content.read(), path
