"""Nodes built by hand for the allocator tests, with the MIG profile tables observed on real GPUs."""

from __future__ import annotations

from itertools import combinations
from typing import Any

from tangram.allocation import Claim, DeviceClass
from tangram.events.inventory import GpuInfo, GpuLink, MigInstance, MigPlacement, MigProfile, NodeHardware
from tests.support.driver import DRIVER

GIB = 1024

# (name, id, compute slices, memory slices, GiB as nvidia-smi prints it, SMs, starts)
H100_PROFILES = [
    ("1g.10gb", 19, 1, 1, 9.75, 16, range(7)),
    ("1g.10gb+me", 20, 1, 1, 9.75, 16, range(7)),
    ("1g.20gb", 15, 1, 2, 19.62, 26, (0, 2, 4, 6)),
    ("2g.20gb", 14, 2, 2, 19.62, 32, (0, 2, 4)),
    ("3g.40gb", 9, 3, 4, 39.50, 60, (0, 4)),
    ("4g.40gb", 5, 4, 4, 39.50, 64, (0,)),
    ("7g.80gb", 0, 7, 8, 79.25, 132, (0,)),
]
H200_PROFILES = [
    ("1g.18gb", 19, 1, 1, 16.00, 16, range(7)),
    ("1g.18gb+me", 20, 1, 1, 16.00, 16, range(7)),
    ("1g.35gb", 15, 1, 2, 32.25, 26, (0, 2, 4, 6)),
    ("2g.35gb", 14, 2, 2, 32.25, 32, (0, 2, 4)),
    ("3g.71gb", 9, 3, 4, 69.50, 60, (0, 4)),
    ("4g.71gb", 5, 4, 4, 69.50, 64, (0,)),
    ("7g.141gb", 0, 7, 8, 139.75, 132, (0,)),
]
A100_80_PROFILES = [
    ("1g.10gb", 19, 1, 1, 9.50, 14, range(7)),
    ("1g.10gb+me", 20, 1, 1, 9.50, 14, range(7)),
    ("1g.20gb", 15, 1, 2, 19.50, 14, (0, 2, 4, 6)),
    ("2g.20gb", 14, 2, 2, 19.50, 28, (0, 2, 4)),
    ("3g.40gb", 9, 3, 4, 39.25, 42, (0, 4)),
    ("4g.40gb", 5, 4, 4, 39.25, 56, (0,)),
    ("7g.80gb", 0, 7, 8, 79.00, 98, (0,)),
]
_INDEX = {19: 0, 20: 1, 15: 2, 14: 3, 9: 4, 5: 5, 0: 6}


def profiles(table: list[tuple[Any, ...]]) -> list[MigProfile]:
    out = []
    for name, pid, compute, memory, gib, sms, starts in table:
        out.append(
            MigProfile(
                profile_id=pid,
                profile_index=_INDEX[pid],
                name=name,
                compute_slices=compute,
                memory_slices=memory,
                memory_mib=round(gib * GIB),
                multiprocessors=sms,
                instance_count=len(list(starts)) if pid != 20 else 1,
                placements=[MigPlacement(start=s, size=memory) for s in starts],
                media_extensions=name.endswith("+me"),
            )
        )
    return out


def _gpu(node: str, index: int, kind: str, **extra: Any) -> GpuInfo:
    common: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{node}-{index}",
        "pci_bus_id": f"00000000:{0x18 + index:02x}:00.0",
        "minor": index,
        "numa_node": 0 if index < 4 else 1,
        "pcie_root": f"pci0000:{0 if index < 4 else 8}0",
    }
    if kind == "h100":
        spec = {
            "name": "NVIDIA H100 80GB HBM3",
            "product": "H100-SXM5-80GB",
            "architecture": "hopper",
            "cuda_compute_capability": "9.0",
            "memory_mib": 81559,
            "multiprocessors": 132,
            "mig_capable": True,
            "memory_slices": 8,
            "compute_slices": 7,
            "mig_profiles": profiles(H100_PROFILES),
        }
    elif kind == "h200":
        spec = {
            "name": "NVIDIA H200",
            "product": "H200-SXM5-141GB",
            "architecture": "hopper",
            "cuda_compute_capability": "9.0",
            "memory_mib": 143771,
            "multiprocessors": 132,
            "mig_capable": True,
            "memory_slices": 8,
            "compute_slices": 7,
            "mig_profiles": profiles(H200_PROFILES),
        }
    elif kind == "h100-nvl":
        spec = {
            "name": "NVIDIA H100 NVL",
            "product": "H100-NVL-94GB",
            "architecture": "hopper",
            "cuda_compute_capability": "9.0",
            "memory_mib": 95830,
            "multiprocessors": 132,
        }
    elif kind == "l40s":
        spec = {
            "name": "NVIDIA L40S",
            "product": "L40S-48GB",
            "architecture": "ada",
            "cuda_compute_capability": "8.9",
            "memory_mib": 46068,
            "multiprocessors": 142,
        }
    elif kind == "a100":
        spec = {
            "name": "NVIDIA A100 80GB PCIe",
            "product": "A100-PCIE-80GB",
            "architecture": "ampere",
            "cuda_compute_capability": "8.0",
            "memory_mib": 81920,
            "multiprocessors": 108,
            "mig_capable": True,
            "mig_enabled": True,
            "mig_toggle_needs_reset": True,
            "memory_slices": 8,
            "compute_slices": 7,
            "mig_profiles": profiles(A100_80_PROFILES),
        }
    else:
        raise ValueError(kind)
    common.update(spec)
    common.update(extra)
    return GpuInfo(**common)


