"""`tangram chaos`: faults injected while claims flow through every service; invariants checked after."""

from tangram.chaos.config import DEFAULT_NODES, ChaosConfig
from tangram.chaos.faults import FAULT_KINDS, FaultKind, fault_order
from tangram.chaos.run import ChaosRun, chaos

__all__ = ["DEFAULT_NODES", "FAULT_KINDS", "ChaosConfig", "ChaosRun", "FaultKind", "chaos", "fault_order"]
