"""Photon (SIGMOD 2013) building blocks that need no Spark: the IdRegistry and the EventStore.

- `registry`: the IdRegistry contract (claims with tokens, outcomes, timestamp-based sharding, GC).
- `sqlite_registry` / `postgres_registry`: the two backends; `open_registry(url)` picks one.
- `batching`: server-side batching (group commit) in front of either backend.
- `eventstore`: the in-memory cache, the log with its log file map, and the two combined.
- `ids`: Photon-style event ids (server, process, timestamp, sequence).
- `localpg`: a throw-away PostgreSQL server for tests, benchmarks and demos.
"""

from millstream.photon.batching import BatchingRegistry, BatchingStats, CommitTimeout
from millstream.photon.eventstore import (CachedEventStore, Event, EventLogWriter, EventStore, EventStoreStats,
                                          LogEventStore, TieredEventStore)
from millstream.photon.factory import open_registry
from millstream.photon.ids import EventId, EventIdGenerator, event_time_of
from millstream.photon.postgres_registry import PostgresRegistry, redact_dsn
from millstream.photon.registry import (Claim, CommitOutcome, CommitStatus, DeleteStatus, GcResult, IdRegistry,
                                        LookupResult, RegistryError, ReshardRefused, ShardingConfig, ShardingEntry,
                                        Token, shard_of)
from millstream.photon.sqlite_registry import SqliteRegistry

__all__ = [
    "BatchingRegistry", "BatchingStats", "CachedEventStore", "Claim", "CommitOutcome", "CommitStatus",
    "CommitTimeout", "DeleteStatus", "Event", "EventId", "EventIdGenerator", "EventLogWriter", "EventStore",
    "EventStoreStats", "GcResult", "IdRegistry", "LogEventStore", "LookupResult", "PostgresRegistry",
    "RegistryError", "ReshardRefused", "ShardingConfig", "ShardingEntry", "SqliteRegistry", "TieredEventStore",
    "Token", "event_time_of", "open_registry", "redact_dsn", "shard_of",
]
