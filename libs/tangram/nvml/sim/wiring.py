"""What a simulated machine's PCIe tree and NVLink wiring answer to NVML's topology calls."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tangram.hardware.machines import GpuSpec, MachineSpec
from tangram.hardware.topology import (
    LEVEL_HOSTBRIDGE,
    LEVEL_INTERNAL,
    LEVEL_MULTIPLE,
    LEVEL_NODE,
    LEVEL_SINGLE,
    LEVEL_SYSTEM,
)

_UUID_NAMESPACE = uuid.UUID("6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26")


def gpu_uuid(machine: MachineSpec, index: int) -> str:
    explicit = machine.gpus[index].uuid
    return explicit or f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{machine.name}/{index}')}"


def mig_uuid(parent_uuid: str, gi: int, ci: int, generation: int) -> str:
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{parent_uuid}/{gi}/{ci}/{generation}')}"


def pcie_level(a: GpuSpec, b: GpuSpec) -> int:
    """nvmlDeviceGetTopologyCommonAncestor for two GPUs of one machine."""
    if a.pci_bus_id == b.pci_bus_id:
        return LEVEL_INTERNAL
    if a.pcie_root == b.pcie_root:
        if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
            return LEVEL_SINGLE
        if a.pcie_switch is not None and b.pcie_switch is not None:
            return LEVEL_MULTIPLE
        return LEVEL_HOSTBRIDGE
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return LEVEL_NODE
    return LEVEL_SYSTEM


@dataclass(frozen=True, slots=True)
class LinkEnd:
    remote_pci_bus_id: str
    remote_is_switch: bool


def switch_pci_bus_id(switch: int) -> str:
    return f"00000000:{0xC0 + switch:02X}:00.0"


def link_end(machine: MachineSpec, index: int, link: int) -> LinkEnd | None:
    """Where NVLink `link` of GPU `index` ends; None when the link is not wired (inactive)."""
    spec = machine.gpus[index].spec.nvlink
    if spec is None or link >= spec.links:
        return None
    if machine.switch_attached(index):
        assert machine.nvlink.switch is not None
        return LinkEnd(switch_pci_bus_id(link % machine.nvlink.switch.switches), remote_is_switch=True)
    peer = machine.bridge_peer(index)
    if peer is None:
        return None
    peer_spec = machine.gpus[peer].spec.nvlink
    if peer_spec is None or link >= peer_spec.links:
        return None
    return LinkEnd(machine.gpus[peer].pci_bus_id.upper(), remote_is_switch=False)


def nvlink_connected(machine: MachineSpec, a: int, b: int) -> bool:
    if a == b:
        return False
    if machine.switch_attached(a) and machine.switch_attached(b):
        return True
    return machine.bridge_peer(a) == b
