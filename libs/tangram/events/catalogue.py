"""Every event of the life of a claim. Schema evolution: new fields get defaults; never reorder or re-type."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

from tangram.events.envelope import Event
from tangram.events.inventory import MigPlacement, NodeHardware

INVENTORY_STREAM = "TANGRAM_INVENTORY"
CLAIMS_STREAM = "TANGRAM_CLAIMS"
NODES_STREAM = "TANGRAM_NODES"
DEADLETTER_STREAM = "TANGRAM_DEADLETTER"


class NodeInventory(Event, tag="node.inventory", frozen=True, kw_only=True):
    """Last value per node: everything discovery saw. key = node subject token."""

    stream: ClassVar[str] = INVENTORY_STREAM
    subject_pattern: ClassVar[str] = "tangram.inventory.{key}"

    hardware: NodeHardware
    generation: int = 0  # increases with every publication by one discovery process


PreemptionPolicy = Literal["PreemptLowerPriority", "Never"]


class GangMember(msgspec.Struct, frozen=True, kw_only=True):
    """The group of pods a claim's pod belongs to: the claims of all its pods are allocated in one
    decision or none is, so a group never holds part of the fleet while it waits."""

    group: str  # the group's name, in the claim's namespace
    size: int  # how many pods the group has
    pod: str  # the pod of the group that uses the claim
    pod_claims: int = 1  # how many of Tangram's claims that pod uses (each is asked apart)
    # every claim of the group in one NVLink fabric clique (a GB200 NVL rack or partition), with
    # one IMEX channel for the group on exactly the nodes it holds
    nvlink_domain: bool = False
    problem: str = ""  # what is wrong with how the pod names its group; "" when nothing is


class ClaimRequested(Event, tag="claim.requested", frozen=True, kw_only=True):
    """A ResourceClaim to decide. key = claim uid."""

    stream: ClassVar[str] = CLAIMS_STREAM
    subject_pattern: ClassVar[str] = "tangram.claim.requested.{key}"

    namespace: str
    name: str
    uid: str
    spec: dict[str, Any]  # ResourceClaim.spec (resource.k8s.io/v1), validated by the allocator
    # The DeviceClasses the claim names, as the cluster held them when the claim was read (name ->
    # DeviceClass manifest): the allocator decides with these over its configured ones, so a replay
    # decides as live whatever classes were created, changed or deleted in the cluster since.
    classes: dict[str, dict[str, Any]] = {}
    # Counts the requests of this claim decided before: a claim that failed is asked again (with
    # attempt + 1) when capacity is released; the same attempt delivered twice is decided once.
    attempt: int = 0
    # status.allocation of a claim another writer (kube-scheduler) allocated: the allocator does
    # not decide it but takes its devices as held, so nothing is given twice.
    allocation: dict[str, Any] | None = None
    # The highest priority of the pods that use the claim (their PriorityClass): claims are asked
    # in priority order, and a claim that cannot be placed may preempt claims of lower priority.
    priority: int = 0
    # The pods' preemptionPolicy: "Never" waits for capacity and never preempts.
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    # Claims that may not be preempted now: a PodDisruptionBudget forbids evicting one of their
    # pods, or the eviction was refused. Carried on the request, so a replay decides as live.
    protected: list[str] = []
    # The group of pods the claim is placed with, all or nothing; None for a claim placed alone.
    gang: GangMember | None = None


# How several claims share one device. MPS: one control daemon per device, each client limited
# to its pinned device memory and active thread percentage. TimeSlicing: the driver's time slices,
# with no memory isolation at all (the memory is only counted).
SharingStrategy = Literal["MPS", "TimeSlicing"]
TimeSlice = Literal["Default", "Short", "Medium", "Long"]


class DeviceShare(msgspec.Struct, frozen=True, kw_only=True):
    """One claim's share of a device that several claims may hold at once."""

    id: str  # the DRA shareID: a UUID derived from the claim uid and the device, so replays agree
    strategy: SharingStrategy = "MPS"
    memory_bytes: int = 0  # MPS: the client's pinned device memory limit; time-slicing: counted only
    compute_percent: int = 100  # MPS: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    time_slice: TimeSlice = "Default"  # time-slicing: the slice length asked for


class AllocatedDevice(msgspec.Struct, frozen=True, kw_only=True):
    request: str  # "<request>" or "<request>/<subrequest>"
    driver: str
    pool: str
    device: str  # ResourceSlice device name
    gpu_index: int
    gpu_uuid: str
    profile: str | None = None  # MIG profile name; None for a whole GPU
    profile_id: int | None = None
    placement: MigPlacement | None = None
    admin_access: bool = False
    partition_command: str = ""  # the command creating this MIG instance; "" when it already exists
    share: DeviceShare | None = None  # set when the claim holds a share of the device, not all of it


