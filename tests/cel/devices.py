"""Devices as discovery renders them, for selector tests."""

from __future__ import annotations

from tangram.dra.model import Device, Version

GIB = 1024**3
MIB = 1024**2


def h100(**attributes: object) -> Device:
    base: dict[str, object] = {
        "gpu.tangram.dev/type": "gpu",
        "gpu.tangram.dev/uuid": "GPU-6f1c2a5e-0b1d-4c1e-9a51-3b7f0e2d9c11",
        "gpu.tangram.dev/productName": "NVIDIA H100 80GB HBM3",
        "gpu.tangram.dev/architecture": "Hopper",
        "gpu.tangram.dev/cudaComputeCapability": Version("9.0.0"),
        "gpu.tangram.dev/driverVersion": Version("580.95.5"),
        "gpu.tangram.dev/index": 3,
        "gpu.tangram.dev/migCapable": True,
        "resource.kubernetes.io/pcieRoot": "pci0000:40",
        "resource.kubernetes.io/numaNode": 0,
    }
    base.update(attributes)
    return Device(
        name="gpu-3",
        kind="gpu",
        gpu_index=3,
        gpu_uuid="GPU-6f1c2a5e-0b1d-4c1e-9a51-3b7f0e2d9c11",
        attributes=base,  # type: ignore[arg-type]
        capacity={"gpu.tangram.dev/memory": 80 * GIB, "gpu.tangram.dev/multiprocessors": 132},
    )


def mig_3g() -> Device:
    return Device(
        name="gpu-3-mig-3g-40gb-4",
        kind="mig",
        gpu_index=3,
        gpu_uuid="GPU-6f1c2a5e-0b1d-4c1e-9a51-3b7f0e2d9c11",
        attributes={
            "gpu.tangram.dev/type": "mig",
            "gpu.tangram.dev/profile": "3g.40gb",
            "gpu.tangram.dev/parentUUID": "GPU-6f1c2a5e-0b1d-4c1e-9a51-3b7f0e2d9c11",
            "gpu.tangram.dev/productName": "NVIDIA H100 80GB HBM3",
            "gpu.tangram.dev/driverVersion": Version("580.95.5"),
            "resource.kubernetes.io/pcieRoot": "pci0000:40",
        },
        capacity={"gpu.tangram.dev/memory": 40448 * MIB, "gpu.tangram.dev/multiprocessors": 60},
        profile="3g.40gb",
    )
