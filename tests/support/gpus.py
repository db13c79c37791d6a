"""GPUs as NVML describes them, for the tests that build inventories by hand."""

from __future__ import annotations

from typing import Any

from tangram.events import GpuInfo


def h100(index: int, uuid: str, *, minor: int, pci_bus_id: str, **fields: Any) -> GpuInfo:
    """An H100 SXM5 80GB as NVML describes it, with the fields a test sets besides."""
    return GpuInfo(
        index=index,
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        product="H100-SXM5-80GB",
        architecture="hopper",
        cuda_compute_capability="9.0",
        pci_bus_id=pci_bus_id,
        minor=minor,
        memory_mib=81559,
        multiprocessors=132,
        **fields,
    )
