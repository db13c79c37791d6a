"""The allocator's pure decision engine: DRA claim semantics, topology- and fragmentation-aware placement."""

from tangram.allocation.fleet import FleetState
from tangram.allocation.model import (
    POLICIES,
    Allocated,
    Claim,
    Decision,
    Failed,
    FleetMetrics,
    NvlinkTally,
    PartitionPlan,
    Policy,
    Release,
)
from tangram.allocation.spec import (
    DeviceClass,
    ResourceClaimSpec,
    parse_claim_spec,
)
from tangram.dra.config import TopologyConfig

__all__ = [
    "POLICIES",
    "Allocated",
    "Claim",
    "Decision",
    "DeviceClass",
    "Failed",
    "FleetMetrics",
    "FleetState",
    "NvlinkTally",
    "PartitionPlan",
    "Policy",
    "Release",
    "ResourceClaimSpec",
    "TopologyConfig",
    "parse_claim_spec",
]
