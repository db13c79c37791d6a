"""A whole GPU's compute mode, read and set through NVML by the GPU's UUID.

MPS on a whole GPU wants EXCLUSIVE_PROCESS: the MPS server is then the GPU's only CUDA context, and
a process that bypasses MPS is refused instead of sharing the GPU outside the clients' limits. A MIG
device is never given a compute mode (the driver refuses it); its MPS daemon runs without one.
"""

from __future__ import annotations

import pynvml

from tangram.nvml.backend import Device, NvmlBackend
from tangram.sharing.devices import is_whole_gpu

EXCLUSIVE_PROCESS = int(pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
DEFAULT = int(pynvml.NVML_COMPUTEMODE_DEFAULT)


class UnknownGpu(LookupError):
    """No GPU of the node has the UUID."""


class ComputeModes:
    """Blocking NVML calls: run them in a thread from async code."""

    def __init__(self, nvml: NvmlBackend) -> None:
        self._nvml = nvml

    def _handle(self, gpu_uuid: str) -> Device:
        if not is_whole_gpu(gpu_uuid):
            raise ValueError(f"{gpu_uuid} is not a whole GPU: only a GPU has a compute mode to set")
        for index in range(self._nvml.nvmlDeviceGetCount()):
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            if self._nvml.nvmlDeviceGetUUID(handle) == gpu_uuid:
                return handle
        raise UnknownGpu(f"no GPU {gpu_uuid} on this node")

    def get(self, gpu_uuid: str) -> int:
        return int(self._nvml.nvmlDeviceGetComputeMode(self._handle(gpu_uuid)))

    def set(self, gpu_uuid: str, mode: int) -> None:
        handle = self._handle(gpu_uuid)
        if self._nvml.nvmlDeviceGetComputeMode(handle) != mode:
            self._nvml.nvmlDeviceSetComputeMode(handle, mode)
