"""`tangram chaos --kubernetes`: pods with Tangram claims on the real control plane while the
allocators, the webhook, node services and the API server itself are killed."""

from tangram.chaos.kube.config import KubeChaosConfig
from tangram.chaos.kube.faults import KUBE_FAULT_KINDS, KubeFaultKind
from tangram.chaos.kube.run import kube_chaos

__all__ = ["KUBE_FAULT_KINDS", "KubeChaosConfig", "KubeFaultKind", "kube_chaos"]
