"""An injector over a Kafka topic, read with the `confluent-kafka` client (librdkafka).

pyspark ships no Kafka connector, so the injector talks Kafka itself: install it with
`pip install 'millstream[kafka]'`. The client is imported only when an injector is built.

Partitions and offsets. Each Kafka partition of the topic is one injector partition, named by its
number ("0", "1", ...). The set is discovered when the injector is built (or given) and then frozen:
partitions added to the topic later are not read by that pipeline root. An injector offset is
`{"next": <Kafka offset of the next record to read>, "max_event_time": <int or None>}`, so the
checkpoint holds Kafka offsets and a replay reads exactly the same records: `read(p, start, end)`
assigns the partition, seeks to `start["next"]` and reads every record with an offset below
`end["next"]`. Offsets need not be contiguous (compaction, transaction markers): the read stops at
the first record at or past the end, or when the broker says the partition ends at or past it, never by
counting records. Record ids are `"{topic}:{partition}:{offset}"`, the same on every read. No consumer
group is joined and nothing is committed to Kafka: the pipeline's checkpoint is the only position.

`latest_offset` ends a read at the partition's high watermark offset, as the broker reports it for the
consumer's isolation level (librdkafka's default, read_committed), and at `max_records`.

Low watermark (the policy). Kafka makes no promise about the event times still to come, so the injector
cannot publish an honest watermark from the broker alone. It uses the bounded out-of-orderness
assumption of Flink's and Beam's Kafka sources, declared by the user: within a partition, no record
arrives more than `max_out_of_orderness_ms` behind the largest event time read before it. A partition's
low watermark is therefore (largest event time read so far in it) - max_out_of_orderness_ms; it is
BEGINNING_OF_TIME before anything was read, only moves forward, and never reaches END_OF_TIME (a topic
does not end). A record that breaks the bound is still delivered, as late. The injector's watermark is
the minimum over its partitions, so an idle partition holds the whole topic's watermark back.

The largest event time travels inside the offset (an injector's only state), and a runner computes the
watermark from an offset before the executors read its range, so `latest_offset` reads the event times
of the range it hands out: each record is fetched twice, once there (on the Spark driver) and once by
`read`. With `max_out_of_orderness_ms=None` the injector promises nothing, skips that scan, and its
watermark stays at BEGINNING_OF_TIME (for pipelines that use no low-watermark timers).

Malformed input. A message whose key, value or timestamp cannot be decoded is yielded as
`Malformed(position="topic:partition:offset", ...)`, never raised. A tombstone (null value) is a record
with value None, whatever the value format. A record with no Kafka timestamp (message format v0) is
malformed unless a `timestamp` function supplies one.

Credentials. Extra client settings (SASL, TLS) come from `config` or from environment variables
`MILLSTREAM_KAFKA_<SETTING>`, the librdkafka setting upper-cased with dots as underscores
(`MILLSTREAM_KAFKA_SASL_PASSWORD` is `sasl.password`); `config` wins where both set a value. The
environment is read in each process when it connects, so secrets given that way never enter the
injector object that Spark pickles to its workers (values in `config` do travel with it); the workers
need the same variables. `repr()` shows setting names only, and errors mask the values of settings
whose names look secret.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence, Union

from millstream.injectors import strict_json
from millstream.model.injector import Injector, Malformed, Offset
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record

ENV_PREFIX = "MILLSTREAM_KAFKA_"
# librdkafka requires a group id even for assign(); the injector never joins the group nor commits.
DEFAULT_GROUP_ID = "millstream-kafka-injector"
DEFAULT_MAX_RECORDS_PER_READ = 100_000

ValueFormat = Union[Literal["json", "str", "bytes"], Callable[[bytes], Any]]
KeyFormat = Union[Literal["str"], Callable[[Union[bytes, None]], str]]
StartingOffsets = Union[Literal["earliest", "latest"], Mapping[int, int]]

# Setting names whose values must never be shown (passwords, keys, tokens, JAAS/OAuth configs).
_SECRET_NAME = re.compile(r"password|secret|jaas|token|credential|oauthbearer\.config|key|\.pem", re.IGNORECASE)
# Settings the injector's reads depend on, applied over the user's: the end of a partition must be
# reported (a read stops there) and a seek to a deleted offset must fail, not jump silently.
_REQUIRED = {"enable.partition.eof": True, "auto.offset.reset": "error",
             "enable.auto.commit": False, "enable.auto.offset.store": False}


class KafkaInjectorError(RuntimeError):
    """The broker could not be reached or refused a request, or records the checkpoint points at are
    gone. Its message never contains the value of a secret setting."""


@dataclass(frozen=True)
class KafkaMessage:
    """One Kafka message with its key and value decoded: what a `timestamp` function receives."""

    topic: str
    partition: int
    offset: int
    key: str
    value: Any
    timestamp_ms: int | None
    """The message's Kafka timestamp (CreateTime or LogAppendTime), None if it has none."""
    headers: tuple[tuple[str, bytes | None], ...]


