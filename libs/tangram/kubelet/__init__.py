"""The kubelet DRA plugin: registration and DRA gRPC services on unix sockets, backed by CDI specs."""

from tangram.kubelet.allocations import AllocationSource, AllocationUnavailable, InMemoryAllocationSource
from tangram.kubelet.config import KUBELET_CALL_TIMEOUT_S, PluginConfig
from tangram.kubelet.health import HealthBoard
from tangram.kubelet.plugin import build_plugin
from tangram.kubelet.preparer import ClaimEvent, ClaimPreparer, EventSink, PrepareOutcome, RecoveryReport
from tangram.kubelet.server import KubeletPlugin
from tangram.kubelet.servicers import SUPPORTED_VERSIONS, RegistrationState

__all__ = [
    "KUBELET_CALL_TIMEOUT_S",
    "SUPPORTED_VERSIONS",
    "AllocationSource",
    "AllocationUnavailable",
    "ClaimEvent",
    "ClaimPreparer",
    "EventSink",
    "HealthBoard",
    "InMemoryAllocationSource",
    "KubeletPlugin",
    "PluginConfig",
    "PrepareOutcome",
    "RecoveryReport",
    "RegistrationState",
    "build_plugin",
]
