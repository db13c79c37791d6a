"""Compute-mode rules as NVML applies them, on the simulator's state.

NVML numbers the modes DEFAULT 0, EXCLUSIVE_THREAD 1, PROHIBITED 2, EXCLUSIVE_PROCESS 3 (nvidia-smi
numbers them differently: its `-c 1` is EXCLUSIVE_PROCESS). A value outside the enum is
INVALID_ARGUMENT. EXCLUSIVE_THREAD is still in the enum but its support was removed from the
driver, so setting it is NOT_SUPPORTED.

MIG: on a GPU with MIG enabled the driver refuses any mode but DEFAULT (nvidia-smi reports
"Setting compute mode to EXCLUSIVE_PROCESS is not supported on a MIG-enabled device ... Not
Supported"), and a MIG device handle cannot be given a mode of its own on the R5xx drivers the
simulator models (newer NVML headers announce per-MIG-device compute modes; nothing in Tangram
relies on them: MPS on a MIG device runs without touching the compute mode). A MIG device
handle reads its parent's mode.
"""

from __future__ import annotations

import pynvml

from tangram.nvml.sim.state import SimGpu

KNOWN_MODES = frozenset(
    {
        pynvml.NVML_COMPUTEMODE_DEFAULT,
        pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
        pynvml.NVML_COMPUTEMODE_PROHIBITED,
        pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    }
)


def set_compute_mode(gpu: SimGpu, mode: int, *, mig_device: bool) -> None:
    """Apply `mode` to `gpu` (through its own handle, or through one of its MIG devices)."""
    if mode not in KNOWN_MODES:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD or mig_device:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if gpu.mig_current == pynvml.NVML_DEVICE_MIG_ENABLE and mode != pynvml.NVML_COMPUTEMODE_DEFAULT:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    gpu.compute_mode = mode