def _client() -> Any:
    try:
        import confluent_kafka
    except ImportError as error:
        raise ImportError("KafkaInjector needs the confluent-kafka client: pip install 'millstream[kafka]' "
                          "(or pip install confluent-kafka)") from error
    return confluent_kafka


def environment_config() -> dict[str, str]:
    """The client settings given as MILLSTREAM_KAFKA_* environment variables in this process."""
    return {name[len(ENV_PREFIX):].lower().replace("_", "."): value
            for name, value in os.environ.items() if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX)}


def mask_secrets(text: str, settings: Mapping[str, Any]) -> str:
    """`text` with the value of every secret-looking setting replaced by ***."""
    for name, value in settings.items():
        if _SECRET_NAME.search(name) and str(value):
            text = text.replace(str(value), "***")
    return text


class _ConsumerPool:
    """Consumers of this process, one set per connection configuration, lent one read at a time.

    A consumer is assigned one partition for the length of a read; lending it out exclusively lets two
    reads interleave (two generators, two threads) without stealing each other's assignment. Consumers
    live here, not on the injector, so the injector pickles without connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[tuple[str, str], ...], list[Any]] = {}
        self._all: list[Any] = []

    def forget_inherited(self) -> None:
        """In a forked child (Spark's Python workers fork from a daemon): the parent's consumers came
        without their librdkafka threads, so they are unusable, and destroying one waits for threads
        that are not there or crashes the child. They are set aside for good, never freed (freeing
        destroys), and the child starts with no consumers and a fresh lock (a parent thread may have
        held the old one at the fork)."""
        for consumer in self._all:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(consumer))  # survives even the interpreter's exit
        self._lock, self._idle, self._all = threading.Lock(), {}, []

    @contextlib.contextmanager
    def lend(self, settings: Mapping[str, Any]) -> Iterator[Any]:
        key = tuple(sorted((name, str(value)) for name, value in settings.items()))
        lent_in = os.getpid()  # a consumer lent before a fork stays out of the child's pool
        with self._lock:
            idle = self._idle.setdefault(key, [])
            consumer = idle.pop() if idle else None
        if consumer is None:
            client = _client()
            try:
                consumer = client.Consumer(dict(settings))
            except (client.KafkaException, ValueError, TypeError) as error:
                raise KafkaInjectorError(mask_secrets(f"cannot create a Kafka consumer: {error}", settings)) from None
            with self._lock:
                self._all.append(consumer)
        try:
            yield consumer
        finally:
            if os.getpid() == lent_in:  # else the parent's, inherited mid-read: set aside, never touched
                with contextlib.suppress(Exception):
                    consumer.unassign()  # stop its background fetching while it waits for the next read
                with self._lock:
                    self._idle.setdefault(key, []).append(consumer)

    def close_all(self) -> None:
        with self._lock:
            consumers, self._all, self._idle = self._all, [], {}
        for consumer in consumers:
            with contextlib.suppress(Exception):
                consumer.close()


_POOL = _ConsumerPool()
atexit.register(_POOL.close_all)
if hasattr(os, "register_at_fork"):  # POSIX; where there is no fork there is nothing to inherit
    os.register_at_fork(after_in_child=_POOL.forget_inherited)


class KafkaInjector(Injector):
    """Reads a Kafka topic, one injector partition per topic partition (see the module doc for the
    offsets, the watermark policy and where credentials come from).

    Example (needs a reachable broker, so it is not a doctest)::

        from millstream import KafkaInjector, Pipeline
        # Event time from the JSON value's "ts"; a click arrives at most 5 s behind a later one.
        clicks = KafkaInjector("clicks", "broker-1:9092", max_out_of_orderness_ms=5_000,
                               timestamp=lambda message: message.value["ts"])
        pipeline = (Pipeline("clicks-per-user")
                    .add_injector("clicks", clicks, "clicks")
                    .add_computation("count", CountPerUser(), {"clicks": lambda r: r.value["user"]}))

    Arguments:
        topic: the topic to read.
        bootstrap_servers: librdkafka's bootstrap.servers ("host:port,host:port").
        max_out_of_orderness_ms: the declared bound on how far behind the largest event time read so
            far a record of the same partition can arrive; None: no watermark (BEGINNING_OF_TIME).
        partitions: the Kafka partitions to read; None: all partitions the topic has now.
        value_format: "json" (strict JSON, the default), "str" (UTF-8) or "bytes", or a function of
            the value's bytes; whatever it cannot decode is Malformed.
        key_format: "str" (UTF-8; a null key is "") or a function of the key's bytes (or None).
        timestamp: the record's event time from the decoded message; default: its Kafka timestamp.
        starting_offsets: where a new pipeline root starts: "earliest" (the oldest record the broker
            still holds), "latest" (only records produced from now on) or {partition: offset}.
        config: extra librdkafka consumer settings (security.protocol, sasl.*, ssl.*, ...).
        max_records_per_read: the most records one latest_offset hands out per partition.
        timeout_s: how long a broker request, or a read that makes no progress, may take.
        name: what record ids begin with: "name:topic:partition:offset" (None: "topic:partition:
            offset"). Ids name the topic, not the cluster: injectors reading same-named topics of
            two clusters into one computation each need a name of their own (Pipeline.validate
            refuses them without).
    """

    values_are_data = True  # a value the stream cannot carry is malformed input (model/injector.py)

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str,
        *,
        max_out_of_orderness_ms: int | None,
        partitions: Sequence[int] | None = None,
        value_format: ValueFormat = "json",
        key_format: KeyFormat = "str",
        timestamp: Callable[[KafkaMessage], int] | None = None,
        starting_offsets: StartingOffsets = "earliest",
        config: Mapping[str, Any] | None = None,
        max_records_per_read: int = DEFAULT_MAX_RECORDS_PER_READ,
        timeout_s: float = 10.0,
        name: str | None = None,
    ) -> None:
        _client()  # fail now, with the install hint, rather than on a Spark worker
        if not topic:
            raise ValueError("topic must be a non-empty string")
        if max_out_of_orderness_ms is not None and (isinstance(max_out_of_orderness_ms, bool)
                                                    or not isinstance(max_out_of_orderness_ms, int)
                                                    or max_out_of_orderness_ms < 0):
            raise ValueError(f"max_out_of_orderness_ms must be an int >= 0 or None, got {max_out_of_orderness_ms!r}")
        if value_format not in ("json", "str", "bytes") and not callable(value_format):
            raise ValueError(f"value_format must be 'json', 'str', 'bytes' or a function, got {value_format!r}")
        if key_format != "str" and not callable(key_format):
            raise ValueError(f"key_format must be 'str' or a function, got {key_format!r}")
        if not (starting_offsets in ("earliest", "latest") or isinstance(starting_offsets, Mapping)):
            raise ValueError(f"starting_offsets must be 'earliest', 'latest' or {{partition: offset}}, "
                             f"got {starting_offsets!r}")
        if isinstance(starting_offsets, Mapping) and any(int(o) < 0 for o in starting_offsets.values()):
            # librdkafka reads negative offsets as logical positions (-1 end, -2 beginning).
            raise ValueError(f"starting offsets must be >= 0, got {dict(starting_offsets)!r}")
        if max_records_per_read < 1:
            raise ValueError("max_records_per_read must be >= 1")
        if name is not None and (not isinstance(name, str) or not name or ":" in name):
            raise ValueError(f"name must be a non-empty string without ':', got {name!r}")
        self.topic = topic
        self.name = name
        # What every record id of this injector begins with (then "partition:offset").
        self._id_prefix = f"{topic}:" if name is None else f"{name}:{topic}:"
        self.bootstrap_servers = bootstrap_servers
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        self.value_format = value_format
        self.key_format = key_format
        self.timestamp = timestamp
        self.starting_offsets: StartingOffsets = (starting_offsets if isinstance(starting_offsets, str)
                                                  else {int(p): int(o) for p, o in starting_offsets.items()})
        self.config = dict(config or {})
        self.max_records_per_read = max_records_per_read
        self.timeout_s = timeout_s
        if partitions is None:
            numbers = self._discover_partitions()
        else:
            numbers = sorted(set(int(p) for p in partitions))
            if not numbers or numbers[0] < 0:
                raise ValueError(f"partitions must be non-empty partition numbers >= 0, got {partitions!r}")
        self._partitions: tuple[str, ...] = tuple(str(p) for p in numbers)

    def __repr__(self) -> str:
        # Setting names only: their values may be credentials.
        return (f"KafkaInjector(topic={self.topic!r}, name={self.name!r}, "
                f"bootstrap_servers={self.bootstrap_servers!r}, "
                f"partitions={list(self._partitions)}, max_out_of_orderness_ms={self.max_out_of_orderness_ms}, "
                f"config keys={sorted(self.config)})")

    # -- the Injector contract -------------------------------------------------------------------
    def partitions(self) -> Sequence[str]:
        return self._partitions

    def id_namespace(self) -> tuple[str, str] | None:
        # Ids "topic:partition:offset" share a namespace with every injector over a same-named topic
        # (of any cluster); a name given sets them apart.
        return ("topic", self.topic) if self.name is None else ("name", self.name)

    def initial_offset(self, partition: str) -> Offset:
        number = self._number(partition)
        if isinstance(self.starting_offsets, Mapping):
            if number not in self.starting_offsets:
                raise ValueError(f"starting_offsets has no offset for partition {number} of topic {self.topic!r}")
            first = self.starting_offsets[number]
        else:
            low, high = self._watermark_offsets(number)
            first = low if self.starting_offsets == "earliest" else high
        return {"next": first, "max_event_time": None}

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        number = self._number(partition)
        low, high = self._watermark_offsets(number)
        if start["next"] > high:
            raise KafkaInjectorError(
                f"{self.topic}:{number} ends at offset {high}, before this pipeline's position {start['next']}: "
                f"the topic was deleted and created again, or its log was truncated")
        if start["next"] < low:
            raise KafkaInjectorError(
                f"records {start['next']}..{low - 1} of {self.topic}:{number} were deleted by the broker "
                f"(retention, or a DeleteRecords request) before this pipeline read them")
        cap = self.max_records_per_read if max_records is None else min(max_records, self.max_records_per_read)
        end = min(high, start["next"] + max(0, cap))
        if end <= start["next"]:
            return start
        max_event_time = start["max_event_time"]
        if self.max_out_of_orderness_ms is not None:
            for message in self._fetch(number, start["next"], end):
                event_time = self._event_time_or_none(message)
                if event_time is not None and (max_event_time is None or event_time > max_event_time):
                    max_event_time = event_time
        return {"next": end, "max_event_time": max_event_time}

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any] | Malformed]:
        number = self._number(partition)
        for message in self._fetch(number, start["next"], end["next"]):
            yield self._record(message)

    def low_watermark(self, partition: str, offset: Offset) -> int:
        if self.max_out_of_orderness_ms is None or offset["max_event_time"] is None:
            return BEGINNING_OF_TIME
        return max(BEGINNING_OF_TIME, int(offset["max_event_time"]) - self.max_out_of_orderness_ms)

    # -- Kafka -----------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        """The consumer's settings in this process: defaults < environment < config < required."""
        return {"bootstrap.servers": self.bootstrap_servers, "group.id": DEFAULT_GROUP_ID,
                # A fetch at the end of a partition waits this long on the broker, and the next read on
                # the same consumer waits for it; a read ending on a transaction marker or compaction
                # hole learns where the partition ends only from such a fetch (librdkafka's default: 500).
                "fetch.wait.max.ms": 50,
                **environment_config(), **self.config, **_REQUIRED}

    def _error(self, text: str, settings: Mapping[str, Any]) -> KafkaInjectorError:
        return KafkaInjectorError(mask_secrets(text, settings))

    def _number(self, partition: str) -> int:
        if partition not in self._partitions:
            raise ValueError(f"topic {self.topic!r}: no injector partition {partition!r}; "
                             f"expected one of {list(self._partitions)}")
        return int(partition)

    def _discover_partitions(self) -> list[int]:
        settings = self._settings()
        client = _client()
        with _POOL.lend(settings) as consumer:
            try:
                metadata = consumer.list_topics(self.topic, timeout=self.timeout_s)
            except client.KafkaException as error:
                raise self._error(f"cannot list partitions of topic {self.topic!r} at "
                                  f"{self.bootstrap_servers}: {error}", settings) from None
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            reason = topic.error if topic is not None and topic.error is not None else "no partitions"
            raise self._error(f"topic {self.topic!r} at {self.bootstrap_servers}: {reason}", settings)
        return sorted(topic.partitions)

    def _watermark_offsets(self, number: int) -> tuple[int, int]:
        settings = self._settings()
        client = _client()
        with _POOL.lend(settings) as consumer:
            try:
                offsets = consumer.get_watermark_offsets(client.TopicPartition(self.topic, number),
                                                         timeout=self.timeout_s, cached=False)
            except client.KafkaException as error:
                raise self._error(f"cannot get the offsets of {self.topic}:{number} at "
                                  f"{self.bootstrap_servers}: {error}", settings) from None
        if offsets is None:
            raise self._error(f"no offsets for {self.topic}:{number} within {self.timeout_s} s", settings)
        low, high = offsets
        return int(low), int(high)

    def _fetch(self, number: int, start: int, end: int) -> Iterator[Any]:
        """The messages of partition `number` with offsets in [start, end), in offset order."""
        if end <= start:
            return
        settings = self._settings()
        client = _client()
        eof = client.KafkaError._PARTITION_EOF
        gone = (client.KafkaError._AUTO_OFFSET_RESET, client.KafkaError.OFFSET_OUT_OF_RANGE)
        with _POOL.lend(settings) as consumer:
            consumer.assign([client.TopicPartition(self.topic, number, start)])
            position = start
            progress_at = time.monotonic()
            while position < end:
                # consume() returns early only once it has num_messages; where the range has gaps it
                # never gets them, so a short timeout keeps such a read from waiting in vain.
                messages = consumer.consume(num_messages=min(1000, end - position), timeout=0.05)
                if not messages:
                    if time.monotonic() - progress_at >= self.timeout_s:
                        raise self._error(f"{self.topic}:{number}: no record at offset {position} or later "
                                          f"within {self.timeout_s} s (the read ends at {end})", settings)
                    continue
                progress_at = time.monotonic()
                for message in messages:
                    error = message.error()
                    if error is None:
                        offset = message.offset()
                        if offset >= end:  # past a gap that ends the range
                            return
                        if offset >= position:
                            position = offset + 1
                            yield message
                    elif error.code() == eof:
                        # The partition ends here: at or past `end`, whatever offsets were not
                        # delivered below it hold no records (transaction markers, compaction).
                        if message.offset() >= end:
                            return
                    elif error.code() in gone:
                        raise self._error(f"{self.topic}:{number}: offset {position} is no longer on the broker "
                                          f"(retention or compaction): {error.str()}", settings)
                    elif error.fatal():
                        raise self._error(f"{self.topic}:{number}: {error.str()}", settings)
                    # Other errors (a broker restarting, a leader moving) are retried by librdkafka;
                    # the no-progress timeout above bounds the wait.

    # -- decoding --------------------------------------------------------------------------------
    def _record(self, message: Any) -> Record[Any] | Malformed:
        offset = message.offset()
        position = f"{self._id_prefix}{message.partition()}:{offset}"
        try:
            decoded = self._decode(message)
            event_time = self._event_time(decoded)
        except Exception as error:  # user decoders and timestamp functions: a bad message is a dead letter
            return Malformed(position, _text(message.value()), f"{type(error).__name__}: {error}")
        return Record(decoded.key, decoded.value, event_time, position)

    def _decode(self, message: Any) -> KafkaMessage:
        raw_key, raw_value = message.key(), message.value()
        if self.key_format == "str":
            key = "" if raw_key is None else raw_key.decode("utf-8")
        else:
            key = self.key_format(raw_key)
            if not isinstance(key, str):
                raise TypeError(f"key_format returned {type(key).__name__}, not str")
        if raw_value is None:  # a tombstone: deletion of the key in a compacted topic
            value: Any = None
        elif self.value_format == "json":
            value = strict_json.loads(raw_value)
        elif self.value_format == "str":
            value = raw_value.decode("utf-8")
        elif self.value_format == "bytes":
            value = bytes(raw_value)
        else:
            value = self.value_format(raw_value)
        kind, stamp = message.timestamp()
        timestamp_ms = None if kind == _client().TIMESTAMP_NOT_AVAILABLE else stamp
        headers = tuple((name, data) for name, data in (message.headers() or ()))
        return KafkaMessage(self.topic, message.partition(), message.offset(), key, value, timestamp_ms, headers)

    def _event_time(self, message: KafkaMessage) -> int:
        if self.timestamp is None:
            if message.timestamp_ms is None:
                raise ValueError("the message has no Kafka timestamp; pass timestamp= to take it from the value")
            event_time = message.timestamp_ms
        else:
            event_time = self.timestamp(message)
        if isinstance(event_time, bool) or not isinstance(event_time, int):
            raise TypeError(f"the timestamp must be int milliseconds, got {type(event_time).__name__}")
        # A time at END_OF_TIME would read as "this partition is finished".
        if not BEGINNING_OF_TIME < event_time < END_OF_TIME:
            raise ValueError(f"timestamp {event_time} is outside ({BEGINNING_OF_TIME}, {END_OF_TIME})")
        return event_time

    def _event_time_or_none(self, message: Any) -> int | None:
        """The event time `read` gives the message; None if `read` makes it Malformed (a dead letter
        has no event time, so it does not move the watermark)."""
        record = self._record(message)
        return None if isinstance(record, Malformed) else record.timestamp


def _text(data: bytes | None) -> str:
    return "" if data is None else bytes(data).decode("utf-8", "backslashreplace")
