"""Photon (SIGMOD 2013) building blocks that need no Spark: the IdRegistry and the EventStore.

- `registry`: the IdRegistry contract (claims with tokens, outcomes, timestamp-based sharding, GC).
- `sqlite_registry` / `postgres_registry`: the two backends; `open_registry(url)` picks one.
- `batching`: server-side batching (group commit) in front of either backend.
- `eventstore`: the in-memory cache, the log with its log file map, and the two combined.
- `ids`: Photon-style event ids (server, process, timestamp, sequence).
- `localpg`: a throw-away PostgreSQL server for tests, benchmarks and demos.

The pipeline parts, on millstream:

- `adapter`: the user's JoinAdapter (how to read clicks and queries; filter, project, enrich).
- `eventreader`: the EventReader computation (primary log -> EventStore).
- `joiner`: the stateless Joiner (EventStore lookup, registry commit with a deterministic token).
- `dispatcher`: the Dispatcher computation (lookup before dispatch, retries on wall-time timers,
  unjoinable clicks).
- `verifier`: repairs clicks registered by a pipeline that died before writing them.
- `pipeline` / `driver`: one complete redundant pipeline, and its driver process.
- `liveness`, `faults`, `credentials`, `outputs`: heartbeats and retirement, fault injection, keeping
  the registry password out of Spark's plan, reading a pipeline's outputs without Spark.
- `ownership`: each owner name bound to one pipeline root; a start on another root is refused.
"""

from millstream.photon.adapter import JoinAdapter
from millstream.photon.batching import BatchingRegistry, BatchingStats, CommitTimeout
from millstream.photon.eventstore import (CachedEventStore, Event, EventLogWriter, EventStore, EventStoreStats,
                                          LogEventStore, TieredEventStore)
from millstream.photon.factory import open_registry
from millstream.photon.ids import EventId, EventIdGenerator, event_time_of
from millstream.photon.postgres_registry import PostgresRegistry, redact_dsn
from millstream.photon.registry import (Claim, CommitOutcome, CommitStatus, DeleteStatus, GcResult, IdRegistry,
                                        LookupResult, OwnerRoot, RegistryError, ReshardRefused, ShardingConfig,
                                        ShardingEntry, Token, shard_of)
from millstream.photon.sqlite_registry import SqliteRegistry
from millstream.photon.dispatcher import (JOINED, STATS, UNJOINABLE, ClickShard, DispatchStats, Dispatcher,
                                          RegistrySpec, RetryPolicy)
from millstream.photon.eventreader import EventReader, primary_key
from millstream.photon.faults import PhotonFaults, PipelineDied
from millstream.photon.joiner import JoinBatch, Joiner, JoinRequest, JoinResult, JoinStatus, dispatch_token
from millstream.photon.liveness import OwnerHeartbeat, OwnerRetired, is_gone, retire_owner
from millstream.photon.outputs import PipelineLayout
from millstream.photon.ownership import OwnerOfAnotherRoot, claim_owner_root
from millstream.photon.pipeline import PhotonPipelineSpec, build_photon_pipeline
from millstream.photon.verifier import Verifier, VerifierReport

__all__ = [
    "JOINED", "STATS", "UNJOINABLE", "ClickShard", "DispatchStats", "Dispatcher", "EventReader", "JoinAdapter",
    "JoinBatch", "JoinRequest", "JoinResult", "JoinStatus", "Joiner", "OwnerHeartbeat", "OwnerOfAnotherRoot",
    "OwnerRetired", "PhotonFaults", "PhotonPipelineSpec", "PipelineDied", "PipelineLayout", "RegistrySpec",
    "RetryPolicy", "Verifier", "VerifierReport", "build_photon_pipeline", "claim_owner_root", "dispatch_token",
    "is_gone", "primary_key", "retire_owner",
    "BatchingRegistry", "BatchingStats", "CachedEventStore", "Claim", "CommitOutcome", "CommitStatus",
    "CommitTimeout", "DeleteStatus", "Event", "EventId", "EventIdGenerator", "EventLogWriter", "EventStore",
    "EventStoreStats", "GcResult", "IdRegistry", "LogEventStore", "LookupResult", "OwnerRoot", "PostgresRegistry",
    "RegistryError", "ReshardRefused", "ShardingConfig", "ShardingEntry", "SqliteRegistry", "TieredEventStore",
    "Token", "event_time_of", "open_registry", "redact_dsn", "shard_of",
]
