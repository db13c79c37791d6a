"""The simulated NVML backend."""

from tangram.nvml.sim.backend import SimNvml, initial_state

__all__ = ["SimNvml", "initial_state"]