class ClaimAllocated(Event, tag="claim.allocated", frozen=True, kw_only=True):
    stream: ClassVar[str] = CLAIMS_STREAM
    subject_pattern: ClassVar[str] = "tangram.claim.allocated.{key}"

    namespace: str
    name: str
    uid: str
    node: str
    devices: list[AllocatedDevice]
    partitions: list[str] = []  # command ids of the partition commands this allocation waits for
    config: list[dict[str, Any]] = []  # opaque configs that apply, as in status.allocation.devices.config
    # The last sequence of each stream besides the claims stream (inventories, partition results)
    # the allocator had folded when it decided: a replay folds exactly those, whatever the timing
    # of their arrival was. Empty on decisions not made live by the allocator.
    positions: dict[str, int] = {}
    attempt: int = 0  # the ClaimRequested.attempt decided


# Why a claim failed, in the terms a person (and a retry) acts on:
# - capacity: nodes could hold it, but not with what is free now; freed capacity may let it in.
# - hardware: no node of the fleet could hold it even were everything free; a new node may.
# - claim: the claim itself is at fault (invalid, an unknown class, a selector that fails to
#   evaluate); asking again unchanged fails the same way.
# - internal: the allocator failed deciding it; the claim was not allocated and nothing was held.
# - gang: the claim's group of pods is not all asked yet; its claims are decided together when it is.
# Only capacity failures count as demand the fleet should keep room for.
FailureCause = Literal["capacity", "hardware", "claim", "internal", "gang"]


class ClaimFailed(Event, tag="claim.failed", frozen=True, kw_only=True):
    stream: ClassVar[str] = CLAIMS_STREAM
    subject_pattern: ClassVar[str] = "tangram.claim.failed.{key}"

    namespace: str
    name: str
    uid: str
    reason: str
    positions: dict[str, int] = {}  # as on ClaimAllocated
    attempt: int = 0  # the ClaimRequested.attempt decided
    cause: FailureCause = "capacity"
    # the node reserved for this claim's preemption while it waits for the victims' devices;
    # empty when none is (never planned, or the reservation was given up)
    reserved_node: str = ""
    # the nodes (one fabric clique) kept for this claim's group of pods while it waits: claims of
    # its priority or lower asked after it are placed elsewhere; empty when none are kept
    held_for_group: list[str] = []


