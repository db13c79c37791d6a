"""What the allocator decides: claims in, allocations, failures and releases out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from tangram.allocation.spec import ResourceClaimSpec
from tangram.events.catalogue import AllocatedDevice, FailureCause
from tangram.events.inventory import MigPlacement

Policy = Literal["tangram", "first-fit", "best-fit"]
POLICIES: tuple[Policy, ...] = ("tangram", "first-fit", "best-fit")


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    uid: str
    spec: dict[str, Any] | ResourceClaimSpec  # ResourceClaim.spec (resource.k8s.io/v1)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class PartitionPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A MIG GPU instance to create (or, on release, to destroy) at an exact placement."""

    gpu_index: int
    gpu_uuid: str
    profile: str
    profile_id: int
    placement: MigPlacement
    mig_uuid: str = ""  # destroy: the existing instance, when known
    # disable-mig: a whole GPU still in MIG mode; destroy: a free instance in the way of this claim
    action: Literal["create", "disable-mig", "destroy"] = "create"


class Allocated(msgspec.Struct, frozen=True, kw_only=True, tag="allocated"):
    claim_uid: str
    node: str
    devices: list[AllocatedDevice]
    partitions: list[PartitionPlan] = []
    config: list[dict[str, Any]] = []  # as status.allocation.devices.config
    set_score: int = 0  # classic topology score of the claim's distinct GPUs (sum over pairs)
    ideal_set_score: int = 0  # the best score any set of that many GPUs of this node can have
    # The best score any set of that many GPUs free on this node when it was decided can have:
    # set_score == best_available_set_score means the claim got the best NVLink set available.
    best_available_set_score: int = 0
    explanation: list[str] = []
    why: Explanation | None = None  # with explain: the demand-weighted scores that chose the node

    @property
    def multi_gpu(self) -> bool:
        return len({d.gpu_index for d in self.devices if not d.admin_access}) > 1


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag="failed"):
    claim_uid: str
    reason: str
    explanation: list[str] = []
    why: Explanation | None = None
    cause: FailureCause = "capacity"


Decision = Allocated | Failed


def internal_failure(error: BaseException) -> str:
    """The reason given for a claim the allocator failed to decide: what went wrong, and that
    nothing was held for it."""
    return (
        f"Tangram could not decide this claim (internal error: {type(error).__name__}: {error}); "
        "nothing was allocated. Report it with the claim's spec."
    )


class Release(msgspec.Struct, frozen=True, kw_only=True):
    claim_uid: str
    node: str | None = None
    devices: list[AllocatedDevice] = []
    destroy: list[PartitionPlan] = []  # MIG instances the claim used, to destroy (or keep warm)


class FleetMetrics(msgspec.Struct, frozen=True, kw_only=True):
    nodes: int
    gpus: int
    free_gpus: int  # whole GPUs with nothing allocated on them
    partially_used_gpus: int  # MIG-partitioned GPUs with some memory slices still free
    stranded_gpus: float  # free capacity, in GPUs, on partially used GPUs: no whole-GPU claim can use it
    claims: int
    allocated_devices: int


@dataclass
class NvlinkTally:
    """How many multi-GPU claims got the best NVLink set: available at decision time (what Tangram
    promises), and the best an empty node of that hardware could give (a stricter measure)."""

    multi_gpu: int = 0
    best_available: int = 0
    ideal: int = 0

    def count(self, decision: Allocated) -> None:
        if decision.ideal_set_score <= 0:
            return
        self.multi_gpu += 1
        self.best_available += decision.set_score >= decision.best_available_set_score
        self.ideal += decision.set_score >= decision.ideal_set_score

    def add(self, other: NvlinkTally) -> None:
        self.multi_gpu += other.multi_gpu
        self.best_available += other.best_available
        self.ideal += other.ideal

    def report(self) -> dict[str, float | int]:
        def share(count: int) -> float:
            return round(count / self.multi_gpu, 4) if self.multi_gpu else 1.0

        return {
            "multi_gpu_claims": self.multi_gpu,
            "multi_gpu_nvlink_optimal_share": share(self.best_available),
            "multi_gpu_ideal_set_share": share(self.ideal),
        }


class LossTerm(msgspec.Struct, frozen=True, kw_only=True):
    """What a placement costs one kind of future claim: fits lost, weighted by demand over supply."""

    kind: str
    demand: float  # expected claims of the kind (decayed count plus prior)
    supply: int  # claims of the kind the fleet fits now
    weight: float  # demand / supply
    fits_before: int  # on the chosen node
    fits_after: int
    loss: float  # weight * (fits_before - fits_after)


class CandidateScore(msgspec.Struct, frozen=True, kw_only=True):
    """One group of interchangeable nodes (same hardware, same state) and its best placement."""

    node: str  # the group's node that would be used
    nodes_alike: int  # nodes in the same state, any of which gives the same outcome
    loss: float  # demand-weighted loss of future claims, the first criterion
    nvlink_quality: float  # GPU set score / the best of that many GPUs on this hardware
    reconfigurations: int  # free MIG instances destroyed to make room
    mode_changes: int  # MIG mode switched on or off
    creates: int  # MIG instances created
    devices: list[str]


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """Why a claim went where it went: a typed record a person or a tool can read back."""

    policy: str
    claim_kind: str  # the kind the claim counts as in the demand mix; "" when not modelled
    chosen: CandidateScore | None = None
    terms: list[LossTerm] = []  # the chosen placement's loss, per kind it touches
    candidates: list[CandidateScore] = []  # the best groups, best first
    rejected: dict[str, int] = {}  # reason -> nodes
