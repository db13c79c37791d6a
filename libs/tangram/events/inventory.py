"""What discovery knows about one node's GPUs: the contract between discovery, allocator and partitioner.

Units are converted once, at the NVML boundary: memory in MiB, bandwidth in GB/s.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec

Health = Literal["healthy", "unhealthy"]


class MigPlacement(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU-instance placement in memory-slice units."""

    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


class MigProfile(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU-instance profile as NVML reports it for one GPU."""

    profile_id: int  # the real GI profile id (19 for 1g.10gb), not the profile index constant
    profile_index: int  # NVML_GPU_INSTANCE_PROFILE_* index used to query it
    name: str  # as NVIDIA spells it for this product: "3g.71gb", "1g.10gb+me"
    compute_slices: int
    memory_slices: int
    memory_mib: int
    multiprocessors: int
    instance_count: int
    placements: list[MigPlacement]
    media_extensions: bool = False


class MigInstance(msgspec.Struct, frozen=True, kw_only=True):
    """A MIG device that exists on the GPU now (a GPU instance with its compute instance)."""

    uuid: str
    profile_id: int
    profile: str
    placement: MigPlacement
    gpu_instance_id: int
    compute_instance_id: int
    in_use: bool = False  # processes are running on it
    gi_cap_minor: int = -1  # /dev/nvidia-caps/nvidia-cap<N> of the GPU instance, -1 when unknown
    ci_cap_minor: int = -1  # ... of the compute instance


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    name: str  # NVML name: "NVIDIA H100 80GB HBM3"
    product: str  # catalogue key: "H100-SXM5-80GB"
    architecture: str  # "hopper"
    cuda_compute_capability: str  # "9.0"
    pci_bus_id: str  # "00000000:18:00.0"
    minor: int  # /dev/nvidia<minor>
    memory_mib: int
    multiprocessors: int
    numa_node: int | None = None
    pcie_root: str | None = None  # PCI root complex, e.g. "pci0000:00"
    nvlink_domain: str | None = None  # GPUs sharing a value are pairwise NVLink-connected
    clique_id: str | None = None  # NVLink fabric clique ("<cluster uuid>.<clique>")
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_toggle_needs_reset: bool = False  # Ampere: MIG mode change needs a GPU reset
    memory_slices: int = 0
    compute_slices: int = 0
    mig_profiles: list[MigProfile] = []
    mig_instances: list[MigInstance] = []
    processes: int = 0  # compute processes on the whole GPU
    health: Health = "healthy"
    health_reason: str = ""
    fabric_degraded: bool = False  # the fabric reports the GPU's NVLink bandwidth degraded


class GpuLink(msgspec.Struct, frozen=True, kw_only=True):
    """How two GPUs of one node are connected; a, b are GPU indexes with a < b."""

    a: int
    b: int
    nvlinks: int  # NVLink links between the pair (switch-attached links count: NV18 on HGX)
    bandwidth_gbps: float  # NVLink bandwidth between the pair, 0 when none
    # NVML topology level: 0 INTERNAL, 10 SINGLE, 20 MULTIPLE, 30 HOSTBRIDGE, 40 NODE, 50 SYSTEM
    pcie_level: int
    p2p: bool = True


class NodeHardware(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    driver_version: str  # semver-ish "580.95.5"
    cuda_driver_version: str = ""
    gpus: list[GpuInfo] = []
    links: list[GpuLink] = []
    # The network block the node sits under (the value of its Node's block topology label, e.g.
    # `network.topology.kubernetes.io/block`): a group of pods spread over several nodes is kept
    # under one block where it fits. "" when the node has no such label.
    network_block: str = ""


def renamed_machine(template: NodeHardware, node: str) -> NodeHardware:
    """The same machine under another name: GPU UUIDs are made unique per node, as on real hardware."""
    gpus = [
        msgspec.structs.replace(
            g,
            uuid=_uuid(node, g.uuid),
            nvlink_domain=g.nvlink_domain.replace("template", node, 1) if g.nvlink_domain else None,
            mig_instances=[msgspec.structs.replace(m, uuid=_uuid(node, m.uuid)) for m in g.mig_instances],
        )
        for g in template.gpus
    ]
    return msgspec.structs.replace(template, node=node, gpus=gpus)


def _uuid(node: str, uuid: str) -> str:
    prefix = uuid.split("-", 1)[0] if "-" in uuid else "GPU"
    digest = hashlib.sha1(f"{node}/{uuid}".encode(), usedforsecurity=False).hexdigest()
    return f"{prefix}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
