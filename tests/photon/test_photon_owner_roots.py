"""An owner name belongs to one pipeline root for its whole life, on SQLite and on PostgreSQL
(`registry_target`).

A dispatch token is (owner, "<attempt>/<click record id>"), and a click log's record ids are the same on
every read. So a pipeline started again under its old owner name on a fresh root (its Spark checkpoint
and state lost) would be told COMMITTED (or RECLAIMED) for every click it had already joined and
published, and join them all again; two pipelines given one owner name at once would both join every
click. Both must be refused at start.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import replace

import pytest

from millstream.photon import OwnerOfAnotherRoot
from millstream.photon.registry import OwnerRoot
from millstream.photon.outputs import read_sink
from photon_pipelines import T0, HarnessPhoton, click, query


def union_of_joined(*pipelines: HarnessPhoton) -> Counter[str]:
    return Counter(r.key for p in pipelines for r in read_sink(p.layout.joined_dir))


def test_a_pipeline_on_a_fresh_root_under_an_owner_name_in_use_is_refused(tmp_path, registry_target):
    base = str(tmp_path)
    url, options = registry_target.url, registry_target.options
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(5)]
    clicks = [click(f"c-{n}", queries[n], T0 + n) for n in range(5)]
    a = HarnessPhoton(base, "photon-a", url, options)
    a.feed("queries", queries)
    a.feed("clicks", clicks)
    assert union_of_joined(a) == Counter({c.key: 1 for c in clicks})

    # Started again on the same root: allowed (a crash and restart re-runs what Spark never committed).
    again = HarnessPhoton(base, "photon-a", url, options)
    again.feed("queries", queries)

    # The root is lost (its checkpoint and state with it) and the pipeline starts on a fresh one.
    shutil.rmtree(a.layout.run_root, ignore_errors=True)
    with pytest.raises(RuntimeError, match="owner 'photon-a' belongs to root .*new owner name") as refused:
        HarnessPhoton(base, "photon-a", url, options)
    assert isinstance(refused.value, OwnerOfAnotherRoot) and len(str(refused.value).splitlines()) == 1
    assert union_of_joined(a) == Counter({c.key: 1 for c in clicks})

    # A new owner name on a fresh root is the way: it skips what photon-a joined.
    c = HarnessPhoton(base, "photon-c", url, options)
    c.feed("queries", queries)
    c.feed("clicks", clicks)
    assert c.joined() == [] and c.stats().skipped == len(clicks)


def test_a_second_pipeline_under_the_same_owner_name_on_another_root_is_refused(tmp_path, registry_target):
    base = str(tmp_path)
    url, options = registry_target.url, registry_target.options
    HarnessPhoton(os.path.join(base, "dc1"), "photon", url, options)
    with pytest.raises(RuntimeError, match="owner 'photon' belongs to root .*new owner name"):
        HarnessPhoton(os.path.join(base, "dc2"), "photon", url, options)


def test_the_driver_refuses_an_owner_name_of_another_root_in_one_line_before_spark(tmp_path, registry_target,
                                                                                  monkeypatch, capsys):
    import millstream.spark.runner
    from millstream.photon import driver

    class NoSpark:
        def __init__(self, *args, **kwargs):
            raise AssertionError("Spark must not start for a refused owner name")

    monkeypatch.setattr(millstream.spark.runner, "SparkRunner", NoSpark)
    base = str(tmp_path)
    running = HarnessPhoton(os.path.join(base, "dc1"), "photon", registry_target.url, registry_target.options)
    spec_path = os.path.join(base, "dc2-photon.json")
    replace(running.spec, directory=os.path.join(base, "dc2", "photon")).save(spec_path)
    assert driver.main([spec_path]) == driver.EXIT_REFUSED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "owner 'photon' belongs to root" in err[0] and "new owner name" in err[0], err


def test_of_many_first_binds_of_one_owner_name_at_once_exactly_one_root_wins(registry_target):
    import threading

    roots = [OwnerRoot(f"root-{n}", f"/data/dc{n}/run") for n in range(8)]
    start = threading.Barrier(len(roots))
    answers: dict[str, OwnerRoot] = {}

    def bind(root: OwnerRoot) -> None:
        with registry_target.open() as registry:  # a client (connection) of its own
            start.wait()
            answers[root.root_id] = registry.bind_owner("photon", root)

    threads = [threading.Thread(target=bind, args=(root,)) for root in roots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = set(answers.values())
    assert len(answers) == len(roots) and len(winners) == 1 and winners <= set(roots)
    with registry_target.open() as registry:  # a binding never changes, reopened or not
        assert registry.bind_owner("photon", OwnerRoot("late", "/data/late/run")) in winners
        assert registry.bind_owner("photon-b", OwnerRoot("late", "/data/late/run")).root_id == "late"
