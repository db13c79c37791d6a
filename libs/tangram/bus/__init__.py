"""The JetStream bus: declarations, publishing, durable consumers with dead letters, replay."""

from tangram.bus.client import Bus, Handler
from tangram.bus.config import BusConfig, is_transient, redact_url
from tangram.bus.declarations import (
    STREAMS,
    STREAMS_BY_NAME,
    ConsumerSpec,
    StreamSpec,
    allocator_consumer,
    allocator_log_sources,
    allocator_node_subjects,
    allocator_results_consumer,
    node_claim_sources,
    node_partition_subjects,
    node_prepare_subjects,
    partition_result_subjects,
    partitioner_consumer,
)
from tangram.bus.errors import BusError, Poison, Retry
from tangram.bus.leader import LeaderLease, LeadershipLost, current_leader

__all__ = [
    "STREAMS",
    "STREAMS_BY_NAME",
    "Bus",
    "BusConfig",
    "BusError",
    "ConsumerSpec",
    "Handler",
    "LeaderLease",
    "LeadershipLost",
    "Poison",
    "Retry",
    "StreamSpec",
    "allocator_consumer",
    "allocator_log_sources",
    "allocator_node_subjects",
    "allocator_results_consumer",
    "current_leader",
    "is_transient",
    "node_claim_sources",
    "node_partition_subjects",
    "node_prepare_subjects",
    "partition_result_subjects",
    "partitioner_consumer",
    "redact_url",
]
