"""Helpers over NVML calls: list-returning wrappers for the calls that fill caller-provided arrays,
text as str (pynvml returns bytes or str by version), and the MIG devices of a GPU."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from tangram.nvml.backend import ComputeInstance, Device, GpuInstance, NvmlBackend


def possible_placements(nvml: NvmlBackend, device: Device, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) in memory slices for every placement NVML allows for a GI profile."""
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, None, ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, array, ctypes.byref(count))
    return [(array[i].start, array[i].size) for i in range(count.value)]


def gpu_instances(nvml: NvmlBackend, device: Device, profile_id: int, capacity: int) -> list[GpuInstance]:
    array = (pynvml.c_nvmlGpuInstance_t * max(capacity, 1))()
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstances(device, profile_id, array, ctypes.byref(count))
    return [array[i] for i in range(count.value)]


def compute_instances(
    nvml: NvmlBackend, gpu_instance: GpuInstance, profile_id: int, capacity: int = 8
) -> list[ComputeInstance]:
    array = (pynvml.c_nvmlComputeInstance_t * max(capacity, 1))()
    count = ctypes.c_uint(0)
    nvml.nvmlGpuInstanceGetComputeInstances(gpu_instance, profile_id, array, ctypes.byref(count))
    return [array[i] for i in range(count.value)]


def create_gpu_instance(
    nvml: NvmlBackend, device: Device, profile_id: int, start: int, size: int
) -> GpuInstance:
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = start, size
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profile_id, ctypes.byref(placement))


def fabric_info(nvml: NvmlBackend, device: Device) -> Any:
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(device, ctypes.byref(info))
    return info


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def profile_name(raw: str | bytes) -> str:
    """A GPU-instance profile's name as nvidia-smi prints it: "MIG 3g.71gb" -> "3g.71gb"."""
    return text(raw).removeprefix("MIG ").strip()


def mig_devices(nvml: NvmlBackend, device: Device) -> dict[tuple[int, int], tuple[str, bool]]:
    """(GPU instance id, compute instance id) -> (MIG device UUID, has processes)."""
    found: dict[tuple[int, int], tuple[str, bool]] = {}
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, index)
        except pynvml.NVMLError_NotFound:
            continue
        key = (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig))
        found[key] = (text(nvml.nvmlDeviceGetUUID(mig)), bool(nvml.nvmlDeviceGetComputeRunningProcesses(mig)))
    return found
