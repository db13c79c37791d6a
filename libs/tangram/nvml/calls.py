"""List-returning wrappers for the NVML calls that fill caller-provided arrays."""

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
