"""Every stream and durable consumer Tangram uses, in one table. Created or updated idempotently."""

from __future__ import annotations

from dataclasses import dataclass, field

from tangram.events import CLAIMS_STREAM, DEADLETTER_STREAM, INVENTORY_STREAM, NODES_STREAM, subject_token

DAY = 24 * 3600.0


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    description: str
    max_msgs_per_subject: int = -1
    max_age_s: float = 0.0  # 0: keep forever
    duplicate_window_s: float = 120.0  # Nats-Msg-Id de-duplication window
    max_msg_size: int = 4 * 1024 * 1024


@dataclass(frozen=True)
class ConsumerSpec:
    durable: str
    stream: str
    filter_subjects: tuple[str, ...]
    max_deliver: int = 5
    # Delays before redelivery after a failed attempt n (n-1 indexes this; the last repeats).
    backoff_s: tuple[float, ...] = (0.2, 1.0, 5.0)
    ack_wait_s: float = 30.0
    max_ack_pending: int = 1024
    description: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        name=INVENTORY_STREAM,
        subjects=("tangram.inventory.>",),
        description="last inventory per node",
        max_msgs_per_subject=1,
    ),
    StreamSpec(
        name=CLAIMS_STREAM,
        subjects=("tangram.claim.>",),
        description="claim requests and the allocator's decisions: the replayable source of truth",
    ),
    StreamSpec(
        name=NODES_STREAM,
        subjects=("tangram.node.>",),
        description="per-node partition commands and results, prepare results, health",
        max_age_s=30 * DAY,
    ),
    StreamSpec(
        name=DEADLETTER_STREAM,
        subjects=("tangram.deadletter.>",),
        description="messages a consumer could not handle, with the reason and the original bytes",
        max_age_s=30 * DAY,
    ),
)

STREAMS_BY_NAME = {spec.name: spec for spec in STREAMS}


@dataclass(frozen=True)
class KeyValueSpec:
    bucket: str
    description: str
    ttl_s: float  # an entry not written again within this time is gone


# One allocator decides at a time: the leader holds a key in this bucket and keeps writing it;
# when it stops (or dies), the key expires after the TTL and a follower takes over.
LEADER_BUCKET = KeyValueSpec(
    bucket="tangram-leader", description="who leads each central service", ttl_s=10.0
)
KEY_VALUES: tuple[KeyValueSpec, ...] = (LEADER_BUCKET,)


@dataclass(frozen=True)
class ObjectStoreSpec:
    bucket: str
    description: str


# The allocator's ledger image: a restarted allocator restores it and folds only the log after it.
# Written and read by the allocator alone (natsauth.permissions).
IMAGE_BUCKET = ObjectStoreSpec(bucket="tangram-allocator-image", description="the allocator's ledger image")
IMAGE_NAME = "ledger"
OBJECT_STORES: tuple[ObjectStoreSpec, ...] = (IMAGE_BUCKET,)


# What a node service folds to know the claims of its node: the allocator's decisions (all nodes:
# a claim's subject names its uid, not its node) and its own node's partition results and prepares.
CLAIM_DECISION_SUBJECTS = ("tangram.claim.allocated.>", "tangram.claim.failed.>", "tangram.claim.released.>")


def partition_result_subjects(node: str = "*") -> tuple[str, ...]:
    """One node's partition results (a subject token), or every node's with "*"."""
    return (f"tangram.node.{node}.partition.applied", f"tangram.node.{node}.partition.failed")


def node_partition_subjects(node: str) -> str:
    """One node's partition commands and results, as one filter.

    One filter, so that the consumer following it is created on the filtered create subject
    `$JS.API.CONSUMER.CREATE.TANGRAM_NODES.<name>.<filter>`, which the node's permissions pin to
    its own node; the node's readers ignore the commands.
    """
    return f"tangram.node.{subject_token(node)}.partition.*"


def node_prepare_subjects(node: str) -> str:
    """One node's prepared and unprepared claims, as one filter (pinned to the node as above)."""
    return f"tangram.node.{subject_token(node)}.claim.*"


def prepare_result_subjects(node: str = "*") -> tuple[str, ...]:
    """Claims one node (a subject token), or every node with "*", prepared and unprepared."""
    return (f"tangram.node.{node}.claim.prepared", f"tangram.node.{node}.claim.unprepared")


def allocator_node_subjects() -> tuple[str, ...]:
    """What the allocator folds of TANGRAM_NODES: partition results, and prepares, which tell it of
    claims allocated outside it (by kube-scheduler) so that it never hands their devices out again."""
    return (*partition_result_subjects(), *prepare_result_subjects())


def node_claim_sources(node: str) -> list[tuple[str, tuple[str, ...]]]:
    """(stream, subjects) a node service follows to rebuild what it knows of its node's claims."""
    # Prepares too: a claim kube-scheduler allocated is live on the node from its prepare to its
    # unprepare, and the node makes and destroys its MIG instances itself.
    return [
        (CLAIMS_STREAM, CLAIM_DECISION_SUBJECTS),
        (NODES_STREAM, (node_partition_subjects(node),)),
        (NODES_STREAM, (node_prepare_subjects(node),)),
    ]


def allocator_log_sources() -> list[tuple[str, tuple[str, ...]]]:
    """(stream, subjects) the allocator's state is folded from at start; () means every subject."""
    return [(INVENTORY_STREAM, ()), (CLAIMS_STREAM, ()), (NODES_STREAM, allocator_node_subjects())]


def allocator_consumer() -> ConsumerSpec:
    return ConsumerSpec(
        durable="allocator",
        stream=CLAIMS_STREAM,
        filter_subjects=("tangram.claim.requested.>", "tangram.claim.released.>"),
        description="claims to decide and to free",
    )


def allocator_results_consumer() -> ConsumerSpec:
    return ConsumerSpec(
        durable="allocator-partition-results",
        stream=NODES_STREAM,
        filter_subjects=allocator_node_subjects(),
        description="partition results and prepared claims from every node",
    )


def partitioner_consumer(node: str) -> ConsumerSpec:
    token = subject_token(node)
    return ConsumerSpec(
        durable=f"partitioner-{token}",
        stream=NODES_STREAM,
        filter_subjects=(f"tangram.node.{token}.partition.requested",),
        # A MIG create can take seconds on real hardware; in_progress heartbeats extend this.
        ack_wait_s=60.0,
        description=f"partition commands for node {node}",
    )
