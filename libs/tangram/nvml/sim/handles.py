"""Simulated handles are genuine pynvml ctypes pointer values that are never dereferenced.

Each encodes what it names (kind, GPU index, GPU-instance id, compute-instance id), so handles fit
in the ctypes arrays that pynvml's enumeration calls fill, and survive being passed around freely.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

DEVICE = 1
MIG_DEVICE = 2
GPU_INSTANCE = 3
COMPUTE_INSTANCE = 4
EVENT_SET = 5

_POINTER_TYPES: dict[int, Any] = {
    DEVICE: pynvml.c_nvmlDevice_t,
    MIG_DEVICE: pynvml.c_nvmlDevice_t,
    GPU_INSTANCE: pynvml.c_nvmlGpuInstance_t,
    COMPUTE_INSTANCE: pynvml.c_nvmlComputeInstance_t,
    EVENT_SET: pynvml.c_nvmlEventSet_t,
}


@dataclass(frozen=True, slots=True)
class Decoded:
    kind: int
    gpu: int
    gi: int
    ci: int


def make(kind: int, gpu: int, gi: int = 0, ci: int = 0) -> Any:
    code = (kind << 40) | (gpu << 24) | (gi << 12) | ci
    return ctypes.cast(ctypes.c_void_p(code), _POINTER_TYPES[kind])


def decode(handle: Any) -> Decoded:
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None
    if not value:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return Decoded(kind=value >> 40, gpu=(value >> 24) & 0xFFFF, gi=(value >> 12) & 0xFFF, ci=value & 0xFFF)


def out_value(ref: Any) -> Any:
    """The ctypes object behind a `byref(x)`, `pointer(x)` or `x` passed as an output argument."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref
