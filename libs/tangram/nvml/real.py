"""The real NVML backend: a thin pass-through to pynvml, plus the sysfs lookup NVML lacks."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pynvml

from tangram.nvml.backend import ComputeInstance, Device, EventSet, GpuInstance, NvmlUnavailable

_SYS_PCI = Path("/sys/bus/pci/devices")


def sysfs_pcie_root(pci_bus_id: str) -> str | None:
    """ "00000000:18:00.0" -> the "pciDDDD:BB" root complex above it, from the sysfs device path."""
    domain, _, rest = pci_bus_id.lower().partition(":")
    short = f"{domain[-4:]}:{rest}"
    try:
        target = os.path.realpath(_SYS_PCI / short)
    except OSError:
        return None
    match = re.search(r"/devices/(pci[0-9a-f]{4}:[0-9a-f]{2})/", target)
    return match.group(1) if match else None


class RealNvml:
    """Every call goes straight to pynvml; errors stay pynvml.NVMLError."""

    def nvmlInit(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVIDIA driver not usable: {exc}") from None

    def pcie_root_of(self, pci_bus_id: str) -> str | None:
        return sysfs_pcie_root(pci_bus_id)

    def nvmlShutdown(self) -> None:
        pynvml.nvmlShutdown()

    def nvmlSystemGetDriverVersion(self) -> str:
        result: str = pynvml.nvmlSystemGetDriverVersion()
        return result

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        result: int = pynvml.nvmlSystemGetCudaDriverVersion()
        return result

    def nvmlDeviceGetCount(self) -> int:
        result: int = pynvml.nvmlDeviceGetCount()
        return result

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Device:
        result: Device = pynvml.nvmlDeviceGetHandleByIndex(index)
        return result

    def nvmlDeviceGetUUID(self, device: Device) -> str:
        result: str = pynvml.nvmlDeviceGetUUID(device)
        return result

    def nvmlDeviceGetName(self, device: Device) -> str:
        result: str = pynvml.nvmlDeviceGetName(device)
        return result

    def nvmlDeviceGetPciInfo(self, device: Device) -> Any:
        result: Any = pynvml.nvmlDeviceGetPciInfo(device)
        return result

    def nvmlDeviceGetMinorNumber(self, device: Device) -> int:
        result: int = pynvml.nvmlDeviceGetMinorNumber(device)
        return result

    def nvmlDeviceGetMemoryInfo(self, device: Device) -> Any:
        result: Any = pynvml.nvmlDeviceGetMemoryInfo(device)
        return result

    def nvmlDeviceGetCudaComputeCapability(self, device: Device) -> tuple[int, int]:
        result: tuple[int, int] = pynvml.nvmlDeviceGetCudaComputeCapability(device)
        return result

    def nvmlDeviceGetNumGpuCores(self, device: Device) -> int:
        result: int = pynvml.nvmlDeviceGetNumGpuCores(device)
        return result

    def nvmlDeviceGetAttributes(self, device: Device) -> Any:
        result: Any = pynvml.nvmlDeviceGetAttributes(device)
        return result

    def nvmlDeviceGetNumaNodeId(self, device: Device) -> int:
        result: int = pynvml.nvmlDeviceGetNumaNodeId(device)
        return result

    def nvmlDeviceGetComputeRunningProcesses(self, device: Device) -> list[Any]:
        result: list[Any] = pynvml.nvmlDeviceGetComputeRunningProcesses(device)
        return result

    def nvmlDeviceGetComputeMode(self, device: Device) -> int:
        result: int = pynvml.nvmlDeviceGetComputeMode(device)
        return result

    def nvmlDeviceSetComputeMode(self, device: Device, mode: int) -> None:
        pynvml.nvmlDeviceSetComputeMode(device, mode)

    def nvmlDeviceGetMigMode(self, device: Device) -> list[int]:
        result: list[int] = pynvml.nvmlDeviceGetMigMode(device)
        return result

    def nvmlDeviceSetMigMode(self, device: Device, mode: int) -> int:
        result: int = pynvml.nvmlDeviceSetMigMode(device, mode)
        return result

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Device, profile: int, version: int = 2) -> Any:
        result: Any = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, profile, version)
        return result

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Device, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        result: int = pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            device, profileId, placementsRef, countRef
        )
        return result

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Device, profileId: int, placement: Any
    ) -> GpuInstance:
        result: GpuInstance = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profileId, placement)
        return result

    def nvmlDeviceGetGpuInstances(
        self, device: Device, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        result: int = pynvml.nvmlDeviceGetGpuInstances(device, profileId, gpuInstancesRef, countRef)
        return result

    def nvmlDeviceGetGpuInstanceById(self, device: Device, gpuInstanceId: int) -> GpuInstance:
        result: GpuInstance = pynvml.nvmlDeviceGetGpuInstanceById(device, gpuInstanceId)
        return result

    def nvmlGpuInstanceGetInfo(self, gpuInstance: GpuInstance) -> Any:
        result: Any = pynvml.nvmlGpuInstanceGetInfo(gpuInstance)
        return result

    def nvmlGpuInstanceDestroy(self, gpuInstance: GpuInstance) -> int:
        result: int = pynvml.nvmlGpuInstanceDestroy(gpuInstance)
        return result

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: GpuInstance, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        result: Any = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            device, profile, engProfile, version
        )
        return result

    def nvmlGpuInstanceCreateComputeInstance(
        self, gpuInstance: GpuInstance, profileId: int
    ) -> ComputeInstance:
        result: ComputeInstance = pynvml.nvmlGpuInstanceCreateComputeInstance(gpuInstance, profileId)
        return result

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: GpuInstance, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        result: int = pynvml.nvmlGpuInstanceGetComputeInstances(
            gpuInstance, profileId, computeInstancesRef, countRef
        )
        return result

    def nvmlComputeInstanceGetInfo(self, computeInstance: ComputeInstance) -> Any:
        result: Any = pynvml.nvmlComputeInstanceGetInfo(computeInstance)
        return result

    def nvmlComputeInstanceDestroy(self, computeInstance: ComputeInstance) -> int:
        result: int = pynvml.nvmlComputeInstanceDestroy(computeInstance)
        return result

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Device) -> int:
        result: int = pynvml.nvmlDeviceGetMaxMigDeviceCount(device)
        return result

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Device, index: int) -> Device:
        result: Device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, index)
        return result

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Device) -> Device:
        result: Device = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice)
        return result

    def nvmlDeviceGetGpuInstanceId(self, device: Device) -> int:
        result: int = pynvml.nvmlDeviceGetGpuInstanceId(device)
        return result

    def nvmlDeviceGetComputeInstanceId(self, device: Device) -> int:
        result: int = pynvml.nvmlDeviceGetComputeInstanceId(device)
        return result

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Device, device2: Device) -> int:
        result: int = pynvml.nvmlDeviceGetTopologyCommonAncestor(device1, device2)
        return result

    def nvmlDeviceGetNvLinkState(self, device: Device, link: int) -> int:
        result: int = pynvml.nvmlDeviceGetNvLinkState(device, link)
        return result

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Device, link: int) -> Any:
        result: Any = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(device, link)
        return result

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Device, link: int) -> int:
        result: int = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        return result

    def nvmlDeviceGetP2PStatus(self, device1: Device, device2: Device, p2pIndex: int) -> int:
        result: int = pynvml.nvmlDeviceGetP2PStatus(device1, device2, p2pIndex)
        return result

    def nvmlDeviceGetGpuFabricInfoV(self, device: Device, gpuFabricInfo: Any) -> int:
        result: int = pynvml.nvmlDeviceGetGpuFabricInfoV(device, gpuFabricInfo)
        return result

    def nvmlEventSetCreate(self) -> EventSet:
        result: EventSet = pynvml.nvmlEventSetCreate()
        return result

    def nvmlDeviceRegisterEvents(self, handle: Device, eventTypes: int, eventSet: EventSet) -> None:
        pynvml.nvmlDeviceRegisterEvents(handle, eventTypes, eventSet)

    def nvmlEventSetWait(self, eventSet: EventSet, timeoutms: int) -> Any:
        result: Any = pynvml.nvmlEventSetWait(eventSet, timeoutms)
        return result

    def nvmlEventSetFree(self, eventSet: EventSet) -> None:
        pynvml.nvmlEventSetFree(eventSet)