def _links(n: int, nvlinked: dict[tuple[int, int], tuple[int, float]], level_of: Any) -> list[GpuLink]:
    links = []
    for a, b in combinations(range(n), 2):
        nv, bw = nvlinked.get((a, b), (0, 0.0))
        links.append(GpuLink(a=a, b=b, nvlinks=nv, bandwidth_gbps=bw, pcie_level=level_of(a, b)))
    return links


def _numa_level(a: int, b: int) -> int:
    return 40 if (a < 4) == (b < 4) else 50


def hgx(node: str, kind: str = "h100", gpu_extra: dict[int, dict[str, Any]] | None = None) -> NodeHardware:
    """HGX/DGX: 8 GPUs, every pair NV18 through NVSwitch, 900 GB/s."""
    extra = gpu_extra or {}
    gpus = [_gpu(node, i, kind, nvlink_domain=f"{node}/nvswitch-0", **extra.get(i, {})) for i in range(8)]
    nvlinked = {(a, b): (18, 900.0) for a, b in combinations(range(8), 2)}
    return NodeHardware(
        node=node, driver_version="580.95.5", gpus=gpus, links=_links(8, nvlinked, _numa_level)
    )


def h100_nvl(node: str, gpus: int = 8) -> NodeHardware:
    """8x H100 NVL: bridges join 0-1, 2-3, 4-5, 6-7 (NV12, 600 GB/s); other pairs PCIe by NUMA node."""
    infos = [
        _gpu(node, i, "h100-nvl", nvlink_domain=f"{node}/nvlink-{i - i % 2}-{i - i % 2 + 1}")
        for i in range(gpus)
    ]
    nvlinked = {(a, a + 1): (12, 600.0) for a in range(0, gpus, 2)}

    def level(a: int, b: int) -> int:
        if b == a + 1 and a % 2 == 0:
            return 10
        return _numa_level(a, b)

    return NodeHardware(
        node=node, driver_version="570.195.3", gpus=infos, links=_links(gpus, nvlinked, level)
    )


def l40s(node: str, health: dict[int, str] | None = None) -> NodeHardware:
    """8x L40S over two NUMA nodes, no NVLink."""
    health = health or {}
    gpus = [_gpu(node, i, "l40s", health=health.get(i, "healthy")) for i in range(8)]
    return NodeHardware(node=node, driver_version="550.127.5", gpus=gpus, links=_links(8, {}, _numa_level))


def a100_mig(node: str, instances: dict[int, list[MigInstance]] | None = None) -> NodeHardware:
    """4x A100 80GB PCIe, MIG on (Ampere: only MIG devices advertised), bridged pairs 0-1 and 2-3."""
    instances = instances or {}
    gpus = [_gpu(node, i, "a100", numa_node=i // 2, mig_instances=instances.get(i, [])) for i in range(4)]
    nvlinked = {(0, 1): (12, 300.0), (2, 3): (12, 300.0)}
    return NodeHardware(
        node=node, driver_version="555.42.2", gpus=gpus, links=_links(4, nvlinked, lambda a, b: 50)
    )


def device_class(name: str, *selectors: str, config: list[dict[str, Any]] | None = None) -> DeviceClass:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": s}} for s in selectors]}
    if config:
        spec["config"] = config
    return DeviceClass.from_manifest(
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}
    )


CLASSES = {
    "gpu.tangram.dev": device_class(
        "gpu.tangram.dev", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
    ),
    "mig.gpu.tangram.dev": device_class(
        "mig.gpu.tangram.dev", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig"'
    ),
    "any.gpu.tangram.dev": device_class("any.gpu.tangram.dev", f'device.driver == "{DRIVER}"'),
}


def request(
    name: str = "gpus",
    device_class: str = "gpu.tangram.dev",
    count: int | None = None,
    selectors: tuple[str, ...] = (),
    **extra: Any,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count is not None:
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    exactly.update(extra)
    return {"name": name, "exactly": exactly}


def claim(name: str, *requests: dict[str, Any], **devices: Any) -> Claim:
    spec = {"devices": {"requests": list(requests), **devices}}
    return Claim(namespace="default", name=name, uid=f"uid-{name}", spec=spec)


def profile_is(profile: str) -> str:
    return f'device.attributes["{DRIVER}"].profile == "{profile}"'


def index_is(*indexes: int) -> str:
    return " || ".join(f'device.attributes["{DRIVER}"].index == {i}' for i in indexes)


def nvlink_config(*requests: str) -> list[dict[str, Any]]:
    """Tangram's opaque TopologyConfig asking for NVLink-connected GPUs."""
    return [
        {
            "requests": list(requests),
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tangram.dev/v1alpha1",
                    "kind": "TopologyConfig",
                    "interconnect": "NVLink",
                },
            },
        }
    ]
