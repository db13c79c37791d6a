"""NVML error names and the one failure type the executor raises."""

from __future__ import annotations

import pynvml

_NAMES: dict[int, str] = {
    value: name
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


def nvml_error_name(error: pynvml.NVMLError | int) -> str:
    """ "NVML_ERROR_INSUFFICIENT_RESOURCES" for code 23 (no driver needed, unlike nvmlErrorString)."""
    code = error if isinstance(error, int) else error.value
    return _NAMES.get(code, f"NVML_ERROR_{code}")


class PartitionError(Exception):
    """A partition operation that did not happen; `nvml_error` is "" when NVML was not the cause."""

    def __init__(self, reason: str, *, nvml_error: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.nvml_error = nvml_error

    @classmethod
    def from_nvml(cls, doing: str, error: pynvml.NVMLError) -> PartitionError:
        name = nvml_error_name(error)
        return cls(f"{doing}: {_EXPLAIN.get(error.value, name)}", nvml_error=name)


_EXPLAIN: dict[int, str] = {
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "the slices are taken by another instance",
    pynvml.NVML_ERROR_IN_USE: "the instance is in use",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "NVML rejected the arguments (profile or placement)",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "not supported on this GPU or in its current MIG mode",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission (the partitioner needs CAP_SYS_ADMIN)",
    pynvml.NVML_ERROR_GPU_IS_LOST: "the GPU is lost (fell off the bus)",
    pynvml.NVML_ERROR_NOT_FOUND: "not found",
}
