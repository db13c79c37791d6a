"""Hand-built nodes for the ResourceSlice tests, written from the observed hardware tables.

H100 80GB HBM3: `nvidia-smi mig -lgip` sizes (GiB x 1024 = MiB) and placements (`-lgipp`).
"""

from __future__ import annotations

from tangram.events.inventory import GpuInfo, MigInstance, MigPlacement, MigProfile, NodeHardware
from tests.support.gpus import h100

# (name, id, index, memory slices, compute slices, MiB, SMs, starts, +me)
H100_PROFILES = [
    ("1g.10gb", 19, 0, 1, 1, 9984, 16, [0, 1, 2, 3, 4, 5, 6], False),
    ("1g.10gb+me", 20, 7, 1, 1, 9984, 16, [0, 1, 2, 3, 4, 5, 6], True),
    ("1g.20gb", 15, 9, 2, 1, 20096, 26, [0, 2, 4, 6], False),
    ("2g.20gb", 14, 1, 2, 2, 20096, 32, [0, 2, 4], False),
    ("3g.40gb", 9, 2, 4, 3, 40448, 60, [0, 4], False),
    ("4g.40gb", 5, 3, 4, 4, 40448, 64, [0], False),
    ("7g.80gb", 0, 4, 8, 7, 81152, 132, [0], False),
]
A100_PROFILES = [
    ("1g.10gb", 19, 0, 1, 1, 9728, 14, [0, 1, 2, 3, 4, 5, 6], False),
    ("1g.10gb+me", 20, 7, 1, 1, 9728, 14, [0, 1, 2, 3, 4, 5, 6], True),
    ("1g.20gb", 15, 9, 2, 1, 19968, 14, [0, 2, 4, 6], False),
    ("2g.20gb", 14, 1, 2, 2, 19968, 28, [0, 2, 4], False),
    ("3g.40gb", 9, 2, 4, 3, 40448, 42, [0, 4], False),
    ("4g.40gb", 5, 3, 4, 4, 40448, 56, [0], False),
    ("7g.80gb", 0, 4, 8, 7, 81152, 98, [0], False),
]
H100_DEVICES_PER_GPU = 26  # whole GPU + 7 + 7 + 4 + 3 + 2 + 1 + 1 placements


def profiles(table: list[tuple[str, int, int, int, int, int, int, list[int], bool]]) -> list[MigProfile]:
    return [
        MigProfile(
            profile_id=pid,
            profile_index=index,
            name=name,
            compute_slices=cs,
            memory_slices=ms,
            memory_mib=mib,
            multiprocessors=sms,
            instance_count=len(starts) if not me else 1,
            placements=[MigPlacement(start=s, size=ms) for s in starts],
            media_extensions=me,
        )
        for name, pid, index, ms, cs, mib, sms, starts, me in table
    ]


def h100_node(node: str = "hgx-h100-1", *, health: list[str] | None = None) -> NodeHardware:
    gpus = [
        h100(
            i,
            f"GPU-1d6e0b7a-0000-4000-8000-00000000000{i}",
            minor=i,
            pci_bus_id=f"00000000:{0x18 + 16 * i:02x}:00.0",
            numa_node=0 if i < 4 else 1,
            pcie_root=f"pci0000:{0x15 + 16 * i:02x}",
            nvlink_domain="nvswitch-0",
            mig_capable=True,
            mig_enabled=i == 1,
            memory_slices=8,
            compute_slices=7,
            mig_profiles=profiles(H100_PROFILES),
            mig_instances=(
                [
                    MigInstance(
                        uuid="MIG-5c3f0f6e-1111-4222-8333-444455556666",
                        profile_id=9,
                        profile="3g.40gb",
                        placement=MigPlacement(start=4, size=4),
                        gpu_instance_id=2,
                        compute_instance_id=0,
                    )
                ]
                if i == 1
                else []
            ),
            health="healthy" if health is None else health[i],  # type: ignore[arg-type]
        )
        for i in range(8)
    ]
    return NodeHardware(node=node, driver_version="565.57.01", cuda_driver_version="12.7", gpus=gpus)


def l40s_node(node: str = "l40s-1", count: int = 4, unhealthy: frozenset[int] = frozenset()) -> NodeHardware:
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-7a7a0000-0000-4000-8000-{i:012d}",
            name="NVIDIA L40S",
            product="L40S",
            architecture="ada",
            cuda_compute_capability="8.9",
            pci_bus_id=f"00000000:{(i % 200) + 1:02x}:00.0",
            minor=i,
            memory_mib=46068,
            multiprocessors=142,
            numa_node=0 if i < count // 2 else 1,
            pcie_root=f"pci0000:{i % 256:02x}",
            health="unhealthy" if i in unhealthy else "healthy",
        )
        for i in range(count)
    ]
    return NodeHardware(node=node, driver_version="550.127.05", gpus=gpus)


def a100_node(node: str = "a100-1", *, mig_enabled: bool) -> NodeHardware:
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-a1000000-0000-4000-8000-00000000000{i}",
            name="NVIDIA A100 80GB PCIe",
            product="A100-PCIE-80GB",
            architecture="ampere",
            cuda_compute_capability="8.0",
            pci_bus_id=f"00000000:{0x17 + 16 * i:02x}:00.0",
            minor=i,
            memory_mib=81920,
            multiprocessors=108,
            numa_node=i // 2,
            pcie_root=f"pci0000:{0x16 + 16 * i:02x}",
            nvlink_domain=f"bridge-{i // 2}",
            mig_capable=True,
            mig_enabled=mig_enabled,
            mig_toggle_needs_reset=True,
            memory_slices=8,
            compute_slices=7,
            mig_profiles=profiles(A100_PROFILES),
        )
        for i in range(4)
    ]
    return NodeHardware(node=node, driver_version="555.42.02", gpus=gpus)
