"""NVML backends (real over pynvml, simulated from machine descriptions) and what is read through them."""

from __future__ import annotations

from pathlib import Path

from tangram.nvml.backend import NvmlBackend, NvmlUnavailable
from tangram.nvml.migminors import mig_capability_minors, parse_mig_minors, render_mig_minors
from tangram.nvml.real import RealNvml
from tangram.nvml.sim import SimNvml


def open_backend(
    *, sim: str | None = None, state_file: Path | None = None, real: bool = False
) -> NvmlBackend:
    """The simulated node `sim` (a shipped machine name or a YAML path), or the real driver.

    The backend comes back initialised (nvmlInit done); NvmlUnavailable when the driver is absent.
    """
    if (sim is None) == (not real):
        raise ValueError("choose exactly one of a simulated machine (sim=...) or the real driver (real=True)")
    backend: NvmlBackend = SimNvml.from_machine(sim, state_file=state_file) if sim is not None else RealNvml()
    backend.nvmlInit()
    return backend


__all__ = [
    "NvmlBackend",
    "NvmlUnavailable",
    "RealNvml",
    "SimNvml",
    "mig_capability_minors",
    "open_backend",
    "parse_mig_minors",
    "render_mig_minors",
]
