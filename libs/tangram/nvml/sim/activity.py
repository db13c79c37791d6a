"""How busy the simulated GPUs are, from the processes tests attach to them: what NVML's
utilization and power and DCGM's engine activity report.

A process keeps its GPU (or MIG device) `sm_percent` busy; a GPU is at most all busy. Power is
the simulator's model: every GPU draws a tenth of a 700 W limit idle (an H100 or H200 SXM's limit)
and the rest as its processes keep it busy; what the telemetry tests need is that busier GPUs
draw more.
"""

from __future__ import annotations

from collections.abc import Iterable

from tangram.nvml.sim.state import SimProcess

SIM_POWER_LIMIT_W = 700
IDLE_POWER_SHARE = 0.1


def busy_percent(processes: Iterable[SimProcess]) -> int:
    return min(100, sum(p.sm_percent for p in processes))


def power_mw(processes: Iterable[SimProcess]) -> int:
    busy = busy_percent(processes) / 100
    return int(SIM_POWER_LIMIT_W * 1000 * (IDLE_POWER_SHARE + (1 - IDLE_POWER_SHARE) * busy))
