"""Live MIG reconfiguration on a node: the NVML executor and the pure decisions around it."""

from tangram.partitioning.errors import PartitionError, nvml_error_name
from tangram.partitioning.executor import GpuRef, InstanceNotFound, MigExecutor
from tangram.partitioning.ledger import PartitionLedger, PartitionResult, kept_warm
from tangram.partitioning.model import CreatedInstance, DestroyedInstance, InstanceKey, ObservedInstance
from tangram.partitioning.policy import (
    WarmPoolError,
    enable_mig_refusal,
    keep_warm,
    mig_toggle_needs_reset,
    parse_warm_pool,
    should_disable_mig,
)
from tangram.partitioning.reconcile import CleanMode, Finding, reconcile, to_clean

__all__ = [
    "CleanMode",
    "CreatedInstance",
    "DestroyedInstance",
    "Finding",
    "GpuRef",
    "InstanceKey",
    "InstanceNotFound",
    "MigExecutor",
    "ObservedInstance",
    "PartitionError",
    "PartitionLedger",
    "PartitionResult",
    "WarmPoolError",
    "enable_mig_refusal",
    "keep_warm",
    "kept_warm",
    "mig_toggle_needs_reset",
    "nvml_error_name",
    "parse_warm_pool",
    "reconcile",
    "should_disable_mig",
    "to_clean",
]