class PreemptionVictim(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    uid: str
    priority: int


class ClaimPreempting(Event, tag="claim.preempting", frozen=True, kw_only=True):
    """The claim could not be placed, and claims of lower priority are preempted to make room on one
    node: their pods are evicted, and what they free there is reserved for this claim until it is
    allocated (no other claim of its priority or lower is placed on the node meanwhile)."""

    stream: ClassVar[str] = CLAIMS_STREAM
    subject_pattern: ClassVar[str] = "tangram.claim.preempting.{key}"

    namespace: str
    name: str
    uid: str
    node: str
    priority: int
    victims: list[PreemptionVictim]
    reason: str  # why the claim did not fit without preemption
    positions: dict[str, int] = {}  # as on ClaimAllocated
    attempt: int = 0  # the ClaimRequested.attempt decided


class ClaimReleased(Event, tag="claim.released", frozen=True, kw_only=True):
    """The claim was deleted or deallocated: its devices may be freed."""

    stream: ClassVar[str] = CLAIMS_STREAM
    subject_pattern: ClassVar[str] = "tangram.claim.released.{key}"

    namespace: str
    name: str
    uid: str
    # The ResourceClaim itself is gone (deleted), not only deallocated: its uid is never asked
    # again, so the allocator forgets it once nothing sent before the deletion can still arrive.
    deleted: bool = False


# create/destroy: one MIG GPU instance (and its compute instance) at a placement. disable-mig: turn
# MIG mode off on a GPU with no instances left, so that a whole-GPU claim can use it (Hopper and
# newer; the command's profile is "" and its placement spans the GPU).
PartitionAction = Literal["create", "destroy", "disable-mig"]


class PartitionRequested(Event, tag="partition.requested", frozen=True, kw_only=True):
    """A command for one node's partitioner. key = node subject token."""

    stream: ClassVar[str] = NODES_STREAM
    subject_pattern: ClassVar[str] = "tangram.node.{key}.partition.requested"

    command_id: str
    node: str
    action: PartitionAction
    gpu_uuid: str
    gpu_index: int
    profile: str
    profile_id: int
    placement: MigPlacement
    claim_uid: str = ""  # the claim the instance is for (create) or was for (destroy)
    positions: dict[str, int] = {}  # as on ClaimAllocated, when the allocator sent the command
    mig_uuid: str = ""  # destroy: the instance to destroy, when known


class PartitionApplied(Event, tag="partition.applied", frozen=True, kw_only=True):
    stream: ClassVar[str] = NODES_STREAM
    subject_pattern: ClassVar[str] = "tangram.node.{key}.partition.applied"

    command_id: str
    node: str
    action: PartitionAction
    gpu_uuid: str
    gpu_index: int
    profile: str
    placement: MigPlacement
    claim_uid: str = ""
    mig_uuid: str = ""
    gpu_instance_id: int = -1
    compute_instance_id: int = -1
    gi_cap_minor: int = -1  # /dev/nvidia-caps/nvidia-cap<N> of the GPU instance
    ci_cap_minor: int = -1  # ... of the compute instance
    duration_ms: float = 0.0
    kept_warm: bool = False  # destroy answered by keeping the free instance for the next claim


class PartitionFailed(Event, tag="partition.failed", frozen=True, kw_only=True):
    stream: ClassVar[str] = NODES_STREAM
    subject_pattern: ClassVar[str] = "tangram.node.{key}.partition.failed"

    command_id: str
    node: str
    action: PartitionAction
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    claim_uid: str = ""
    nvml_error: str = ""  # NVML error name: "NVML_ERROR_INSUFFICIENT_RESOURCES"
    reason: str


class PreparedDevice(msgspec.Struct, frozen=True, kw_only=True):
    request: str
    pool: str
    device: str
    cdi_device_ids: list[str]
    share_id: str = ""  # the DRA shareID of a share of the device


class ClaimPrepared(Event, tag="claim.prepared", frozen=True, kw_only=True):
    stream: ClassVar[str] = NODES_STREAM
    subject_pattern: ClassVar[str] = "tangram.node.{key}.claim.prepared"

    node: str
    namespace: str
    name: str
    uid: str
    devices: list[PreparedDevice]
    duration_ms: float = 0.0


class ClaimUnprepared(Event, tag="claim.unprepared", frozen=True, kw_only=True):
    stream: ClassVar[str] = NODES_STREAM
    subject_pattern: ClassVar[str] = "tangram.node.{key}.claim.unprepared"

    node: str
    namespace: str
    name: str
    uid: str


class DeviceHealthChanged(Event, tag="device.health", frozen=True, kw_only=True):
    stream: ClassVar[str] = NODES_STREAM
    subject_pattern: ClassVar[str] = "tangram.node.{key}.health"

    node: str
    gpu_uuid: str
    healthy: bool
    reason: str = ""
    xid: int | None = None


class DeadLetter(Event, tag="dead.letter", frozen=True, kw_only=True):
    """A message a consumer could not handle, kept with the reason and its original bytes.

    A message too large to be carried whole in a dead letter is kept by reference: its stream
    sequence finds it while the stream holds it, and `size` and `sha256` identify it; `data`
    then holds only its first bytes and `truncated` is set.
    """

    stream: ClassVar[str] = DEADLETTER_STREAM
    subject_pattern: ClassVar[str] = "tangram.deadletter.{key}"  # key = consumer durable name

    consumer: str
    original_subject: str
    original_stream: str
    original_sequence: int
    deliveries: int
    reason: str
    data: bytes  # base64 in JSON
    headers: dict[str, str] = {}
    size: int = -1  # bytes of the original message; -1 in letters written before it was recorded
    sha256: str = ""  # hex digest of the original message
    truncated: bool = False  # data is a prefix of the original message


AnyEvent = (
    NodeInventory
    | ClaimRequested
    | ClaimAllocated
    | ClaimFailed
    | ClaimReleased
    | ClaimPreempting
    | PartitionRequested
    | PartitionApplied
    | PartitionFailed
    | ClaimPrepared
    | ClaimUnprepared
    | DeviceHealthChanged
    | DeadLetter
)

EVENT_TYPES: tuple[type[Event], ...] = (
    NodeInventory,
    ClaimRequested,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimPreempting,
    PartitionRequested,
    PartitionApplied,
    PartitionFailed,
    ClaimPrepared,
    ClaimUnprepared,
    DeviceHealthChanged,
    DeadLetter,
)
